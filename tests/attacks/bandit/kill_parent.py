# Signal the scorer, the zygote and everything else with raw syscalls (ctypes reached through
# sys.modules, past the guard): kill, tkill, tgkill. seccomp must refuse them all.
import sys


def policy(contexts, history, t, state):
    if t == 0 and "done" not in state:
        state["done"] = True
        ctypes = sys.modules.get("ctypes")
        if ctypes is not None:
            libc = ctypes.CDLL(None)
            for pid in range(1, 200):
                libc.kill(pid, 9)
                libc.syscall(200, pid, 9)  # tkill (x86_64)
                libc.syscall(234, pid, pid, 9)  # tgkill (x86_64)
    return 0
