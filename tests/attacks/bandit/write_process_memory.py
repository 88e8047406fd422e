# Open every visible process's memory for writing with raw syscalls (ctypes reached through
# sys.modules, past the guard) to escape seccomp through a process that lacks it (under
# bubblewrap, pid 1 of the namespace). Every open must fail: then it plays arm 0.
import os
import sys


def policy(contexts, history, t, state):
    if t == 0 and "done" not in state:
        state["done"] = True
        ctypes = sys.modules.get("ctypes")
        libc = ctypes.CDLL(None, use_errno=True) if ctypes is not None else None
        for pid in os.listdir("/proc"):
            if libc is None or not pid.isdigit() or int(pid) == os.getpid():
                continue
            fd = libc.open(f"/proc/{pid}/mem".encode(), 2)
            if fd >= 0:
                raise RuntimeError(f"opened the memory of pid {pid} for writing")
    return 0
