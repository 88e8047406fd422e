# expect: blocked
# Bypasses the Python guard through numpy's ctypes: only the seccomp filter stops the forks
# (each fork returns -1, and the program is failed as blocked, naming fork/clone).
import numpy as np

libc = np.ctypeslib.ctypes.CDLL(None)


def policy(contexts, history, t, state):
    for _ in range(200):
        if libc.fork() == 0:
            while True:
                pass
    return 0
