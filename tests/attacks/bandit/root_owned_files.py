# outcome: honest
# Read what only root may read (issue 48): /etc/shadow and a root-owned 0600 token planted by
# the test in a folder the runner must see, the task's own package (ROOT_TOKEN_PATH; where the
# tests do not run as root, /etc/shadow again). Under bubblewrap as root the runner used to be
# kernel uid 0 under another name, and read both. Read: play arm 1. Contained: a runner is a
# fresh uid that owns nothing.
import _io

PATHS = ("/etc/shadow", "/etc/gshadow", "ROOT_TOKEN_PATH")


def _read():
    got = []
    for path in PATHS:
        try:
            with _io.FileIO(path, "r") as fh:
                got.append(fh.read(64))
        except OSError:
            pass
    return got


_SEEN = []


def policy(contexts, history, t, state):
    if not _SEEN:
        _SEEN.append(_read())
    return 1 if _SEEN[0] else 0
