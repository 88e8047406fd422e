# outcome: blocked(memfd_create)
# Memory the watchdog's RSS does not show (issue 29): 3 GB written into memfd files, held
# only as descriptors (never mapped), under a 2 GB limit; then play arm 0. Contained:
# memfd_create is not on the filter's allow-list (blocked), SysV shared memory neither.
import sys


def policy(contexts, history, t, state):
    if t == 0:
        libc = sys.modules["ctypes"].CDLL(None, use_errno=True)
        chunk = b"x" * (1 << 20)
        for _ in range(3):
            fd = libc.syscall(319, b"hog", 0)  # memfd_create (x86_64)
            if fd < 0:
                break
            state.setdefault("fds", []).append(fd)
            for _ in range(1024):
                if libc.write(fd, chunk, len(chunk)) < 0:
                    break
    return 0
