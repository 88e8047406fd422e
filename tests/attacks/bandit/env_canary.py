# outcome: honest
# Credentials in the user's environment (issue 29): look for API keys and tokens in its own
# environment, /proc/self/environ, its parent's and every other environ it can read; fail
# with what it found, so that it lands in the record. Contained: the worker starts from an
# allow-list of variables, and the runner sees no other process.
import os


def _found():
    hits = {k: v for k, v in os.environ.items()
            if any(w in k for w in ("KEY", "TOKEN", "SECRET", "PASSWORD", "CANARY"))}
    paths = ["/proc/self/environ", f"/proc/{os.getppid()}/environ", "/proc/1/environ"]
    try:
        paths += [f"/proc/{n}/environ" for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        pass
    for path in paths:
        try:
            with open(path, "rb") as fh:
                data = fh.read().decode("utf-8", "replace")
        except OSError:
            continue
        for item in data.split("\0"):
            k = item.split("=", 1)[0]
            if any(w in k for w in ("KEY", "TOKEN", "SECRET", "PASSWORD", "CANARY")):
                hits[path + ":" + k] = item
    return hits


def policy(contexts, history, t, state):
    if t == 0:
        hits = _found()
        if hits:
            raise RuntimeError(f"found credentials: {hits}")
    return 0
