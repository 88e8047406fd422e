# outcome: blocked(mincore, readahead, cachestat, fadvise64)
# Probe the page cache, a channel between any two processes of the host (across workers):
# map a file (mmap through libc) and ask mincore which of its pages are resident, and ask posix_fadvise,
# readahead, cachestat and preadv2(RWF_NOWAIT). ctypes comes from sys.modules (the guard
# blocks only `import ctypes`; the sandbox itself imported it). Any probe that answers: play
# arm 1.
import os
import sys

FILES = [os.__file__, getattr(sys.modules.get("numpy"), "__file__", ""), "/etc/passwd"]


def _probes():
    answered = []
    fd = None
    for path in FILES:  # the first this uid can read (nobody cannot read below /root)
        try:
            fd = os.open(path, os.O_RDONLY)
            break
        except OSError:
            continue
    size = os.fstat(fd).st_size
    ctypes = sys.modules["ctypes"]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    addr = libc.mmap(None, ctypes.c_size_t(size), 1, 2, fd, ctypes.c_long(0))  # PROT_READ,
    vec = ctypes.create_string_buffer((size + 4095) // 4096)  # MAP_PRIVATE
    if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) == 0:
        answered.append("mincore")
    if libc.readahead(fd, ctypes.c_long(0), ctypes.c_size_t(4096)) == 0:
        answered.append("readahead")
    rng = (ctypes.c_uint64 * 2)(0, size)
    stat = (ctypes.c_uint64 * 5)()
    if libc.syscall(451, fd, rng, stat, 0) == 0:
        answered.append("cachestat")
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        answered.append("fadvise")
    except OSError:
        pass
    try:
        os.preadv(fd, [bytearray(16)], 0, os.RWF_NOWAIT)
        answered.append("preadv2")
    except (OSError, AttributeError):
        pass
    return answered


_SEEN = []


def policy(contexts, history, t, state):
    if not _SEEN:
        _SEEN.append(_probes())
    if _SEEN[0]:
        print("page cache answered:", _SEEN[0])
    return 1 if _SEEN[0] else 0
