"""Kernel-level write confinement for the process that runs candidate code (Landlock).

Why: the guard confines writes to the candidate's directory only at the Python level (the
unpatched ``_io.FileIO`` walks past it), and neither remaining layer stops a runner from
writing elsewhere: in the rlimits mode it can write every world-writable host directory
(/tmp, /var/tmp, /dev/shm, ...); under bubblewrap without root it has the scorer's uid and
can write the scorer's own temporary directory, which the per-candidate sweep keeps. Either
way a file left there reaches the next candidate. Landlock (Linux >= 5.13, unprivileged)
lets the runner give up, irreversibly, every right to create, write, truncate, rename or
remove anything outside its working directory (and ``/dev/null``), and to read anything but
the code its task needs (the view bubblewrap binds, ``view.py``) and a few devices, outside
the output trees that hold run folders and secrets. From ABI 6 on it also scopes abstract unix sockets and signals
to the runner itself.

Where the kernel lacks Landlock ``restrict_writes`` returns False and the other layers remain.
"""

from __future__ import annotations

import ctypes
import os
import stat
import struct

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # same on x86_64 and aarch64
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

_READ_FILE, _READ_DIR = 1 << 2, 1 << 3
_WRITE_FILE = 1 << 1
_DIR_WRITES = sum(1 << b for b in range(4, 13))  # remove dir/file, make char..sym
_REFER = 1 << 13  # ABI 2
_TRUNCATE = 1 << 14  # ABI 3
_SCOPES = (1 << 0) | (1 << 1)  # ABI 6: abstract unix sockets, signals


def abi_version() -> int:
    """The kernel's Landlock ABI (0: none)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    version = libc.syscall(_CREATE_RULESET, None, ctypes.c_size_t(0),
                           ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(int(version), 0)


def _readable_around(hidden: list[str], roots: list[str] | tuple[str, ...] = ("/",)
                     ) -> list[str]:
    """Paths whose subtrees hold everything below ``roots`` but ``hidden``: a root with
    nothing hidden in it whole, else every entry of each directory on the way from the root
    to a hidden path, except the entries on that way. (Landlock only allows; this is how it
    denies.) The directories on the way can no longer be listed."""
    hidden = [os.path.realpath(h) for h in hidden]  # even where this process cannot look
    out: list[str] = []
    for root in roots:
        inside = [h for h in hidden if h == root or h.startswith(root.rstrip("/") + "/")]
        if not inside:
            out.append(root)
            continue
        on_way: set[str] = set()
        for h in inside:
            p = h
            while True:
                on_way.add(p)
                if p == root or p == "/":
                    break
                p = os.path.dirname(p)
        for d in sorted(on_way - set(inside)):
            try:
                names = os.listdir(d)
            except OSError:  # unreadable to this process anyway
                continue
            out += [p for p in (os.path.join(d, n) for n in names) if p not in on_way]
    return out


def restrict_writes(workdir: str, hidden: list[str] | tuple[str, ...] = (),
                    readable: list[str] | tuple[str, ...] | None = None,
                    listable: list[str] | tuple[str, ...] = ()) -> bool:
    """Allow writes only below ``workdir`` (and to ``/dev/null``) from now on, for this process
    and any it could start. With ``readable`` (the code view, the devices), reads too only
    below those and ``workdir``, and listing the ``listable`` directories (site-packages: the
    import system lists them; their entries stay unreadable but for ``readable``): the
    rlimits mode then sees what bubblewrap binds, and no run folder elsewhere. ``hidden``
    paths (output trees, secret files) are carved out of what is readable, whatever the
    uid (the rlimits mode without root runs the candidate as the secret's owner). Needs no_new_privs (``install_seccomp`` sets it). False if the
    kernel has no Landlock; an OSError if it has one and the restriction fails."""
    abi = abi_version()
    if abi < 1:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    reads = _READ_FILE | _READ_DIR if hidden or readable is not None else 0
    handled = reads | _WRITE_FILE | _DIR_WRITES | (_REFER if abi >= 2 else 0) | (
        _TRUNCATE if abi >= 3 else 0)
    file_rights = handled & (_WRITE_FILE | _TRUNCATE | _READ_FILE)
    rules = [(workdir, handled), (os.devnull, file_rights)]
    if reads:
        roots = ("/",) if readable is None else tuple(readable)
        rules += [(p, reads) for p in _readable_around(list(hidden), roots)]
        rules += [(p, _READ_DIR) for p in listable]
    attr = ctypes.create_string_buffer(struct.pack("=QQQ", handled, 0,
                                                   _SCOPES if abi >= 6 else 0))
    size = 24 if abi >= 6 else 8
    ruleset = libc.syscall(_CREATE_RULESET, attr, ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        for path, rights in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:  # vanished, or a dangling link: nothing to allow
                continue
            try:
                if not stat.S_ISDIR(os.fstat(fd).st_mode):
                    rights &= _WRITE_FILE | _TRUNCATE | _READ_FILE
                rule = ctypes.create_string_buffer(struct.pack("=Qi", rights, fd))
                if rights and libc.syscall(_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(
                        _RULE_PATH_BENEATH), rule, ctypes.c_uint32(0)) != 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule({path}) failed")
            finally:
                os.close(fd)
        if libc.syscall(_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)
    return True
