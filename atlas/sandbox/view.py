"""What a sandboxed process may read: an allow-list of code, and the output trees masked.

Why an allow-list: a candidate that can read the whole checkout reads whatever lies there,
an ``.env`` with an API key, ``.git``, another run's records. So a runner sees only what its
task needs (``code_view``): the task's package, atlas's runner modules (the modules the
sandbox's worker, runner and the task's factories import, found by reading their import
statements, lazy ones included), the interpreter (its standard library) and the libraries
the task imports (the distributions of every third-party name those modules import, with
their requirements). Bubblewrap binds exactly that; Landlock lets a runner read exactly that
in every mode. Run folders and secrets are masked on top (``hidden_roots``), and a secret
file in a folder of code is refused (``secret_folder``).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import sys
import sysconfig
from dataclasses import dataclass
from typing import Any

import atlas

#: system directories a worker needs (shared libraries, ld.so's configuration, the CPU
#: topology); ``/opt`` only where ld.so is configured to look there
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/sys",
               "/nix")
#: where Hydra puts run and sweep folders (conf/train.yaml), relative to the launch directory
RUN_ROOTS = ("outputs", "multirun")
#: the devices a runner may open; the rest of the host's /dev (its shared memory, terminals,
#: disks) is not readable
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
#: what a candidate may read of /proc and /sys besides its own process: what libraries ask
#: about the machine (CPU count and features, memory size). Not the rest: global counters
#: (/proc/stat's count of forks since boot, a cgroup's task count) are channels between
#: candidates, as pids were
MACHINE_INFO = ("/proc/cpuinfo", "/proc/meminfo", "/sys/devices/system/cpu")
#: the modules every sandbox imports on both sides of the split
SANDBOX_MODULES = ("atlas.sandbox.worker", "atlas.sandbox.runner")


def outermost(paths: set[str] | list[str]) -> list[str]:
    """``paths`` without those that lie below another one."""
    keep = sorted(set(paths))
    return [p for i, p in enumerate(keep) if not any(p.startswith(q.rstrip("/") + "/")
                                                     for q in keep[:i])]


def _under(path: str, roots: list[str] | tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def symlink_chain(path: str) -> tuple[list[tuple[str, str]], str]:
    """The links that resolving ``path`` meets, folders' as well as files', each as (its
    real location, its text), and the real path it ends at. A view that shows only the end
    leaves a venv's ``bin/python -> python3 -> /home/..`` dangling, and a uv Python's
    ``cpython-3.x -> cpython-3.x.y`` folder missing from the import path."""
    links: list[tuple[str, str]] = []
    pending = os.path.abspath(path).split("/")[1:]
    here = "/"
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            here = os.path.dirname(here)
            continue
        step = os.path.join(here, part)
        if len(links) < 40 and os.path.islink(step):  # 40: the kernel's limit
            text = os.readlink(step)
            links.append((step, text))
            here = "/" if text.startswith("/") else here
            pending = text.split("/") + pending
        else:
            here = step
    return links, here


def folder_links(paths: list[str] | tuple[str, ...]) -> dict[str, str]:
    """The links met in resolving each of ``paths``' folders: {real location: text}."""
    return {link: text for p in paths
            for link, text in symlink_chain(os.path.dirname(os.path.abspath(p)))[0]}


def _ancestors(path: str) -> list[str]:
    """``path`` and every folder above it but ``/``."""
    out = []
    while path not in ("/", ""):
        out.append(path)
        path = os.path.dirname(path)
    return out


def repo_root() -> str:
    """The directory holding the ``atlas`` package (a clone's root, or site-packages)."""
    return os.path.dirname(os.path.dirname(os.path.realpath(atlas.__file__)))


#: top-level modules the sandbox's processes import (the task's factories), registered by
#: each ``Sandbox``: the launch directory counts as code only when one of them lives there
_NEEDED_MODULES: set[str] = set()


def need_modules(*paths: str) -> None:
    """Register the modules of ``"module:function"`` factories a sandbox imports."""
    _NEEDED_MODULES.update(p.split(":")[0].split(".")[0] for p in paths if p)


def _holds_needed_module(directory: str) -> bool:
    for name in _NEEDED_MODULES:
        where = _top_location(name)
        if where and where.startswith(directory + os.sep):
            return True
    return False


def code_paths() -> list[str]:
    """Everything that may hold code a sandboxed Python imports: interpreter, venv, atlas,
    import paths (the launch directory only where a task's module lives there). Where masks
    stop widening (``hidden_roots``) and where no secret may lie (``secret_folder``); a
    runner reads only ``code_view``'s part of it."""
    cwd = os.path.realpath(os.getcwd())
    imports = {os.path.realpath(p) for p in sys.path if p}
    if cwd in imports and cwd != repo_root() and not _holds_needed_module(cwd):
        imports.discard(cwd)
    paths = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable)), repo_root(), *imports}
    return outermost({os.path.realpath(p) for p in paths if os.path.isdir(p)})


@dataclass(frozen=True)
class CodeView:
    """What a sandboxed process may read of the code: ``readable`` files and directories
    (whole), ``listable`` directories whose names it may list (site-packages, for the import
    system) but whose entries it may read only where ``readable`` says, and ``masks``:
    directories inside a readable one that it may not read (the interpreter's own
    site-packages in a virtual environment)."""

    readable: tuple[str, ...]
    listable: tuple[str, ...]
    masks: tuple[str, ...]


def _site_dirs() -> list[str]:
    """The import path's site-packages directories."""
    return [os.path.realpath(p) for p in sys.path
            if p and os.path.basename(p) in ("site-packages", "dist-packages")
            and os.path.isdir(p)]


def _interpreter() -> tuple[set[str], set[str]]:
    """(readable, masks) of the interpreter: its executable, shared library, standard
    library and the virtual environment's marker; the base installation's site-packages is
    masked where it is not on the import path."""
    base = os.path.realpath(sys.base_prefix)
    where = {"installed_base": sys.base_prefix, "base": sys.base_prefix,
             "installed_platbase": sys.base_exec_prefix, "platbase": sys.base_exec_prefix}
    stdlib = {os.path.realpath(sysconfig.get_path(k, vars=where))
              for k in ("stdlib", "platstdlib")}
    # the standard library as the import path names it too: through a uv Python's
    # minor-version link, whose folder the views make again (``folder_links``)
    named = {sysconfig.get_path(k, vars=where) for k in ("stdlib", "platstdlib")}
    readable = {*stdlib, *named, os.path.realpath(sys.executable), sys.executable}
    for d in (os.path.join(base, "lib"), os.path.join(base, "lib64")):
        readable.update(os.path.join(d, n) for n in _listdir(d) if n.startswith("libpython"))
    cfg = os.path.join(sys.prefix, "pyvenv.cfg")
    if os.path.isfile(cfg):
        readable.add(cfg)
        bindir = os.path.dirname(sys.executable)
        readable.update(os.path.join(bindir, n) for n in _listdir(bindir)
                        if n.startswith("python"))
    on_path = set(_site_dirs())
    masks = {os.path.join(s, n) for s in stdlib for n in ("site-packages", "dist-packages")
             if os.path.isdir(os.path.join(s, n)) and os.path.join(s, n) not in on_path}
    return {p for p in readable if os.path.exists(p)}, masks


def _ld_dirs() -> set[str]:
    """Directories outside ``SYSTEM_DIRS`` where ld.so looks for shared libraries."""
    files = ["/etc/ld.so.conf"] + [os.path.join("/etc/ld.so.conf.d", n)
                                   for n in _listdir("/etc/ld.so.conf.d")]
    out = set()
    for path in files:
        try:
            with open(path) as fh:
                lines = fh.read().splitlines()
        except OSError:
            continue
        out.update(line.strip() for line in lines if line.strip().startswith("/"))
    return {os.path.realpath(d) for d in out if os.path.isdir(d)
            and not _under(os.path.realpath(d), SYSTEM_DIRS)}


def _top_location(name: str) -> str | None:
    """The file or package directory of top-level module ``name`` (without importing it)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        locs = list(spec.submodule_search_locations)
        return os.path.realpath(locs[0]) if locs else None
    if spec.origin in (None, "built-in", "frozen"):
        return None
    return os.path.realpath(spec.origin)


def _module_file(name: str, tops: dict[str, str]) -> str | None:
    """The source file of first-party module ``name`` (``tops``: top-level name -> its
    package directory), found on disk without importing it."""
    top, *rest = name.split(".")
    base = tops.get(top)
    if base is None:
        return None
    if not os.path.isdir(base):
        return base if not rest else None
    path = os.path.join(base, *rest)
    for candidate in (os.path.join(path, "__init__.py"), path + ".py"):
        if os.path.isfile(candidate):
            return candidate
    return None


def _imports(path: str, module: str) -> set[str]:
    """Every module name ``path`` imports, at any depth of its code (lazy imports too),
    relative imports resolved against ``module``."""
    import ast  # here: the runner, which imports this module, never reads code

    try:
        with open(path, "rb") as fh:
            tree = ast.parse(fh.read(), path)
    except (OSError, SyntaxError, ValueError):
        return set()
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            if base:
                out.add(base)
                out.update(f"{base}.{a.name}" for a in node.names if a.name != "*")
    return out


def _closure(entries: tuple[str, ...]) -> tuple[set[str], set[str]]:
    """(first-party files, third-party top-level names): the modules ``entries`` import,
    followed within their own top-level packages, and what they import from elsewhere."""
    firsts = {e.split(".")[0] for e in entries}
    tops = {t: loc for t in firsts if (loc := _top_location(t))}
    files: set[str] = set()
    others: set[str] = set()
    todo = list(entries)
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        top = name.split(".")[0]
        if top not in tops:
            if top not in sys.stdlib_module_names and top not in sys.builtin_module_names:
                others.add(top)
            continue
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # a package's __init__ runs before its module
            path = _module_file(".".join(parts[:i]), tops)
            if path and path not in files:
                files.add(path)
                todo.extend(_imports(path, ".".join(parts[:i])))
    return files, others


_REQ = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.lru_cache(maxsize=1)
def _top_level_names() -> dict[str, str]:
    """Top-level import name -> distribution, from the distributions' ``top_level.txt`` (for
    names that differ from their distribution's: ``absl`` of ``absl-py``)."""
    out: dict[str, str] = {}
    for site in _site_dirs():
        for entry in _listdir(site):
            if not entry.endswith(".dist-info"):
                continue
            try:
                with open(os.path.join(site, entry, "top_level.txt")) as fh:
                    names = fh.read().split()
            except OSError:
                continue
            dist = entry[:-len(".dist-info")].rsplit("-", 1)[0]
            out.update((n, dist) for n in names)
    return out


def _distribution(name: str) -> Any:
    """The installed distribution ``name`` (an ``importlib.metadata.Distribution``), or None."""
    import importlib.metadata  # here: heavy, and the runner never needs it

    try:
        return importlib.metadata.distribution(name)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


def _libraries(names: set[str]) -> set[str]:
    """Files and directories of the distributions behind top-level module ``names`` and of
    everything they require (extras left out); a module of no distribution by its own
    location."""
    out: set[str] = set()
    todo: list[str] = []
    for name in names:
        dist = _distribution(name) or _distribution(_top_level_names().get(name, name))
        if dist is None:
            where = _top_location(name)
            if where:
                out.add(where)
            continue
        todo.append(dist.metadata["Name"] or name)
    seen: set[str] = set()
    while todo:
        key = _norm(todo.pop())
        if key in seen:
            continue
        seen.add(key)
        dist = _distribution(key)
        if dist is None:
            continue
        root = os.path.realpath(str(dist.locate_file("")))
        for f in dist.files or ():
            if f.parts and f.parts[0] not in ("..", "__pycache__"):
                out.add(os.path.join(root, f.parts[0]))
        for req in dist.requires or ():
            marker = req.partition(";")[2]
            if "extra" not in marker and (m := _REQ.match(req)):
                todo.append(m.group(1))
    return {p for p in out if os.path.exists(p)}


def _site_hooks() -> set[str]:
    """What the interpreter reads in site-packages at start: ``.pth`` files and the modules
    they import (an editable install's finder, setuptools' shim)."""
    out: set[str] = set()
    for site in _site_dirs():
        for name in _listdir(site):
            if not name.endswith(".pth"):
                continue
            path = os.path.join(site, name)
            out.add(path)
            try:
                with open(path) as fh:
                    text = fh.read()
            except OSError:
                continue
            for mod in re.findall(r"(?:^import\s+|__import__\(['\"])([A-Za-z_][\w]*)", text, re.M):
                where = os.path.join(site, mod)
                for p in (where, where + ".py"):
                    if os.path.exists(p):
                        out.add(p)
    return out


@functools.lru_cache(maxsize=16)
def code_view(factories: tuple[str, ...] = ()) -> CodeView:
    """What a worker and its runners may read for a task whose factories are ``factories``
    (``"module:function"``): the task's package (each factory module's package, whole, with
    its data), atlas's modules that the sandbox and those modules import, the interpreter,
    the libraries they import, and the system directories. Not the checkout's root, its
    ``.git``, an ``.env`` or a run folder."""
    modules = tuple(dict.fromkeys([*SANDBOX_MODULES, *(f.split(":")[0] for f in factories)]))
    files, others = _closure(modules)
    packages = set()
    for module in modules[len(SANDBOX_MODULES):]:
        path = _module_file(module, {module.split(".")[0]: _top_location(module.split(".")[0])
                                     or ""})
        if path:
            packages.add(os.path.dirname(path))
    interpreter, masks = _interpreter()
    readable = {*files, *packages, *interpreter, *_libraries(others), *_site_hooks(),
                *_ld_dirs(), *(d for d in SYSTEM_DIRS if os.path.isdir(d))}
    listable = set(_site_dirs()) - readable
    return CodeView(tuple(outermost(readable)), tuple(sorted(listable)),
                    tuple(sorted(m for m in masks if _under(m, list(readable)))))


def _listdir(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []


#: folders a secret file may not lie in directly (masking its folder whole would hide the
#: system): a system directory or anything below one
_SYSTEM_ROOTS = (*SYSTEM_DIRS, "/opt", "/proc", "/dev", "/boot", "/run", "/var/lib",
                 "/var/cache")


def secret_folder(path: str, field: str = "sandbox.secret_file") -> str:
    """The folder to mask for a secret file: its own folder, whole (a secret beside it, of
    another comparison, goes with it). A ValueError with the fix where that folder holds
    code candidates import (a package, atlas's ``conf/``, an import root) or is a system
    folder: masking it would break the sandbox, not masking it would leave the secret
    readable by name."""
    real = os.path.realpath(path)
    folder = os.path.dirname(real)
    why = None
    if folder == "/" or any(folder == d or folder.startswith(d + "/") for d in _SYSTEM_ROOTS):
        why = "a system folder"
    elif any(c == folder or c.startswith(folder + "/") for c in code_paths()):
        why = "a folder that holds code candidates import"
    elif os.path.exists(os.path.join(folder, "__init__.py")) or any(
            n.endswith(".py") for n in _listdir(folder)):
        why = "a Python package folder"
    elif folder == os.path.join(repo_root(), "conf") or folder.startswith(
            os.path.join(repo_root(), "conf") + "/"):
        why = "atlas's config folder conf/"
    if why:
        raise ValueError(f"{field}={path} lies directly in {why} ({folder}); the sandbox masks "
                         f"a secret's folder whole, so keep it in a folder of its own or a run "
                         f"folder (outputs/, multirun/), e.g. outputs/shared/.task_secret")
    return folder


def readable_roots(view: CodeView | None = None) -> list[str]:
    """Everything a runner may read besides its own directory (Landlock's rules): the code
    ``view`` (default: every code path), /proc (narrowed in the runner) and the devices."""
    code = list(view.readable) if view is not None else [
        *(d for d in SYSTEM_DIRS if os.path.isdir(d)), *code_paths()]
    return [*outermost({*code, "/proc"}), *(d for d in DEVICES if os.path.exists(d))]


def candidate_readable(readable: list[str] | tuple[str, ...]) -> list[str]:
    """``readable`` with /proc and /sys narrowed to this process and ``MACHINE_INFO`` (for the
    runner's Landlock rules, called in the runner: /proc/self is its own pid there)."""
    out = [r for r in readable if r not in ("/proc", "/sys")]
    return out + [os.path.realpath("/proc/self"), *MACHINE_INFO]


def hidden_roots(paths: list[str], cwd: str | None = None) -> list[str]:
    """What to mask so that no candidate reads any run's secret or records.

    A secret file stands for its folder, whole (``secret_folder``, which refuses a folder of
    code or of the system). Each path (a run folder, a secret's folder) widens to its
    outermost ancestor that holds no code path and is not a top-level directory: the whole
    output tree, so a sweep's sibling jobs (each with a copy of the shared secret and its
    own ``programs.jsonl``) and the sweep's secret go with the job under attack, wherever
    the tree lies. Hydra's run and sweep roots below ``cwd`` and below the clone holding
    atlas are added, so single runs and other sweeps are hidden too, from any launch
    directory (``atlas.score`` masks what a run masks).
    """
    needed = [*code_paths(), *SYSTEM_DIRS]
    cwd = os.path.realpath(cwd or os.getcwd())
    roots = [os.path.join(base, r) for base in dict.fromkeys([cwd, repo_root()])
             for r in RUN_ROOTS]
    out: set[str] = set()
    for p in [*paths, *roots]:
        p = os.path.realpath(p)
        if not os.path.exists(p):
            continue
        if not os.path.isdir(p):
            p = secret_folder(p)
        while True:
            up = os.path.dirname(p)
            if up == "/" or os.path.dirname(up) == "/" or any(
                    n == up or n.startswith(up + "/") or up.startswith(n + "/") for n in needed):
                break
            p = up
        out.add(p)
    return outermost(out)


def bind_args(view: CodeView | None, hide: list[str]) -> tuple[list[str], list[str], list[str]]:
    """bwrap arguments that show a worker ``view`` (default: every code path) and nothing
    else of the host: (read-only binds, parents before children, with the masks of ``view``
    as empty tmpfs over their directory; the same for code below /tmp, which must come
    after bubblewrap's private /tmp; the ``hide`` masks of run folders and secrets, which
    come last so that no later bind uncovers them)."""
    if view is None:
        view = CodeView(tuple(outermost({*(d for d in SYSTEM_DIRS if os.path.isdir(d)),
                                         *code_paths()})), (), ())
    # each bind at its folder's real place (a file's own link stays: its target is bound
    # there), and the folder links met on the way made again, as links
    binds = sorted({os.path.join(os.path.realpath(os.path.dirname(p)), os.path.basename(p))
                    for p in view.readable})
    masks = list(view.masks)
    # (the interpreter as it is started, and its import path, as named: through them)
    named = [sys.executable, *(os.path.join(p, "-") for p in sys.path if p)]
    links = {k: v for k, v in folder_links([*view.readable, *named]).items()
             if not _under(k, binds)}
    early: list[str] = []
    late: list[str] = []
    # the folders above a bind or a link: bubblewrap as root would make them 0700, which a
    # runner's fresh uid could not pass
    parents = {os.path.dirname(p) for p in [*binds, *links]}
    parents = {a for p in parents for a in _ancestors(p) if not _under(a, binds)}
    for d in sorted(parents):
        (late if d.startswith("/tmp/") else early).extend(["--perms", "0755", "--dir", d])
    for path in sorted({*binds, *masks}):
        above = [p for p in (*binds, *masks) if p != path and _under(path, [p])]
        nearest = max(above, key=len) if above else None
        if path in masks:
            if nearest is None or nearest in masks:
                continue  # nothing of it is shown
            args = ["--tmpfs", path]
        elif nearest is not None and nearest in binds:
            continue  # already shown through its parent
        else:
            args = ["--ro-bind", path, path]
        (late if path.startswith("/tmp/") else early).extend(args)
    for link, text in sorted(links.items()):
        (late if link.startswith("/tmp/") else early).extend(["--symlink", text, link])
    hidden: list[str] = []
    for p in sorted({os.path.realpath(p) for p in hide}):
        if not _under(p, binds):  # a mask matters only where the host shows through
            continue
        if os.path.isdir(p):
            hidden += ["--tmpfs", p]
        elif os.path.exists(p):
            hidden += ["--ro-bind", "/dev/null", p]
    return early, late, hidden
