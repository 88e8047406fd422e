"""Per-runner memory cgroups: the kernel counts every byte a runner holds.

Why: the watchdog sees resident memory and the scratch's bytes, polled every 0.1 s; the
kernel holds more for a process than that (directory entries and inodes, pipe buffers,
page tables), and a burst shorter than a poll passes. A memory cgroup counts all of it
(cgroup v2 ``memory.max``; cgroup v1 ``memory.limit_in_bytes`` counts kernel memory too
on the kernels that still offer it) and the kernel stops the runner at the limit. One is
made per runner below a directory of the ``Sandbox`` (``make_base``) where this process may
make one: as root, or in a delegated cgroup v2 subtree. Elsewhere ``make_base`` says why
not, and the sandbox bounds what the kernel holds for a runner instead (the scratch's
inode limit, a low ``RLIMIT_NOFILE``, no pipes, page tables and inodes in the watchdog's
count).
"""

from __future__ import annotations

import errno
import os
import secrets
import time
from dataclasses import dataclass

#: per version: the limit, the swap limit, the peak and the file with the ``oom_kill`` count
_FILES = {2: ("memory.max", "memory.swap.max", "memory.peak", "memory.events"),
          1: ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes",
              "memory.max_usage_in_bytes", "memory.oom_control")}


@dataclass(frozen=True)
class Base:
    """A directory this process made for runner cgroups: ``path``, cgroup ``version``."""

    path: str
    version: int

    def describe(self) -> str:
        limit = _FILES[self.version][0]
        return f"cgroup v{self.version} {limit} per runner (kernel memory counted)"


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, file system type, super options) of every mount this process sees."""
    out = []
    try:
        lines = _read("/proc/self/mountinfo").splitlines()
    except OSError:
        return out
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3:
            out.append((fields[4], tail[0], tail[2]))
    return out


def _own_dirs() -> list[tuple[int, str]]:
    """(version, directory) of this process's memory cgroup: v2 first, where its
    hierarchy has the memory controller, then v1's memory hierarchy."""
    try:
        lines = _read("/proc/self/cgroup").splitlines()
    except OSError:
        return []
    mounts = _mounts()
    out = []
    for line in lines:
        hid, controllers, path = line.split(":", 2)
        if hid == "0" and controllers == "":
            for point, fstype, _ in mounts:
                if fstype == "cgroup2":
                    out.insert(0, (2, os.path.join(point, path.lstrip("/"))))
                    break
        elif "memory" in controllers.split(","):
            for point, fstype, opts in mounts:
                if fstype == "cgroup" and "memory" in opts.split(","):
                    out.append((1, os.path.join(point, path.lstrip("/"))))
                    break
    return [(v, d) for v, d in out if os.path.isdir(d)]


def _enable_memory(directory: str) -> None:
    """Give ``directory``'s children the memory controller (cgroup v2)."""
    if "memory" not in _read(os.path.join(directory, "cgroup.subtree_control")).split():
        _write(os.path.join(directory, "cgroup.subtree_control"), "+memory")


def _delegate_v2(own: str) -> None:
    """Let ``own`` (this process's cgroup v2) have children with the memory controller. A
    cgroup with processes cannot (the kernel's rule: processes live in leaves), so where
    this process is alone in it (a delegated scope of its own, ``systemd-run --scope -p
    Delegate=yes``), it moves itself into a leaf ``atlas-main`` first."""
    if "memory" not in _read(os.path.join(own, "cgroup.controllers")).split():
        raise OSError(errno.ENOTSUP, "the memory controller is not available in " + own)
    try:
        _enable_memory(own)
        return
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise
    procs = set(_read(os.path.join(own, "cgroup.procs")).split())
    if procs != {str(os.getpid())}:
        raise OSError(errno.EBUSY, f"{own} holds other processes than this one; run atlas in a "
                      f"cgroup of its own (systemd-run --user --scope -p Delegate=yes ...)")
    leaf = os.path.join(own, "atlas-main")
    os.makedirs(leaf, exist_ok=True)
    _write(os.path.join(leaf, "cgroup.procs"), "0")
    _enable_memory(own)


def _sweep_stale(parent: str) -> None:
    """Remove the runner cgroups of ``atlas-<pid>-*`` directories whose process is gone."""
    for name in _listdir(parent):
        if not name.startswith("atlas-") or name == "atlas-main":
            continue
        try:
            pid = int(name.split("-")[1])
        except (IndexError, ValueError):
            continue
        if pid != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            remove_tree(os.path.join(parent, name))


def make_base(slots: int) -> tuple[Base | None, str]:
    """A directory for this ``Sandbox``'s runner cgroups, with one subdirectory per worker
    slot (``s0``, ``s1``...), or (None, why not)."""
    reasons = []
    for version, own in _own_dirs():
        try:
            if version == 2:
                _delegate_v2(own)
            _sweep_stale(own)
            path = os.path.join(own, f"atlas-{os.getpid()}-{secrets.token_hex(4)}")
            os.mkdir(path)
            try:
                if version == 2:
                    _enable_memory(path)
                for i in range(slots):
                    os.mkdir(os.path.join(path, f"s{i}"))
                    if version == 2:
                        _enable_memory(os.path.join(path, f"s{i}"))
            except OSError:
                remove_tree(path)
                raise
            return Base(path, version), ""
        except OSError as exc:
            reasons.append(f"cgroup v{version} at {own}: {exc.strerror or exc}")
    return None, "; ".join(reasons) or "no memory cgroup hierarchy is mounted"


def new_runner_cgroup(slot_dir: str, version: int, memory_mb: int) -> str:
    """A fresh cgroup below ``slot_dir`` limited to ``memory_mb`` (swap included)."""
    path = os.path.join(slot_dir, "r-" + secrets.token_hex(6))
    os.mkdir(path)
    limit, swap, _, _ = _FILES[version]
    size = str(int(memory_mb) << 20)
    _write(os.path.join(path, limit), size)
    try:  # no swap past the limit (absent where swap is not accounted)
        _write(os.path.join(path, swap), "0" if version == 2 else size)
    except OSError:
        pass
    # not memory.oom.group: the zygote sits in the cgroup for a moment after the fork, and the
    # kernel's own choice, the largest process, is the runner
    return path


def join(path: str) -> None:
    """Move the calling process into cgroup ``path`` (its future children follow)."""
    _write(os.path.join(path, "cgroup.procs"), "0")


def oom_kills(path: str, version: int) -> int:
    """How many processes the kernel killed in cgroup ``path`` for its memory limit."""
    try:
        text = _read(os.path.join(path, _FILES[version][3]))
    except OSError:
        return 0
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return 0


def peak_mb(path: str, version: int) -> float | None:
    """The most memory cgroup ``path`` held, in MB (None where the kernel does not say)."""
    try:
        return int(_read(os.path.join(path, _FILES[version][2]))) / (1 << 20)
    except (OSError, ValueError):
        return None


def remove(path: str, wait_s: float = 1.0) -> bool:
    """Remove cgroup ``path`` once its processes are gone (they may take a moment to leave
    it after death); False if it is still busy after ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                return False
            time.sleep(0.002)


def remove_tree(path: str) -> None:
    """Remove cgroup ``path`` and every cgroup below it (their processes must be gone)."""
    for name in _listdir(path):
        sub = os.path.join(path, name)
        if os.path.isdir(sub):
            remove_tree(sub)
    remove(path, wait_s=0.2)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []
