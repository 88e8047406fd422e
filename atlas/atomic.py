"""Atomic file writes that leave nothing behind when they fail.

A record file is written to a temporary name beside it and renamed into place (``os.replace``
is atomic on POSIX), so a reader sees the old file or the new one, never half of one. When the
write fails (a full disk: ``ENOSPC``, an interrupt), the temporary file is removed before the
error goes on, so a failed run leaves no ``.tmp`` file in its folder.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO

#: errors that mean "the disk is full" (no space, or over the user's quota)
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def disk_full_error(exc: BaseException | None) -> OSError | None:
    """The full-disk ``OSError`` behind ``exc`` (itself, or an error it was raised from), or
    None. torch, for one, wraps a failed write in errors of its own."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in DISK_FULL:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def write_atomic(path: str | os.PathLike[str], write: Callable[[IO[bytes]], object], *,
                 tmp: str | os.PathLike[str] | None = None, fsync: bool = False) -> Path:
    """Call ``write(fh)`` on a temporary file beside ``path``, then rename it to ``path``.

    ``tmp``: the temporary file's path (default ``.<name>.<pid>.tmp`` beside ``path``);
    ``fsync``: flush the data and the folder to disk (a checkpoint must survive a power cut).
    The temporary file is removed if anything fails, then the error is raised.
    """
    path = Path(path)
    tmp = Path(tmp) if tmp is not None else path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        full = disk_full_error(exc)
        if full is not None and full.filename is None:  # name the file it was for
            raise OSError(full.errno, full.strerror, str(path)) from exc
        raise
    if fsync:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return path


def write_text_atomic(path: str | os.PathLike[str], text: str, **kwargs: object) -> Path:
    """``write_atomic`` for UTF-8 text."""
    data = text.encode("utf-8")
    return write_atomic(path, lambda fh: fh.write(data), **kwargs)  # type: ignore[arg-type]
