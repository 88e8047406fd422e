# outcome: honest
# Reach the host's devices (issue 48): read a file planted in the host's shared memory
# (/dev/shm, DEV_SHM_FILE, filled in by the test), open terminals, the kernel log, memory and
# disks, and list /dev. Anything but the few devices a runner needs: play arm 1.
import os

NEEDED = {"null", "zero", "full", "random", "urandom"}
OTHERS = ("DEV_SHM_FILE", "/dev/tty", "/dev/ptmx", "/dev/kmsg", "/dev/mem", "/dev/kmem",
          "/dev/port", "/dev/vda", "/dev/sda", "/dev/nvme0n1", "/dev/console", "/dev/fuse",
          "/dev/net/tun", "/dev/loop0", "/dev/loop-control", "/dev/tty0", "/dev/pts/ptmx")


def _reached():
    got = []
    for path in OTHERS:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError:
            continue
        os.close(fd)
        got.append(path)
    try:
        got += [n for n in os.listdir("/dev") if n not in NEEDED]
    except OSError:
        pass
    for name in NEEDED:  # what it needs works
        fd = os.open("/dev/" + name, os.O_RDONLY)
        os.close(fd)
    return got


_SEEN = []


def policy(contexts, history, t, state):
    if not _SEEN:
        _SEEN.append(_reached())
    return 1 if _SEEN[0] else 0
