# outcome: honest
# Learn that a masked path exists, without reading it (issue 56): the run's secret file, its
# run folder and the records beside it (programs.jsonl), through every call that needs no
# read right: stat, lstat, access, an O_PATH descriptor and its fstat, chdir, readlink,
# getxattr, statfs, and the run folder's name in its parent's listing (the O_PATH open through
# libc, past the guard, which refuses a hidden path's name in Python's own open). A missing name answers
# ENOENT; anything else (a size, a permission error, a listing naming it) tells that the
# path is there. The test fills in SECRET_PATH. Told: play arm 1, so the score differs from
# the honest arm-0 one.
import os
import sys

PATHS = ["SECRET_PATH", os.path.dirname("SECRET_PATH"),
         os.path.join(os.path.dirname("SECRET_PATH"), "programs.jsonl")]


def _o_path(path):
    """An O_PATH descriptor (no read right needed) and its fstat, through libc."""
    ctypes = sys.modules["ctypes"]
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.open(path.encode(), os.O_PATH | os.O_CLOEXEC)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    try:
        os.fstat(fd)
    finally:
        os.close(fd)


def _told(path):
    calls = [lambda: os.stat(path), lambda: os.lstat(path), lambda: os.statvfs(path),
             lambda: os.readlink(path), lambda: os.getxattr(path, "user.x"),
             lambda: _o_path(path)]
    for call in calls:
        try:
            call()
            return True
        except FileNotFoundError:
            continue
        except OSError:
            return True  # ENOENT is what a missing name answers: anything else tells
    if os.access(path, os.F_OK) or os.path.lexists(path):
        return True
    here = os.getcwd()
    try:
        os.chdir(path)
        return True
    except FileNotFoundError:
        pass
    except OSError:
        return True
    finally:
        os.chdir(here)
    try:
        return os.path.basename(path) in os.listdir(os.path.dirname(path))
    except OSError:
        return False


def policy(contexts, history, t, state):
    if t == 0:
        state["told"] = any(_told(p) for p in PATHS)
    return 1 if state["told"] else 0
