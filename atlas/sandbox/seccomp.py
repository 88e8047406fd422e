"""Kernel-level system-call filter for the process that runs candidate code: an allow-list.

Why an allow-list: a list of what is denied is only as good as its author's imagination (a
call left off it, such as ``prlimit64`` on the zygote, reached every later candidate). The
filter allows exactly the calls the built-in tasks' runners make once the candidate runs
(``ALLOWED``, found with ``python -m atlas.sandbox audit``), plus what a task declares in
``Task.syscalls``; every call that can name another process is allowed only when it names
this process (``PID_CHECKED``: pid 0 or its own); ``prctl`` is allowed but for the options
that would hide the runner from its watchdog (``CMD_REFUSED``). Anything else fails with
``EPERM``.

Why a supervisor: a denied call goes to the scorer worker (``SECCOMP_RET_USER_NOTIF``),
which answers ``EPERM`` and records the call's name; the candidate then fails as
``blocked``, with the call named, even if it caught the error. Where the kernel has no
user notification (before 5.7) a denied call fails with ``EPERM`` unnamed. The same
machinery audits: in audit mode every call is reported and let through
(``SECCOMP_USER_NOTIF_FLAG_CONTINUE``).

The filter holds for every thread of the process (``TSYNC``: also the threads the task's
runner started before the candidate, such as XLA's pools) and cannot be lifted. Threads
(``clone`` with ``CLONE_THREAD``) are allowed; processes, ``exec`` and namespaces are not.
Extended-attribute writes fail with ``ENOTSUP`` (``shutil.copy2`` skips them),
``preadv2``/``pwritev2`` and ``clone3`` with ``ENOSYS`` (glibc falls back to
``preadv``/``pwritev``/``clone``). Only x86_64 and aarch64 are supported; elsewhere
``install_seccomp`` returns None and the other layers remain.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import platform
import select
import socket
import struct
import threading
from collections.abc import Iterable

from atlas.sandbox.syscalls import TABLES, syscall_name

_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K

_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_USER_NOTIF = 0x7FC00000
_CLONE_THREAD = 0x00010000

_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_SET_MODE_FILTER = 1
_FLAG_TSYNC, _FLAG_NEW_LISTENER, _FLAG_TSYNC_ESRCH = 1, 8, 16
_NOTIF_RECV, _NOTIF_SEND = 0xC0502100, 0xC0182101  # _IOWR('!', 0|1, ...)
_NOTIF_CONTINUE = 1
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}

#: what a candidate may call: reading, writing and mapping files and memory (Landlock and
#: the mounts decide which), threads and their synchronisation, clocks and sleeping,
#: signals to itself, and queries about itself. Found by auditing the runners of bandit,
#: PINN (JAX) and bin packing; see docs/sandbox.md. Not ``pipe``/``pipe2``: no runner needs
#: one once the candidate runs, and every pipe advances the machine's pseudo-inode counter,
#: which ``fstat`` reads (a relay to the next candidate without timing).
ALLOWED = frozenset({
    # files and descriptors
    "read", "write", "open", "openat", "close", "close_range", "stat", "fstat", "lstat",
    "newfstatat", "statx", "poll", "ppoll", "select", "pselect6", "lseek", "pread64",
    "pwrite64", "readv", "writev", "preadv", "pwritev", "access", "faccessat", "faccessat2",
    "dup", "dup2", "dup3", "fsync", "fdatasync",
    "truncate", "ftruncate", "getdents", "getdents64", "getcwd", "chdir", "fchdir", "rename",
    "renameat", "renameat2", "mkdir", "mkdirat", "rmdir", "creat", "link", "linkat",
    "unlink", "unlinkat", "symlink", "symlinkat", "readlink", "readlinkat", "umask",
    "statfs", "fstatfs", "ioctl", "sendfile", "copy_file_range", "splice", "tee",
    "fallocate", "eventfd", "eventfd2", "epoll_create", "epoll_create1", "epoll_ctl",
    "epoll_wait", "epoll_pwait", "epoll_pwait2", "sendmsg", "getxattr", "lgetxattr",
    "fgetxattr", "listxattr", "llistxattr", "flistxattr",
    # memory
    "mmap", "mprotect", "munmap", "mremap", "brk", "msync", "mlock", "munlock",
    "membarrier",
    # threads, signals to itself, time
    "futex", "futex_waitv", "set_robust_list", "set_tid_address", "rseq", "sched_yield",
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigtimedwait",
    "rt_sigsuspend", "sigaltstack", "restart_syscall", "nanosleep", "clock_nanosleep",
    "clock_gettime", "clock_getres", "gettimeofday", "time", "times", "getitimer",
    "setitimer", "alarm", "timer_create", "timer_settime", "timer_gettime", "timer_delete",
    "timer_getoverrun", "timerfd_create", "timerfd_settime", "timerfd_gettime",
    # about itself
    "getpid", "gettid", "getppid", "getpgrp", "getuid", "geteuid", "getgid", "getegid",
    "getresuid", "getresgid", "getgroups", "getrlimit", "setrlimit", "getrusage", "sysinfo",
    "uname", "getcpu", "getrandom", "capget", "arch_prctl",
    "exit", "exit_group", "wait4", "waitid",
})

#: calls that can name another process: allowed only with these (argument index, allowed
#: values) conditions, where ``SELF`` stands for the caller's pid and 0 for "the caller"
SELF = -1
PID_CHECKED: dict[str, tuple[tuple[int, tuple[int, ...]], ...]] = {
    "kill": ((0, (0, SELF)),),
    "tgkill": ((0, (SELF,)),),
    "rt_sigqueueinfo": ((0, (0, SELF)),),
    "rt_tgsigqueueinfo": ((0, (SELF,)),),
    "prlimit64": ((0, (0, SELF)),),
    "getpriority": ((0, (0,)), (1, (0, SELF))),  # PRIO_PROCESS only
    "setpriority": ((0, (0,)), (1, (0, SELF))),
    "sched_getaffinity": ((0, (0, SELF)),),
    "sched_getscheduler": ((0, (0, SELF)),),
    "sched_setscheduler": ((0, (0, SELF)),),
    "sched_getparam": ((0, (0, SELF)),),
    "sched_setparam": ((0, (0, SELF)),),
    "sched_getattr": ((0, (0, SELF)),),
    "sched_setattr": ((0, (0, SELF)),),
    "sched_rr_get_interval": ((0, (0, SELF)),),
    "ioprio_get": ((0, (1,)), (1, (0, SELF))),  # IOPRIO_WHO_PROCESS only
    "ioprio_set": ((0, (1,)), (1, (0, SELF))),
    "getpgid": ((0, (0, SELF)),),
    "getsid": ((0, (0, SELF)),),
}

#: the ``madvise`` advice a runner may give: about its own memory only. Not
#: ``MADV_COLD``/``MADV_PAGEOUT`` (they evict a shared file's pages from the page cache: the
#: next candidate's imports slow down, and the page-cache channel turns two-way),
#: ``MADV_MERGEABLE`` (merged pages are shared with other processes: a timing channel),
#: ``MADV_COLLAPSE`` (rewrites a shared file's cached pages) or the hardware-poison ones
MADV_ALLOWED = (0, 1, 2, 3, 4, 8, 9, 10, 11, 14, 15, 16, 17, 18, 19, 22, 23, 24, 102, 103)

#: calls allowed only for these commands (argument index, allowed values): ``fcntl`` on
#: descriptor flags, status flags, duplication and reading a pipe's size, never a file lock,
#: lease or notification (a lock on a shared host file is a channel to a concurrent
#: candidate, as ``flock`` is, which is left off the list) nor a bigger pipe (kernel memory
#: no count shows); ``madvise`` with ``MADV_ALLOWED``
CMD_CHECKED: dict[str, tuple[tuple[int, tuple[int, ...]], ...]] = {
    "fcntl": ((1, (0, 1, 2, 3, 4, 1030, 1032, 1034)),),
    "madvise": ((2, MADV_ALLOWED),),
}

#: ``prctl`` options a runner may not use (argument 0), every other allowed:
#: ``PR_SET_DUMPABLE`` (4). A runner that is not dumpable keeps its ``/proc/<pid>/root``
#: from a watchdog of the same uid (not root), which then cannot count its scratch tmpfs:
#: where no memory cgroup counts it, gigabytes there would pass unseen
CMD_REFUSED: dict[str, tuple[tuple[int, tuple[int, ...]], ...]] = {
    "prctl": ((0, (4,)),),
}

#: calls no task may add to its list: they start or reach other processes, leave the
#: namespaces and mounts, or create kernel objects that outlive the runner;
#: ``sched_setaffinity`` would move a runner off its worker's cores onto a concurrent
#: candidate's (``isolation.core_sets``), and the filter cannot read the mask it passes
NEVER = frozenset({
    "sched_setaffinity",
    "fork", "vfork", "execve", "execveat", "ptrace", "process_vm_readv",
    "process_vm_writev", "process_madvise", "process_mrelease", "pidfd_open",
    "pidfd_getfd", "pidfd_send_signal", "tkill", "kcmp", "unshare", "setns", "mount",
    "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr", "bpf", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "userfaultfd", "perf_event_open", "kexec_load", "kexec_file_load",
    "reboot", "init_module", "finit_module", "delete_module", "shmget", "shmat", "shmctl",
    "shmdt", "semget", "semop", "semctl", "semtimedop", "msgget", "msgsnd", "msgrcv",
    "msgctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify",
    "mq_getsetattr", "add_key", "request_key", "keyctl", "setuid", "setgid", "setreuid",
    "setregid", "setresuid", "setresgid", "setfsuid", "setfsgid", "setgroups", "capset",
    "setpgid", "setsid", "move_pages", "migrate_pages", "set_mempolicy", "mbind",
    "seccomp", "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self",
    "socket", "socketpair", "fanotify_init", "inotify_init", "inotify_init1",
    "inotify_add_watch", "flock", "quotactl", "quotactl_fd", "swapon", "swapoff", "acct",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "sethostname",
    "setdomainname", "ioperm", "iopl", "syslog", "vhangup", "name_to_handle_at",
    "open_by_handle_at", "lookup_dcookie", "get_robust_list", "mincore", "fadvise64",
    "readahead", "cachestat", "memfd_secret",
})

#: extended-attribute writes (a channel Landlock does not cover): ENOTSUP
_ENOTSUP = ("setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr",
            "fremovexattr", "setxattrat", "removexattrat")
#: preadv2/pwritev2 (``RWF_NOWAIT`` tells whether a page is cached) and clone3 (its flags
#: live in memory the filter cannot read): ENOSYS, and glibc falls back
_ENOSYS = ("preadv2", "pwritev2", "clone3")
#: refused without naming them: libraries try them and go on when they fail (glibc's name
#: service asks nscd over a unix socket, e.g. for ``pwd.getpwuid``)
_QUIET_EPERM = ("socket",)


def check_extra_syscalls(names: object, field: str = "Task.syscalls") -> tuple[str, ...]:
    """A task's additions to ``ALLOWED``, checked: known names, none from ``NEVER``. A
    ValueError naming ``field``, the call and the fix otherwise."""
    if names is None:
        return ()
    if isinstance(names, str) or not isinstance(names, Iterable):
        raise ValueError(f"{field}={names!r} is invalid: use a list of system-call names, "
                         f"e.g. ['memfd_create'] (python -m atlas.sandbox audit task=<name> "
                         f"prints what a runner calls)")
    known = set().union(*TABLES.values())
    out = []
    for name in names:
        if not isinstance(name, str) or name not in known:
            raise ValueError(f"{field}: {name!r} is not a system call of x86_64 or aarch64; "
                             f"use names as in 'man 2 syscalls' (e.g. 'memfd_create')")
        if name in NEVER or name in PID_CHECKED or name in CMD_CHECKED or name in CMD_REFUSED:
            raise ValueError(f"{field}: {name!r} can never be allowed (it reaches other "
                             f"processes, the mounts or kernel objects that outlive the "
                             f"runner); remove it from the task")
        out.append(name)
    return tuple(sorted(set(out)))


class _Asm:
    """A tiny BPF assembler with forward labels."""

    def __init__(self) -> None:
        self.ins: list[tuple[int, object, object, int]] = []
        self.labels: dict[str, int] = {}

    def op(self, code: int, k: int = 0, jt: object = 0, jf: object = 0) -> None:
        self.ins.append((code, jt, jf, k))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.ins)

    def _rel(self, at: int, target: object) -> int:
        if isinstance(target, int):
            return target
        off = self.labels[str(target)] - at - 1
        if not 0 <= off <= 255:
            raise ValueError(f"BPF jump out of range ({off})")
        return off

    def assemble(self) -> bytes:
        return b"".join(struct.pack("HBBI", code, self._rel(i, jt), self._rel(i, jf),
                                    k & 0xFFFFFFFF)
                        for i, (code, jt, jf, k) in enumerate(self.ins))


def build_filter(machine: str | None = None, *, self_pid: int | None = None,
                 extra: Iterable[str] = (), notify: bool = True,
                 audit: bool = False) -> bytes | None:
    """The BPF program (packed ``sock_filter`` array) for ``machine``; None if unsupported.

    ``self_pid`` is what ``SELF`` means (the caller's pid as it sees it); ``extra`` the
    task's additions; ``notify`` sends denied calls to the supervisor (else plain
    ``EPERM``); ``audit`` lets every call through to the supervisor, which records it.
    """
    machine = machine or platform.machine()
    table = TABLES.get(machine)
    if table is None or machine not in _AUDIT_ARCH:
        return None
    me = os.getpid() if self_pid is None else int(self_pid)
    eperm = _RET_ERRNO | errno.EPERM
    deny = _RET_USER_NOTIF if notify or audit else eperm
    a = _Asm()
    a.op(_LD_W_ABS, 4)  # seccomp_data.arch
    a.op(_JEQ_K, _AUDIT_ARCH[machine], 1, 0)
    a.op(_RET_K, eperm)  # a foreign ABI (i386 through int 0x80)
    a.op(_LD_W_ABS, 0)  # seccomp_data.nr
    if machine == "x86_64":
        a.op(_JGE_K, 0x40000000, 0, 1)
        a.op(_RET_K, eperm)  # the x32 ABI
    if audit:  # what hands the listener over, then everything to the supervisor
        for name in ("sendmsg", "close"):
            a.op(_JEQ_K, table[name], 0, 1)
            a.op(_RET_K, _RET_ALLOW)
        a.op(_RET_K, _RET_USER_NOTIF)
        return a.assemble()
    for names, ret in ((_ENOTSUP, _RET_ERRNO | errno.ENOTSUP),
                       (_ENOSYS, _RET_ERRNO | errno.ENOSYS), (_QUIET_EPERM, eperm)):
        for name in names:
            if name in table:
                a.op(_JEQ_K, table[name], 0, 1)
                a.op(_RET_K, ret)
    for nr in sorted({table[n] for n in (*ALLOWED, *extra) if n in table}):
        a.op(_JEQ_K, nr, 0, 1)
        a.op(_RET_K, _RET_ALLOW)
    # clone: a thread only
    a.op(_JEQ_K, table["clone"], 0, "after_clone")
    a.op(_LD_W_ABS, 16)  # args[0] low 32 bits (little endian): the flags
    a.op(_JSET_K, _CLONE_THREAD, 0, 1)
    a.op(_RET_K, _RET_ALLOW)
    a.op(_RET_K, deny)
    a.label("after_clone")
    for i, (name, conds) in enumerate(sorted({**PID_CHECKED, **CMD_CHECKED}.items())):
        if name not in table:
            continue
        a.op(_JEQ_K, table[name], 0, f"next{i}")
        for j, (arg, values) in enumerate(conds):
            a.op(_LD_W_ABS, 16 + 8 * arg)  # the argument's low 32 bits (pids are ints)
            ok = f"ok{i}_{j}"
            for v in values:
                a.op(_JEQ_K, me if v == SELF else v, ok, 0)
            a.op(_RET_K, deny)
            a.label(ok)
        a.op(_RET_K, _RET_ALLOW)
        a.label(f"next{i}")
    for i, (name, conds) in enumerate(sorted(CMD_REFUSED.items())):
        if name not in table:
            continue
        a.op(_JEQ_K, table[name], 0, f"unrefused{i}")
        for arg, values in conds:
            a.op(_LD_W_ABS, 16 + 8 * arg)
            for v in values:
                a.op(_JEQ_K, v, 0, 1)
                a.op(_RET_K, deny)
        a.op(_RET_K, _RET_ALLOW)
        a.label(f"unrefused{i}")
    a.op(_RET_K, deny)
    return a.assemble()


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _seccomp(program: bytes, flags: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    buf = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p).value)
    nr = TABLES[platform.machine()]["seccomp"]
    return int(libc.syscall(nr, _SECCOMP_SET_MODE_FILTER, flags, ctypes.byref(fprog)))


def no_new_privs() -> None:
    """Set no_new_privs (irreversible): what Landlock and an unprivileged filter need."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")


def install_seccomp(supervisor: socket.socket | None = None, *, extra: Iterable[str] = (),
                    audit: bool = False) -> str | None:
    """Install the filter on the calling process (irreversible). With ``supervisor`` (a unix
    socket to the scorer worker), denied calls are named there: the listener is sent over it
    and the socket closed. Returns ``"notify"`` (denied calls named), ``"errno"`` (denied
    calls fail unnamed) or None (unsupported machine)."""
    machine = platform.machine()
    if machine not in _AUDIT_ARCH:
        return None
    no_new_privs()
    mode = "errno"
    if supervisor is not None:
        program = build_filter(machine, extra=extra, notify=True, audit=audit)
        assert program is not None
        listener = _seccomp(program, _FLAG_TSYNC | _FLAG_TSYNC_ESRCH | _FLAG_NEW_LISTENER)
        if listener >= 0:
            socket.send_fds(supervisor, [b"L"], [listener])
            os.close(listener)
            mode = "notify"
        supervisor.close()
    if mode == "errno":
        if audit:
            raise OSError(errno.ENOSYS, "auditing needs seccomp user notification "
                                        "(Linux >= 5.7)")
        program = build_filter(machine, extra=extra, notify=False)
        assert program is not None
        # TSYNC: every thread of the process at once, also those the task's runner started
        # before the candidate (XLA's pools), which candidate code could otherwise hijack
        if _seccomp(program, _FLAG_TSYNC) != 0:
            raise OSError(ctypes.get_errno(), "seccomp(SECCOMP_SET_MODE_FILTER, TSYNC) failed")
    return mode


class Supervisor:
    """The scorer worker's side of one runner's filter: receives the listener, answers each
    notified call (``EPERM``, or let through when auditing) and records its name."""

    def __init__(self, sock: socket.socket, audit: bool = False) -> None:
        self.sock, self.audit = sock, audit
        self.machine = platform.machine()
        self.calls: dict[str, int] = {}
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="atlas-seccomp")
        self.thread.start()

    def _run(self) -> None:
        try:
            _, fds, _, _ = socket.recv_fds(self.sock, 16, 1)
        except OSError:
            fds = []
        finally:
            self.sock.close()
        if not fds:
            return
        listener = fds[0]
        poller = select.poll()
        poller.register(listener, select.POLLIN)
        try:
            while not self._stop.is_set():
                events = poller.poll(100)
                if not events:
                    continue
                if events[0][1] & (select.POLLHUP | select.POLLERR) \
                        and not events[0][1] & select.POLLIN:
                    return  # the runner is gone
                buf = bytearray(80)
                try:
                    fcntl.ioctl(listener, _NOTIF_RECV, buf, True)
                except OSError:
                    continue  # the caller died meanwhile
                nid, _pid, _flags, nr = struct.unpack_from("=QIIi", buf)
                name = syscall_name(self.machine, nr)
                self.calls[name] = self.calls.get(name, 0) + 1
                if self.audit:
                    resp = struct.pack("=QqiI", nid, 0, 0, _NOTIF_CONTINUE)
                else:
                    resp = struct.pack("=QqiI", nid, 0, -errno.EPERM, 0)
                try:
                    fcntl.ioctl(listener, _NOTIF_SEND, bytearray(resp), True)
                except OSError:
                    pass
        finally:
            os.close(listener)

    def finish(self, timeout: float = 1.0) -> dict[str, int]:
        """Stop (the runner has been killed) and return the calls seen, with their counts."""
        self._stop.set()
        self.thread.join(timeout)
        return dict(self.calls)
