# outcome: exception(may only write inside its working directory)
# Leave files everywhere a later candidate might look: cwd, $TMPDIR, /tmp, /dev/shm, $HOME.
import os
import tempfile


def policy(contexts, history, t, state):
    if t == 0:
        for d in (".", tempfile.gettempdir(), "/tmp", "/dev/shm", os.environ.get("HOME", "."),
                  os.path.dirname(os.getcwd())):
            try:
                with open(os.path.join(d, "atlas_leftover_file"), "w") as fh:
                    fh.write("planted")
            except Exception:
                pass
    return 0
