"""In-process guard: the Python-level layer of defence in depth around candidate code.

Why a second layer when seccomp and bubblewrap exist: it turns a forbidden action into a
clear, classified failure ("os.system is blocked in the sandbox") instead of an obscure
``EPERM``, it confines file writes to the candidate's directory even in the fallback mode
where no mount namespace exists, and it refuses writes to the worker's protocol fds so a
program cannot forge a result. Any blocked call is recorded in ``violations``; the worker
then classifies the candidate as ``exception`` even if the program caught the error.

It is not a security boundary on its own (Python code can always dig out the originals);
the kernel layers are.
"""

from __future__ import annotations

import builtins
import io
import os
import posix
import sys
from collections.abc import Callable, Iterable
from typing import Any


class SandboxViolation(PermissionError):
    """Raised when candidate code calls something the sandbox forbids."""


#: modules candidate code may not import (process, network, native-code and self access)
DENIED_IMPORTS = frozenset({
    "subprocess", "multiprocessing", "socket", "_socket", "ssl", "ctypes", "_ctypes", "cffi",
    "pty", "_posixsubprocess", "atlas", "resource", "signal", "fcntl", "mmap", "urllib",
    "http", "asyncio", "concurrent", "importlib", "posix", "requests", "ftplib", "smtplib",
    "telnetlib", "xmlrpc", "socketserver", "_thread", "threading", "faulthandler", "pickle",
})

_PROCESS_CALLS = (
    "system", "popen", "fork", "forkpty", "vfork", "execv", "execve", "execl", "execle",
    "execlp", "execlpe", "execvp", "execvpe", "spawnl", "spawnle", "spawnlp", "spawnlpe",
    "spawnv", "spawnve", "spawnvp", "spawnvpe", "posix_spawn", "posix_spawnp", "kill",
    "killpg", "_exit", "abort", "setsid", "setpgid", "setuid", "setgid", "chroot",
    "register_at_fork", "pidfd_open",
)
_FD_CALLS = ("write", "writev", "pwrite", "pwritev", "sendfile", "close", "closerange", "dup",
             "dup2", "ftruncate", "fchmod", "fchown", "lseek", "read", "readv", "set_blocking",
             "set_inheritable", "splice", "copy_file_range")
_PATH_WRITE_CALLS = ("mkdir", "remove", "unlink", "rmdir", "rename", "renames", "replace",
                     "symlink", "link", "chmod", "chown", "lchown", "truncate", "utime",
                     "mkfifo", "mknod", "removedirs", "makedirs", "chdir")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class Guard:
    """Patches dangerous callables for as long as it is installed.

    ``workdir`` is the only tree candidate code may write to; ``protected_fds`` are the
    descriptors (protocol pipes) it may not touch at all.
    """

    def __init__(self, workdir: str, protected_fds: Iterable[int] = (),
                 hidden: Iterable[str] = ()) -> None:
        self.workdir = os.path.realpath(workdir)
        self.protected_fds = frozenset(int(fd) for fd in protected_fds)
        #: paths a program may not even read (the run folder and its secret): bubblewrap
        #: masks them, Landlock denies reads of them, a root worker's runner owns nothing; this
        #: turns a plain open() into a clear failure
        self.hidden = tuple(os.path.realpath(p) for p in hidden)
        self.violations: list[str] = []
        self._saved: list[tuple[Any, str, Any]] = []

    # -- recording --------------------------------------------------------------------------
    def _violate(self, what: str, why: str) -> SandboxViolation:
        msg = f"{what} is blocked in the sandbox: {why}"
        self.violations.append(msg)
        return SandboxViolation(msg)

    def _patch(self, owner: Any, name: str, replacement: Any) -> None:
        if not hasattr(owner, name):
            return
        self._saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, replacement)

    # -- checks -----------------------------------------------------------------------------
    def _path_ok(self, path: Any) -> bool:
        if isinstance(path, int):
            return path not in self.protected_fds
        try:
            full = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return True  # let the real call raise its own error
        return full == "/dev/null" or full == self.workdir or full.startswith(self.workdir + "/")

    def _check_hidden(self, call: str, path: Any) -> None:
        if not self.hidden or isinstance(path, int):
            return
        try:
            full = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return
        if any(full == h or full.startswith(h + "/") for h in self.hidden):
            raise self._violate(f"open({path!r})", "the run folder is not readable in the "
                                                   "sandbox")

    def _check_path(self, call: str, path: Any) -> None:
        if not self._path_ok(path):
            raise self._violate(f"{call}({path!r})",
                                f"a program may only write inside its working directory "
                                f"{self.workdir} (use relative paths)")

    def _check_fd(self, call: str, fd: Any) -> None:
        if isinstance(fd, int) and fd in self.protected_fds:
            raise self._violate(f"{call}(fd={fd})", "this descriptor belongs to the sandbox")

    # -- wrappers ---------------------------------------------------------------------------
    def _blocker(self, name: str, why: str) -> Callable[..., Any]:
        def blocked(*args: Any, **kwargs: Any) -> Any:
            raise self._violate(name, why)
        blocked.__name__ = name.rsplit(".", 1)[-1]
        return blocked

    def _fd_wrapper(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            for arg in args[:2]:
                self._check_fd(f"os.{name}", arg)
            return real(*args, **kwargs)
        return wrapped

    def _path_wrapper(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            paths = [a for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))]
            if name in ("chdir",):
                paths = []  # reading elsewhere is fine; writes are checked by absolute path
            for p in paths:
                self._check_path(f"os.{name}", p)
            return real(*args, **kwargs)
        return wrapped

    def _open_wrapper(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def guarded_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            if isinstance(file, int):
                self._check_fd("open", file)
            else:
                self._check_hidden("open", file)
                if any(c in str(mode) for c in "wax+"):
                    self._check_path(f"open(mode={mode!r})", file)
            return real(file, mode, *args, **kwargs)
        return guarded_open

    def _os_open_wrapper(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def guarded_os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> Any:
            self._check_hidden("os.open", path)
            if flags & _WRITE_FLAGS:
                self._check_path("os.open", path)
            return real(path, flags, *args, **kwargs)
        return guarded_os_open

    def _import_wrapper(self, real: Callable[..., Any]) -> Callable[..., Any]:
        guard = self

        def guarded_import(name: str, globals: Any = None, locals: Any = None,
                           fromlist: Any = (), level: int = 0) -> Any:
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if caller == "candidate" and name.split(".")[0] in DENIED_IMPORTS and level == 0:
                raise guard._violate(f"import {name}",
                                     "candidate programs may not use process, network, "
                                     "native-code or sandbox modules")
            return real(name, globals, locals, fromlist, level)
        return guarded_import

    def _guarded_fileio(self, real: type) -> type:
        guard = self

        class GuardedFileIO(real):  # type: ignore[misc, valid-type]
            def __init__(self, file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> None:
                if isinstance(file, int):
                    guard._check_fd("FileIO", file)
                else:
                    guard._check_hidden("FileIO", file)
                    if any(c in str(mode) for c in "wax+"):
                        guard._check_path(f"FileIO(mode={mode!r})", file)
                super().__init__(file, mode, *args, **kwargs)

        GuardedFileIO.__name__ = GuardedFileIO.__qualname__ = "FileIO"
        return GuardedFileIO

    # -- install / uninstall ----------------------------------------------------------------
    def install(self) -> None:
        """Patch ``os``/``posix``/``builtins``/``io`` and, when loaded, socket/subprocess."""
        procs = "a program may not start, signal or end processes (return a value instead)"
        for mod in (os, posix):
            for name in _PROCESS_CALLS:
                self._patch(mod, name, self._blocker(f"os.{name}", procs))
            for name in _FD_CALLS:
                if hasattr(mod, name):
                    self._patch(mod, name, self._fd_wrapper(name, getattr(mod, name)))
            for name in _PATH_WRITE_CALLS:
                if hasattr(mod, name):
                    self._patch(mod, name, self._path_wrapper(name, getattr(mod, name)))
            self._patch(mod, "open", self._os_open_wrapper(mod.open))
        guarded = self._open_wrapper(builtins.open)
        for owner in (builtins, io):
            self._patch(owner, "open", guarded)
        self._patch(io, "FileIO", self._guarded_fileio(io.FileIO))
        self._patch(builtins, "__import__", self._import_wrapper(builtins.__import__))
        net = "a program may not use the network"
        for modname in ("socket", "_socket"):
            mod = sys.modules.get(modname)
            if mod is not None:
                for name in ("socket", "create_connection", "socketpair", "fromfd",
                             "create_server", "getaddrinfo", "SocketType"):
                    self._patch(mod, name, self._blocker(f"socket.{name}", net))
        sp = sys.modules.get("subprocess")
        if sp is not None:
            for name in ("Popen", "run", "call", "check_call", "check_output", "getoutput",
                         "getstatusoutput"):
                self._patch(sp, name, self._blocker(f"subprocess.{name}", procs))

    def uninstall(self) -> None:
        """Restore every patched attribute (used by in-process workers between candidates)."""
        while self._saved:
            owner, name, original = self._saved.pop()
            setattr(owner, name, original)

    def __enter__(self) -> Guard:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()
