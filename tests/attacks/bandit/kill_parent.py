# outcome: blocked(kill, tkill, tgkill)
# Signal the scorer, the zygote and everything else with raw syscalls (ctypes reached through
# sys.modules, past the guard): kill, tkill, tgkill, aimed at the scorer's and the zygote's
# host pids (TARGET_PIDS, filled in by the test) and at every small pid. seccomp must refuse
# them all; the filter naming them shows the calls were made.
import sys

_NAMED = [int(p) for p in "TARGET_PIDS".strip("[]").split(",") if p.strip()]
TARGETS = sorted(set(_NAMED) | set(range(2, 200)))


def policy(contexts, history, t, state):
    if t == 0 and "done" not in state:
        state["done"] = True
        libc = sys.modules["ctypes"].CDLL(None)
        for pid in TARGETS:
            libc.kill(pid, 9)
            libc.syscall(200, pid, 9)  # tkill (x86_64)
            libc.syscall(234, pid, pid, 9)  # tgkill (x86_64)
    return 0
