"""A runner's own process tree and filesystem view: namespaces and mounts.

Why: a candidate must name no other process (so it can neither signal nor re-limit the
zygote, the scorer or another runner), leave nothing on the host (its scratch is a tmpfs of
its own, everything else read-only), and read no counter another candidate moved. Each
runner is pid 1 of a pid namespace of its own with a mount namespace (``own_process_tree``),
and builds its view there (``prepare_runner``): the host read-only, a fresh tmpfs as its
working directory, and a /proc that holds its own process's files and the machine's
description only. A worker of the rlimits mode running as root first takes a mount
namespace of its own (``host_view``), so that its runners, which run as a fresh uid, can
reach code below a private folder (a pyenv or conda under a 0700 home).
"""

from __future__ import annotations

import ctypes
import functools
import os
import stat
import struct

from atlas.sandbox.view import outermost, symlink_chain

_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
_MOUNT_SETATTR, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY = 442, 0x8000, 0x1
_MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV, _MOUNT_ATTR_NOEXEC = 0x2, 0x4, 0x8
_OPEN_TREE, _MOVE_MOUNT = 428, 429  # the same on x86_64 and aarch64
_OPEN_TREE_CLONE, _MOVE_MOUNT_F_EMPTY_PATH, _AT_FDCWD = 1, 0x4, -100
_PR_SET_DUMPABLE = 4
_PR_SET_NO_NEW_PRIVS = 38
#: host root (the rlimits mode in a container) gives each runner a uid of its own from
#: ``RUNNER_UID_BASE`` on: no host file belongs to it, no other process shares it, and
#: ``RLIMIT_NPROC`` counts that one candidate's threads
RUNNER_UID_BASE, RUNNER_UIDS = 0x70000000, 1 << 24
#: the source name of a runner's scratch tmpfs, how the watchdog finds it to count its bytes
SCRATCH_SOURCE = "atlas-scratch"
#: files (and directories) a runner's scratch may hold: each costs the kernel an inode and
#: a directory entry that no byte count shows
SCRATCH_INODES = 16384
#: what one scratch inode costs the kernel, at most (inode, directory entry, directory
#: index; ``shmem_inode_cache`` and ``dentry`` slabs), counted by the watchdog
INODE_BYTES = 2048
#: what a runner's /proc holds of its own process (nothing that lists other entries: a
#: lookup in /proc/<pid>/fd or /task makes an inode, and inode numbers come from a counter
#: every process on the machine shares)
PROC_FILES = ("status", "stat", "statm", "maps", "mountinfo", "cmdline", "environ", "limits")
PROC_MACHINE = ("cpuinfo", "meminfo")


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _prctl(option: int, arg: int) -> None:
    if _libc().prctl(option, arg, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


@functools.lru_cache(maxsize=1)
def host_root() -> bool:
    """Whether this process is root of the host (not root of a user namespace): then it may
    switch each runner to a uid of its own."""
    if os.getuid() != 0:
        return False
    try:
        with open("/proc/self/uid_map") as fh:
            return fh.read().split()[:3] == ["0", "0", "4294967295"]
    except OSError:
        return False


def _map_own_ids(uid: int, gid: int) -> None:
    """Map the caller's ids into the user namespace it just took. The worker is not dumpable
    (``harden_worker``), which would leave /proc/self's files to another owner; the runner
    is dumpable while it writes its maps, with no other process in its pid namespace."""
    _prctl(_PR_SET_DUMPABLE, 1)
    try:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                           ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as fh:
                fh.write(text)
    finally:
        _prctl(_PR_SET_DUMPABLE, 0)


def own_process_tree(report_fd: int) -> set[str]:
    """Give the calling process (a runner just forked by the zygote, single-threaded) a pid
    namespace of its own and a mount namespace, and continue as pid 1 of that namespace.

    Why: a candidate must not be able to name any other process, so it can neither signal
    nor re-limit, re-nice, re-pin or re-schedule the zygote, the scorer or another runner
    (every later runner would inherit the change), nor learn from its pid how many threads
    the runner before it started. The process that unshared forks the runner, writes the
    runner's pid (as the zygote sees it) to ``report_fd`` and exits, so the runner is
    reparented to the zygote (a subreaper) and everything in the namespace dies with it.
    Root (or a bubblewrap worker holding CAP_SYS_ADMIN) takes the namespaces directly;
    anyone else takes a user namespace too. Only the runner returns, with what it got
    (``"pid"``, ``"mount"``, ``"user"``); an empty set where no namespace can be had (then
    it is the runner itself, with its own pid written).
    """
    libc = _libc()
    uid, gid = os.getuid(), os.getgid()
    got: set[str] = set()
    if libc.unshare(_CLONE_NEWNS | _CLONE_NEWPID) == 0:
        got = {"pid", "mount"}
    elif libc.unshare(_CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWUSER) == 0:
        _map_own_ids(uid, gid)
        got = {"pid", "mount", "user"}
    if "pid" in got:
        pid = os.fork()
        if pid:  # the intermediate: report, and leave the runner to the zygote
            os.write(report_fd, str(pid).encode())
            os._exit(0)
    else:
        os.write(report_fd, str(os.getpid()).encode())
    os.close(report_fd)
    return got


def _check(rc: int, what: str) -> int:
    if rc < 0:
        raise OSError(ctypes.get_errno(), what)
    return rc


def _mount(source: str | None, target: str, fstype: str | None, flags: int,
           options: str | None = None) -> None:
    _check(_libc().mount(source.encode() if source else None, target.encode(),
                         fstype.encode() if fstype else None, flags,
                         options.encode() if options else None), f"mount on {target}")


def _set_attr(path: str, attrs: int) -> bool:
    """mount_setattr(``attrs``) on the mounts at and below ``path``; False if unsupported."""
    attr = ctypes.create_string_buffer(struct.pack("=QQQQ", attrs, 0, 0, 0))
    return _libc().syscall(_MOUNT_SETATTR, _AT_FDCWD, path.encode(), _AT_RECURSIVE, attr,
                           ctypes.c_size_t(32)) == 0


def _clone_tree(path: str, recursive: bool = False) -> int:
    """A detached bind mount of ``path`` (a descriptor for ``_attach``); ``recursive``: with
    the mounts below it (which a user namespace's locked mounts require)."""
    flags = _OPEN_TREE_CLONE | os.O_CLOEXEC | (_AT_RECURSIVE if recursive else 0)
    return int(_check(_libc().syscall(_OPEN_TREE, _AT_FDCWD, path.encode(), flags),
                      f"open_tree {path}"))


def _attach(fd: int, target: str) -> None:
    try:
        _check(_libc().syscall(_MOVE_MOUNT, fd, b"", _AT_FDCWD, target.encode(),
                               _MOVE_MOUNT_F_EMPTY_PATH), f"move_mount onto {target}")
    finally:
        os.close(fd)


def _placeholder(path: str, directory: bool) -> None:
    """An empty directory or file at ``path`` (parents made 0755), for a bind to cover."""
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    if directory:
        os.makedirs(path, mode=0o755, exist_ok=True)
    elif not os.path.exists(path):
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o444))


def _private_proc() -> bool:
    """Cover /proc (the runner's own, just mounted) with a tmpfs that holds only
    ``PROC_FILES`` of its process and ``PROC_MACHINE``, bound from it: no directory of
    /proc's own is left where a lookup could make an inode. False where the kernel lacks
    the calls (before 5.2; then the full /proc stays)."""
    try:
        clones = {f"/proc/1/{n}": _clone_tree(f"/proc/self/{n}") for n in PROC_FILES}
        clones.update({f"/proc/{n}": _clone_tree(f"/proc/{n}") for n in PROC_MACHINE})
    except OSError:
        return False
    try:
        _mount("atlas-proc", "/proc", "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
               "size=64k,nr_inodes=64,mode=0755")
        os.mkdir("/proc/1", 0o755)
        os.symlink("1", "/proc/self")
        for target in list(clones):
            _placeholder(target, directory=False)
            _attach(clones.pop(target), target)
    finally:
        for fd in clones.values():
            os.close(fd)
    _set_attr("/proc", _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV
              | _MOUNT_ATTR_NOEXEC)
    return True


def _related(path: str, keep: list[str]) -> bool:
    """Whether ``path`` is, holds, or lies below one of ``keep``."""
    return any(k == path or k.startswith(path.rstrip("/") + "/") or path.startswith(k + "/")
               for k in keep)


def hide_paths(hidden: list[str], keep: list[str]) -> list[str]:
    """Make each of ``hidden`` (run folders, secrets' folders) absent from this mount
    namespace: its parent folder is covered by an empty tmpfs where only the entries on the
    way to ``keep`` (what the runner may read or reach: its code view, its working directory,
    the devices) are bound back, or made again as links. A lookup of a hidden path then fails
    with ENOENT, exactly as for a name that never existed, and the parent's link count and
    listing no longer count it. Returns the folders covered.

    Why: Landlock refuses to open a hidden path but not to ``stat`` it; its size, times and
    existence (the size of ``.task_secret``, of ``programs.jsonl``) were readable."""
    by_parent: dict[str, set[str]] = {}
    for path in hidden:
        if os.path.lexists(path) and os.path.dirname(path) != path:
            by_parent.setdefault(os.path.dirname(path), set()).add(path)
    covered: list[str] = []
    for parent in sorted(by_parent, key=lambda p: (p.count("/"), p)):
        try:
            names = sorted(os.listdir(parent))
        except OSError:  # a folder the runner could not pass either
            continue
        links: dict[str, str] = {}
        clones: dict[str, tuple[int, bool]] = {}
        try:
            for name in names:
                path = os.path.join(parent, name)
                if path in by_parent[parent] or not _related(path, keep):
                    continue
                if os.path.islink(path):
                    links[path] = os.readlink(path)
                else:
                    clones[path] = (_clone_tree(path, recursive=True), os.path.isdir(path))
            _mount("atlas-hide", parent, "tmpfs", _MS_NOSUID | _MS_NODEV,
                   "size=64k,nr_inodes=1024,mode=0755")
            for path in list(clones):
                fd, is_dir = clones.pop(path)
                _placeholder(path, is_dir)
                _attach(fd, path)
            for path, text in links.items():
                os.symlink(text, path)
        finally:
            for fd, _ in clones.values():
                os.close(fd)
        covered.append(parent)
    return covered


def prepare_runner(workdir: str, size_mb: int, got: set[str], hide: list[str] | None = None,
                   keep: list[str] | None = None) -> set[str]:
    """In the runner, right after ``own_process_tree``: its own session, a read-only view of
    the host, a fresh tmpfs on ``workdir`` and a /proc of its own; then (not root on the
    host) a user namespace of its own and no capability. Returns ``got`` plus what was set
    up (``"readonly"``, ``"scratch"``, ``"proc"``, ``"nproc"``, ``"hidden"``). ``hide``: paths
    made absent (``hide_paths``), keeping the way to ``keep`` and ``workdir``.

    Why each: the session makes ``kill(0)`` reach nobody else; read-only mounts stop file
    access times on the host (a channel) from moving; the tmpfs vanishes whole with the
    runner, with anything written there and its modes, timestamps and extended attributes,
    and holds at most ``SCRATCH_INODES`` inodes (kernel memory no byte count shows); /proc
    shows this runner alone and no directory where a lookup would advance the machine's
    inode counter (a channel to the next candidate); the per-runner user namespace makes
    ``RLIMIT_NPROC`` count this candidate's threads only.
    """
    libc = _libc()
    got = set(got)
    root = host_root()  # before /proc changes: it reads /proc/self/uid_map
    os.setsid()
    if not root and "mount" in got and "pid" in got:
        # the parent's watchdog, of the same uid, reads this runner's scratch through
        # /proc/<pid>/root, which a process that is not dumpable keeps to root: dumpable
        # before the scratch exists, so that no poll finds a scratch it may not count (the
        # watchdog kills a runner whose scratch it cannot read; a candidate cannot undo this:
        # seccomp refuses PR_SET_DUMPABLE). The runner holds no secret (the scorer, which
        # does, stays not dumpable), and no other candidate can name it (it is alone in its
        # pid namespace)
        _prctl(_PR_SET_DUMPABLE, 1)
    if "mount" in got:
        _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
        if hide is not None:  # before the scratch exists: no clone of it is counted twice
            hide_paths(list(hide), [*(keep or ()), workdir])
            got.add("hidden")
        if _set_attr("/", _MOUNT_ATTR_RDONLY):
            got.add("readonly")
        _mount(SCRATCH_SOURCE, workdir, "tmpfs", _MS_NOSUID | _MS_NODEV,
               f"size={int(size_mb)}m,nr_inodes={SCRATCH_INODES},mode=0700")
        got.add("scratch")
        if "pid" in got and libc.mount(b"proc", b"/proc", b"proc",
                                       _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None) == 0:
            got.add("proc")
            if _private_proc():
                got.add("proc-files")
    if os.getuid() == 0 and "user" not in got and not root:
        # root of a bubblewrap worker without root of the host: the late user namespace
        # (after the mounts, which it would have locked) separates this runner's task count
        # from every other's. Its ids stay unmapped: the runner is the overflow uid there.
        if libc.unshare(_CLONE_NEWUSER) == 0:
            got.add("user")
    if "user" in got:
        got.add("nproc")
    if not root:  # host root gives up its capabilities with its uid (``drop_root``)
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, self
        data = (ctypes.c_uint32 * 6)()
        if libc.capset(header, data) != 0:
            raise OSError(ctypes.get_errno(), "dropping capabilities failed")
    return got


#: what a root scorer keeps once its zygote is forked: signals to runners of another uid,
#: and removing what a runner of another uid left in its swept directory
SCORER_CAPS = (1, 3, 5)  # CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_KILL


def keep_scorer_caps() -> None:
    """As root, give up every capability but ``SCORER_CAPS`` (the scorer, which compiles
    code derived from candidates, needs no other; its zygote, forked before, keeps what
    making a runner's namespaces and switching its uid need). no_new_privs first: without
    it, anything the scorer ran as uid 0 would get the whole bounding set back."""
    if os.getuid() != 0:
        return
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, self
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable (x2: caps 0-31, 32-63)
    if _libc().capget(header, data) != 0:
        raise OSError(ctypes.get_errno(), "reading the scorer's capabilities failed")
    keep = data[1] & sum(1 << c for c in SCORER_CAPS)  # of those it has (bubblewrap: fewer)
    data = (ctypes.c_uint32 * 6)(keep, keep, 0, 0, 0, 0)
    if _libc().capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "dropping the scorer's capabilities failed")


def _blocked_at(path: str) -> str | None:
    """The highest folder above ``path`` (its last part not followed) that a uid owning
    nothing cannot pass (no search bit for others), or None."""
    here = ""
    for part in os.path.realpath(os.path.dirname(os.path.abspath(path))).split("/")[1:]:
        here += "/" + part
        try:
            mode = os.stat(here).st_mode
        except OSError:
            return None
        if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
            return here
    return None


def host_view(readable: list[str], masks: list[str]) -> list[str]:
    """In a worker of the rlimits mode running as root, before it forks its zygote: take a
    mount namespace of its own (inherited by the zygote and its runners) where each folder
    that a runner's fresh uid could not pass (a 0700 home holding the interpreter) is an
    empty tmpfs with only the ``readable`` paths below it bound back (and the links that
    lead to them made again), and each of ``masks`` (the interpreter's own site-packages,
    not on the import path) is empty. Returns the folders opened up."""
    binds: dict[str, set[str]] = {}
    links: dict[str, dict[str, str]] = {}
    for path in readable:
        if not os.path.exists(path):
            continue
        chain, end = symlink_chain(path)
        for link, text in chain:
            top = _blocked_at(link)
            if top is not None:
                links.setdefault(top, {})[link] = text
        top = _blocked_at(end)
        if top is not None:
            binds.setdefault(top, set()).add(end)
    masks = [m for m in masks if os.path.isdir(m)]
    covered = sorted({*binds, *links})
    if not covered and not masks:
        return []
    libc = _libc()
    _check(libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    for top in covered:  # every clone first: a tmpfs on one top hides what another needs
        binds[top] = {p: (_clone_tree(p), os.path.isdir(p))
                      for p in outermost(binds.get(top, ()))}
    for top in covered:
        _mount("atlas-view", top, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=64k,mode=0755")
        for path, (fd, is_dir) in binds[top].items():
            _placeholder(path, is_dir)
            _attach(fd, path)
        for link, text in sorted(links.get(top, {}).items()):
            if not os.path.lexists(link):
                os.makedirs(os.path.dirname(link), mode=0o755, exist_ok=True)
                os.symlink(text, link)
        _set_attr(top, _MOUNT_ATTR_RDONLY)
    for mask in masks:
        _mount("atlas-mask", mask, "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_RDONLY,
               "size=4k,mode=0755")
    return sorted(covered)
