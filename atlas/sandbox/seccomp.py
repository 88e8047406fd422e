"""Kernel-level syscall filter for the process that runs candidate code.

Why: the in-process guard (``guard.py``) can be bypassed by a determined program (ctypes
reached through numpy, ``posix`` internals...). A seccomp filter cannot: once installed it
holds for every thread of the process (``TSYNC``) and everything it starts. It makes process creation (fork bombs,
``os.system``, ``subprocess``), ``exec``, sockets (network), ``ptrace`` / cross-process memory
access, signals to any thread or process (``kill``, ``tkill``, ``tgkill``,
``rt_sigqueueinfo``, ``rt_tgsigqueueinfo``, ``pidfd_send_signal``, ``pidfd_open``), ``bpf``,
``io_uring_setup``, ``mount``, namespace tricks (``unshare``, ``setns``) and kernel objects
that outlive the process (SysV IPC, POSIX message queues, keyrings: a channel to the next
candidate), changes of modes, owners and timestamps, page-cache probes (``mincore``,
``fadvise64``, ``readahead``, ``cachestat``) and unmounting fail with ``EPERM`` (extended
attribute writes with ``ENOTSUP``, ``preadv2``/``pwritev2`` with ``ENOSYS``), while threads
(``clone`` with
``CLONE_THREAD``, which numpy, BLAS and XLA need) keep working. This also contains fork bombs
when we run as root, where ``RLIMIT_NPROC`` does not bind.

Only x86_64 and aarch64 are supported; elsewhere ``install_seccomp`` returns False and the
other layers (guard, rlimits, bwrap, watchdog) remain.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K

_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_CLONE_THREAD = 0x00010000

_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_NR = {"x86_64": 317, "aarch64": 277}  # seccomp(2)
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1

#: extended-attribute writes (a channel Landlock does not cover): ENOTSUP, so shutil.copy2
#: skips them as on a filesystem without xattrs
_XATTR_WRITES = {"x86_64": (188, 189, 190, 197, 198, 199, 463, 466),
                 "aarch64": (5, 6, 7, 14, 15, 16, 463, 466)}
#: preadv2/pwritev2: ``RWF_NOWAIT`` tells whether a page is cached; ENOSYS makes glibc fall
#: back to preadv/pwritev
_NOSYS = {"x86_64": (327, 328), "aarch64": (286, 287)}

# (audit arch, denied syscalls, clone, clone3); absent syscalls (fork on aarch64) are omitted
_ARCHES: dict[str, tuple[int, dict[str, int], int, int]] = {
    "x86_64": (0xC000003E, {
        "fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "socket": 41,
        "socketpair": 53, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
        "kill": 62, "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129,
        "rt_tgsigqueueinfo": 297, "pidfd_send_signal": 424, "unshare": 272, "setns": 308, "io_uring_setup": 425,
        "bpf": 321, "mount": 165, "pidfd_open": 434,
        # kernel objects that outlive the process (a channel to the next candidate): SysV
        # IPC, POSIX message queues, keyrings
        "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67, "semget": 64, "semop": 65,
        "semctl": 66, "semtimedop": 220, "msgget": 68, "msgsnd": 69, "msgrcv": 70,
        "msgctl": 71, "mq_open": 240, "mq_unlink": 241, "mq_timedsend": 242,
        "mq_timedreceive": 243, "mq_notify": 244, "mq_getsetattr": 245, "add_key": 248,
        "request_key": 249, "keyctl": 250,
        # metadata that outlives the scratch (modes, owners, timestamps) and page-cache
        # probes (which file pages another process touched): channels too
        "chmod": 90, "fchmod": 91, "fchmodat": 268, "fchmodat2": 452, "chown": 92,
        "fchown": 93, "lchown": 94, "fchownat": 260, "utime": 132, "utimes": 235,
        "futimesat": 261, "utimensat": 280, "mincore": 27, "fadvise64": 221,
        "readahead": 187, "cachestat": 451,
        # unmounting the private scratch (or any other mount) and the new mount API
        "umount2": 166, "pivot_root": 155, "chroot": 161, "open_tree": 428,
        "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442,
    }, 56, 435),
    "aarch64": (0xC00000B7, {
        "execve": 221, "execveat": 281, "socket": 198, "socketpair": 199, "ptrace": 117,
        "process_vm_readv": 270, "process_vm_writev": 271, "kill": 129, "tkill": 130,
        "tgkill": 131, "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240,
        "pidfd_send_signal": 424,
        "unshare": 97, "setns": 268, "io_uring_setup": 425, "bpf": 280, "mount": 40,
        "pidfd_open": 434,
        "mq_open": 180, "mq_unlink": 181, "mq_timedsend": 182, "mq_timedreceive": 183,
        "mq_notify": 184, "mq_getsetattr": 185, "msgget": 186, "msgctl": 187, "msgrcv": 188,
        "msgsnd": 189, "semget": 190, "semctl": 191, "semtimedop": 192, "semop": 193,
        "shmget": 194, "shmctl": 195, "shmat": 196, "shmdt": 197, "add_key": 217,
        "request_key": 218, "keyctl": 219,
        "fchmod": 52, "fchmodat": 53, "fchmodat2": 452, "fchownat": 54, "fchown": 55,
        "utimensat": 88, "mincore": 232, "fadvise64": 223, "readahead": 213,
        "cachestat": 451, "umount2": 39, "pivot_root": 41, "chroot": 51, "open_tree": 428,
        "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442,
    }, 220, 435),
}


def _ins(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k & 0xFFFFFFFF)


def build_filter(machine: str | None = None) -> bytes | None:
    """The BPF program (packed ``sock_filter`` array) for ``machine``; None if unsupported."""
    machine = machine or platform.machine()
    arch = _ARCHES.get(machine)
    if arch is None:
        return None
    audit_arch, denied, clone_nr, clone3_nr = arch
    deny = _RET_ERRNO | errno.EPERM
    prog = [
        _ins(_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        _ins(_JEQ_K, 1, 0, audit_arch),
        _ins(_RET_K, 0, 0, deny),  # foreign ABI (i386 via int 0x80): deny everything
        _ins(_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
    ]
    if audit_arch == 0xC000003E:
        prog += [_ins(_JGE_K, 0, 1, 0x40000000), _ins(_RET_K, 0, 0, deny)]  # x32 ABI
    # clone3 hides its flags in memory: ENOSYS makes glibc fall back to clone(2)
    prog += [_ins(_JEQ_K, 0, 1, clone3_nr), _ins(_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS)]
    for nr in denied.values():
        prog += [_ins(_JEQ_K, 0, 1, nr), _ins(_RET_K, 0, 0, deny)]
    for nr in _XATTR_WRITES[machine]:
        prog += [_ins(_JEQ_K, 0, 1, nr), _ins(_RET_K, 0, 0, _RET_ERRNO | errno.ENOTSUP)]
    for nr in _NOSYS[machine]:
        prog += [_ins(_JEQ_K, 0, 1, nr), _ins(_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS)]
    prog += [
        _ins(_JEQ_K, 0, 4, clone_nr),
        _ins(_LD_W_ABS, 0, 0, 16),  # args[0] (clone flags), low 32 bits (little endian)
        _ins(_JSET_K, 0, 1, _CLONE_THREAD),
        _ins(_RET_K, 0, 0, _RET_ALLOW),  # a thread
        _ins(_RET_K, 0, 0, deny),  # a process
        _ins(_RET_K, 0, 0, _RET_ALLOW),
    ]
    return b"".join(prog)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_seccomp() -> bool:
    """Install the filter on the calling process (irreversible); False if unsupported."""
    program = build_filter()
    if program is None:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p).value)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    # TSYNC: every thread of the process at once, also those the task's runner started before
    # the candidate (XLA's pools), which candidate code could otherwise hijack through ctypes
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(_SECCOMP_NR[platform.machine()], _SECCOMP_SET_MODE_FILTER,
                    _SECCOMP_FILTER_FLAG_TSYNC, ctypes.byref(fprog)) != 0:
        raise OSError(ctypes.get_errno(), "seccomp(SECCOMP_SET_MODE_FILTER, TSYNC) failed")
    return True
