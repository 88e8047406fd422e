"""Kernel-level write confinement for the process that runs candidate code (Landlock).

Why: the guard confines writes to the candidate's directory only at the Python level (the
unpatched ``_io.FileIO`` walks past it), and neither remaining layer stops a runner from
writing elsewhere: in the rlimits mode it is ``nobody`` and can write every world-writable
host directory (/tmp, /var/tmp, /dev/shm, ...); under bubblewrap it has the scorer's uid and
can write the scorer's own temporary directory, which the per-candidate sweep keeps. Either
way a file left there reaches the next candidate. Landlock (Linux >= 5.13, unprivileged)
lets the runner give up, irreversibly, every right to create, write, truncate, rename or
remove anything outside its working directory (and ``/dev/null``); reads are untouched. From
ABI 6 on it also scopes abstract unix sockets and signals to the runner itself.

Where the kernel lacks Landlock ``restrict_writes`` returns False and the other layers remain.
"""

from __future__ import annotations

import ctypes
import os
import struct

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # same on x86_64 and aarch64
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

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


def restrict_writes(workdir: str) -> bool:
    """Allow writes only below ``workdir`` (and to ``/dev/null``) from now on, for this process
    and any it could start. Needs no_new_privs (``install_seccomp`` sets it). False if the
    kernel has no Landlock; an OSError if it has one and the restriction fails."""
    abi = abi_version()
    if abi < 1:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    handled = _WRITE_FILE | _DIR_WRITES | (_REFER if abi >= 2 else 0) | (
        _TRUNCATE if abi >= 3 else 0)
    file_rights = handled & (_WRITE_FILE | _TRUNCATE)
    attr = ctypes.create_string_buffer(struct.pack("=QQQ", handled, 0,
                                                   _SCOPES if abi >= 6 else 0))
    size = 24 if abi >= 6 else 8
    ruleset = libc.syscall(_CREATE_RULESET, attr, ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        for path, rights in ((workdir, handled), (os.devnull, file_rights)):
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = ctypes.create_string_buffer(struct.pack("=Qi", rights, fd))
                if libc.syscall(_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(
                        _RULE_PATH_BENEATH), rule, ctypes.c_uint32(0)) != 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule({path}) failed")
            finally:
                os.close(fd)
        if libc.syscall(_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)
    return True
