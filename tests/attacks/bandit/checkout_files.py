# outcome: honest
# Read the checkout around the code (issue 48): an `.env` with an API key in the clone's root
# (planted by the test), the clone's `.git`, its `conf/` and `README.md`, and list the root,
# past the guard with the unpatched `_io.FileIO`. Any of it read: play arm 1. Contained: a
# runner reads only its task's package, atlas's runner modules, the interpreter and the
# libraries the task imports.
import _io
import os

ROOT = "REPO_DIR"
FILES = (".env", ".git", ".git/config", ".git/HEAD", "conf/train.yaml", "README.md",
         "pyproject.toml")


def _read():
    got = []
    for name in FILES:
        path = os.path.join(ROOT, name)
        try:
            with _io.FileIO(path, "r") as fh:
                got.append(fh.read(64))
        except OSError:
            pass
    try:
        got += [n for n in os.listdir(ROOT) if n != "atlas"]
    except OSError:
        pass
    return got


_SEEN = []


def policy(contexts, history, t, state):
    if not _SEEN:
        _SEEN.append(_read())
    return 1 if _SEEN[0] else 0
