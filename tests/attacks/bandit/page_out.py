# outcome: blocked(madvise, process_madvise)
# Evict a shared library's pages from the page cache (issue 48): map numpy's largest library
# and its Python library read-only and ask madvise for MADV_PAGEOUT and MADV_COLD, and
# process_madvise for the same, through libc taken from sys.modules. The next candidate's
# imports would then read from disk (75x slower), and the page-cache channel would turn
# two-way. Contained: the filter allows no such advice (and a runner owns no file).
import os
import sys

MADV_COLD, MADV_PAGEOUT = 20, 21


def _largest(root):
    best = (0, "")
    for d, _, names in os.walk(root):
        for n in names:
            if ".so" in n:
                p = os.path.join(d, n)
                best = max(best, (os.path.getsize(p), p))
    return best[1]


def policy(contexts, history, t, state):
    if t == 0 and "done" not in state:
        state["done"] = True
        ctypes = sys.modules["ctypes"]
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        np_dir = os.path.dirname(sys.modules["numpy"].__file__)
        for path in (_largest(np_dir), sys.modules["numpy"].__file__):
            fd = os.open(path, os.O_RDONLY)
            size = os.fstat(fd).st_size
            addr = libc.mmap(None, ctypes.c_size_t(size), 1, 2, fd, ctypes.c_long(0))
            for advice in (MADV_PAGEOUT, MADV_COLD):
                libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(size), advice)
            iov = (ctypes.c_uint64 * 2)(addr, size)
            libc.syscall(440, -1, iov, 1, MADV_PAGEOUT, 0)  # process_madvise (x86_64)
            os.close(fd)
    return 0
