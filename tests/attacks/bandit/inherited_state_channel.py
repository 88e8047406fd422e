# outcome: blocked(prlimit64, setpriority, sched_setscheduler, sched_setaffinity, ioprio_set)
# A channel through the process state every later runner inherits (issue 29): find a marker
# in its own limits, nice value, scheduling or affinity (left by the previous run of this
# program) and play arm 1; else plant the marker on every process it can name (its parent,
# the zygote, the scorer: prlimit64, setpriority, sched_setscheduler, sched_setaffinity,
# ioprio_set through ctypes taken from sys.modules) and play arm 0. Contained: the runner can
# name no other process, the filter refuses other pids, and it starts from the zygote's state.
import sys

TARGETS = [int(p) for p in "TARGET_PIDS".strip("[]").split(",") if p.strip()]

MARK = 777  # RLIMIT_MSGQUEUE soft limit as the marker
RLIMIT_MSGQUEUE, PRIO_PROCESS, SCHED_IDLE = 12, 0, 5


def _libc():
    ctypes = sys.modules["ctypes"]
    return ctypes, ctypes.CDLL(None, use_errno=True)


def _marked(ctypes, libc):
    lim = (ctypes.c_uint64 * 2)()
    libc.prlimit(0, RLIMIT_MSGQUEUE, None, lim)
    nice = libc.getpriority(PRIO_PROCESS, 0)
    return lim[0] == MARK or nice == 7 or libc.sched_getscheduler(0) == SCHED_IDLE


def _plant(ctypes, libc):
    new = (ctypes.c_uint64 * 2)(MARK, 1 << 30)
    param = ctypes.c_int(0)
    mask = ctypes.c_uint64(1)
    for pid in {libc.getppid(), *TARGETS, *range(1, 400)} - {libc.getpid()}:
        libc.prlimit(pid, RLIMIT_MSGQUEUE, new, None)
        libc.setpriority(PRIO_PROCESS, pid, 7)
        libc.sched_setscheduler(pid, SCHED_IDLE, ctypes.byref(param))
        libc.sched_setaffinity(pid, 8, ctypes.byref(mask))
        libc.syscall(251, 1, pid, (3 << 13) | 7)  # ioprio_set(WHO_PROCESS, pid, IDLE) x86_64


def policy(contexts, history, t, state):
    if "arm" not in state:
        state["arm"] = 0
        ctypes, libc = _libc()
        if _marked(ctypes, libc):
            state["arm"] = 1
        else:
            _plant(ctypes, libc)
    return state["arm"]
