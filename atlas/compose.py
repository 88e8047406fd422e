"""The run's config from ``conf/``, overrides and ``hydra.searchpath``, for
``python -m atlas.train`` and outside it, so ``atlas.score`` and ``atlas.tasks check`` build
exactly the task a run builds. Also the checks Hydra does badly, made on the command line
before it composes: a ``pkg://`` search path whose package cannot be imported (Hydra says
only "Could not find 'task/<name>'"), a mistyped group or option, a key that no option of
``conf/`` defines (``check_known_keys`` checks the composed config the same way), and a YAML
mistake in a file the config is composed from, as one line naming the file, line and column
(``atlas.configerrors``; a broken file the command does not use stops nothing).
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from atlas.configerrors import bad_value, missing_option_line, omegaconf_line, yaml_line
from atlas.fields import check_known_fields
from atlas.loggers import builtin as builtin_logger
from atlas.overrides import grammar_problem
from atlas.schema import ConfigError

CONF = Path(__file__).resolve().parents[1] / "conf"
# sub-trees whose keys are validated by their consumer, not by the YAML schema
_OPEN = frozenset({"dpo.bounds"})  # any DPO knob; DPOConfig checks the names
_ROLE_BLOCKS = ("exploration", "strategist", "inspector")  # may repeat any supporters key

_PKG = re.compile(r"pkg\\?://([A-Za-z_][\w.]*)")  # pkg\:// : as a sweep's jobs carry it


def searchpath_problem(overrides: list[str]) -> str | None:
    """One line naming a ``pkg://`` entry of ``hydra.searchpath`` whose package cannot be
    imported, and the fix; None when every one can."""
    for item in overrides:
        key, _, value = item.partition("=")
        if key.lstrip("+~") != "hydra.searchpath":
            continue
        for package in _PKG.findall(value):
            try:
                found = importlib.util.find_spec(package) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                top = package.split(".")[0]
                return (f"hydra.searchpath: pkg://{package} cannot be imported (no package "
                        f"{package!r} on the Python path); run with PYTHONPATH=<the folder "
                        f"that holds {top}/>, or pip install -e your package")
    return None


# -- known keys -------------------------------------------------------------------------------
def _merge(into: dict[str, Any], data: Mapping[str, Any]) -> None:
    """Union of key trees (a key that is a mapping in any option stays a mapping)."""
    for key, value in data.items():
        if isinstance(value, Mapping):
            node = into.get(key)
            if not isinstance(node, dict):
                node = into[key] = {}
            _merge(node, value)
        else:
            into.setdefault(key, None)


def _read_option(path: Path) -> Any:
    """An option file's content, or None (and a note in ``UNREADABLE``) when its YAML is
    broken: only a command that uses the file fails on it, naming it (``compose``)."""
    try:
        return OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}
    except (yaml.YAMLError, ValueError, OSError) as exc:
        UNREADABLE[str(path)] = yaml_line(exc) or f"{path}: {exc}"
        return None


#: option files of ``conf/`` that ``schema`` skipped, with why (a YAML mistake)
UNREADABLE: dict[str, str] = {}


@functools.lru_cache(maxsize=1)
def schema(conf: Path = CONF) -> dict[str, Any]:
    """Every key any readable option of ``conf/`` defines, as a tree (leaves are None).

    Why from the YAML files: they are the documentation of every field, so a key that none of
    them defines is read by nothing. A file whose YAML is broken is skipped (``UNREADABLE``):
    a draft experiment must not stop a command that does not use it.
    """
    tree: dict[str, Any] = {}
    top = _read_option(conf / "train.yaml") or {}
    _merge(tree, {k: v for k, v in top.items() if k not in ("defaults", "hydra")})
    for group in sorted(p for p in conf.iterdir() if p.is_dir() and p.name != "hydra"):
        for option in sorted(group.glob("*.yaml")):
            data = _read_option(option)
            if not isinstance(data, dict):
                continue
            data.pop("defaults", None)
            if "@package _global_" in option.read_text():
                _merge(tree, data)
            else:
                _merge(tree.setdefault(group.name, {}), data)
    return tree


def _where(key: str, value: Any, known: Mapping[str, Any]) -> str:
    """Where top-level ``key`` lives: an option of a group (``wandb.mode=online`` ->
    ``logger=wandb logger.mode=online``) or a field of one (``lr`` -> ``dpo.lr``)."""
    owners = [g for g, options in groups().items() if key in options]
    if owners:
        group = owners[0]
        sets = [f"{group}.{k}={v}" for k, v in (value if isinstance(value, Mapping) else {}).items()
                if isinstance(known.get(group), Mapping) and k in known[group]]
        return f"; {key} is an option of {group}: set {' '.join([f'{group}={key}', *sets])}"
    fields = sorted(f"{g}.{key}" + ("" if isinstance(value, Mapping) else f"={value}")
                    for g, sub in known.items() if isinstance(sub, Mapping) and key in sub)
    return f"; did you mean {' or '.join(fields)}?" if fields else ""


def model_hint(option: str) -> str:
    """For ``model=<not an option>``: a Hugging Face model (a hub id such as ``qwen2`` or a
    folder) is named by ``model.source=hf model.name_or_path=...``, not by ``model=``. Why: the
    options are configurations of the agent; any other model comes in through that field."""
    folder = Path(option).expanduser()
    if folder.exists():
        return (f"; {option} is a folder, not an option: load the model it holds with "
                f"model.source=hf model.name_or_path={folder.resolve()}")
    if "/" in option:
        return (f"; {option} reads as a hub id, not an option: load it with model.source=hf "
                f"model.name_or_path={option}")
    return ("; for another Hugging Face model, name it with model.source=hf "
            "model.name_or_path=<hub id or folder> (e.g. model.name_or_path=Qwen/Qwen2-0.5B)")


def _other_group(key: str, value: Any, path: str, known: Mapping[str, Any]) -> str:
    """Where a field typed under the wrong group lives (``explore.beta`` -> ``dpo.beta``)."""
    owners = sorted(g for g, sub in known.items()
                    if g != path and isinstance(sub, Mapping) and key in sub)
    if not owners:
        return ""
    shown = "" if isinstance(value, Mapping) else f"={value}"
    return (f"{key} is a field of {' and '.join(owners)}, not of {path}: did you mean "
            f"{' or '.join(f'{g}.{key}{shown}' for g in owners)}?")


def _unknown(node: Mapping[str, Any], known: dict[str, Any], path: str) -> None:
    if path in _OPEN:
        return
    allowed = dict(known)
    if path.startswith("supporters.") and path.count(".") == 1 and path.split(".")[1] in _ROLE_BLOCKS:
        # a role block overrides the shared supporters keys (`+supporters.exploration.max_tokens=`)
        allowed.update({k: v for k, v in schema()["supporters"].items() if k not in _ROLE_BLOCKS})
    extra = [k for k in node if k not in allowed]
    if extra:
        close = difflib.get_close_matches(str(extra[0]), [str(k) for k in allowed], n=1)
        fix = f"; did you mean {path + '.' if path else ''}{close[0]}?" if close else ""
        if not path:  # a name that lives elsewhere says where, before any look-alike
            fix = _where(str(extra[0]), node[extra[0]], allowed) or fix
        added = f" (a key added with `+{path + '.' if path else ''}{extra[0]}=...` is read by nothing)"
        elsewhere = (_other_group(str(extra[0]), node[extra[0]], path, schema())
                     if path and "." not in path else "")
        if elsewhere:  # a field of another group (explore.beta -> dpo.beta): its place
            raise ConfigError(f"unknown {path} field(s) {sorted(map(str, extra))}: "
                              f"{path}.{extra[0]} is not a known field; {elsewhere}{added}")
        if not path and str(extra[0]) in groups():  # experiment/*: keys of the whole config
            raise ConfigError(f"{extra[0]}: its option file put its keys under `{extra[0]}.`; "
                              f"an {extra[0]} file sets fields of the whole config, so make "
                              f"`# @package _global_` its first line (as conf/{extra[0]}/*.yaml"
                              f" do)")
        if not path:
            raise ConfigError(f"unknown top-level key(s) {sorted(map(str, extra))}: {extra[0]} is "
                              f"not a known field; remove it or use one of "
                              f"{sorted(map(str, allowed))}{fix}{added}")
        try:
            check_known_fields(allowed, node, path, hint=fix)
        except ValueError as exc:
            raise ConfigError(f"{exc}{added}") from None
    for key, value in node.items():
        if isinstance(value, Mapping) and isinstance(allowed.get(key), dict):
            _unknown(value, allowed[key], f"{path}.{key}" if path else str(key))


def check_known_keys(cfg: DictConfig) -> None:
    """ConfigError naming the first key that no option of ``conf/`` defines.

    A task or logger with its own ``_target_`` may come from another package's config folder:
    its class checks its own fields (``Task(**cfg.task)`` fails naming an unknown one), not
    this schema.
    """
    node = OmegaConf.to_container(cfg, resolve=False)
    if isinstance(node.get("task"), Mapping) and "_target_" in node["task"]:
        node = {k: v for k, v in node.items() if k != "task"}
    if not builtin_logger(node.get("logger", {})):
        node = {k: v for k, v in node.items() if k != "logger"}  # its factory checks its fields
    _unknown(node, schema(), "")


def override_problem(overrides: Sequence[str]) -> str | None:
    """One line naming a ``group.field=value`` override whose field no option of ``conf/``
    defines, with the closest known field; None when every one is known.

    Why before Hydra: Hydra rejects such a key in four lines that suggest ``+field=``, which
    would add a key nothing reads. Keys added with ``+``/``++``, removed with ``~``, Hydra's own
    and, when ``hydra.searchpath`` brings other config folders, the task's, are left to the
    later checks.
    """
    external = any(o.split("=", 1)[0].lstrip("+~") == "hydra.searchpath"
                   or o.startswith(("--config-dir", "-cd")) for o in overrides)
    for item in overrides:
        key, eq, value = item.partition("=")
        if not eq or key[:1] in "+~" or "." not in key or key.startswith("hydra."):
            continue
        if external and key.startswith("task."):
            continue
        node: dict[str, Any] = {}
        leaf = node
        for part in key.split(".")[:-1]:
            leaf = leaf.setdefault(part, {})
        leaf[key.split(".")[-1]] = value
        try:
            _unknown(node, schema(), "")
        except ConfigError as exc:
            return str(exc)
    return None


# -- group names and options, before Hydra ------------------------------------------------------
def group_defaults(group: str, conf: Path = CONF) -> dict[str, Any]:
    """The values of a group's default option (``conf/<group>/default.yaml``), unresolved."""
    return OmegaConf.to_container(OmegaConf.load(conf / group / "default.yaml"),
                                  resolve=False) or {}


def groups(conf: Path = CONF) -> dict[str, list[str]]:
    """``{group: [option, ...]}`` of ``conf/`` (Hydra's own groups left out)."""
    return {d.name: sorted(p.stem for p in d.glob("*.yaml"))
            for d in sorted(conf.iterdir()) if d.is_dir() and d.name != "hydra"}


def _searchpath_folders(overrides: Sequence[str]) -> list[Path]:
    """The folders a ``hydra.searchpath=[...]`` override adds (``pkg://`` and ``file://``)."""
    out: list[Path] = []
    for item in overrides:
        key, _, value = item.partition("=")
        if key.lstrip("+~") != "hydra.searchpath":
            continue
        # a sweep's job overrides come back from Hydra's parser escaped (pkg\://)
        for scheme, where in re.findall(r"(pkg|file)\\?://([^,\]\s'\"]+)", value):
            if scheme == "file":
                out.append(Path(where))
                continue
            top, _, rest = where.partition(".")
            try:
                spec = importlib.util.find_spec(top)
            except (ImportError, ValueError):
                spec = None
            if spec is not None and spec.submodule_search_locations:
                out += [Path(loc, *rest.split(".")) if rest else Path(loc)
                        for loc in spec.submodule_search_locations]
    return out


def group_problem(overrides: Sequence[str]) -> str | None:
    """One line naming a mistyped group (``methd=atlas``) or option (``method=atlass``,
    ``task=mytask`` without the ``hydra.searchpath`` that holds it), with the closest known
    name; None when every ``group=option`` is known.

    Why before Hydra: it suggests ``+methd=atlas`` (a key nothing reads) for the first and
    prints a many-line listing for the others. Sweep lists (``method=atlas,evodpo``) are
    checked value by value; sweep functions (``range(...)``), interpolations and
    ``--config-dir`` (options Hydra finds elsewhere) are left to Hydra.
    """
    if any(o.startswith(("--config-dir", "-cd", "--config-path", "-cp")) for o in overrides):
        return None
    known = groups()
    top = [str(k) for k in schema()]  # train.yaml's fields and those experiment/* adds
    extra = _searchpath_folders(overrides)
    for item in overrides:
        key, eq, value = item.partition("=")
        if not eq or key[:1] in "+~" or "." in key or "/" in key or key.startswith("-"):
            continue
        if key not in known:
            if key in top:
                continue
            names = sorted([*known, *top])
            close = difflib.get_close_matches(key, names, n=1)
            hint = (_where(key, value, schema())
                    or (f"; did you mean {close[0]}={value}?" if close else ""))
            return (f"{key} is neither a config group nor a field{hint}"
                    f" (groups: {', '.join(sorted(known))})")
        value = value.strip("'\"")
        if any(c in value for c in "()[]{}$*") or value in ("null", ""):
            continue
        options = set(known[key])
        for folder in extra:
            options |= {p.stem for p in (folder / key).glob("*.yaml")}
        for option in value.split(","):
            if option in options:
                continue
            close = difflib.get_close_matches(option, sorted(options), n=1)
            msg = (f"{key}={option}: no option conf/{key}/{option}.yaml"
                   + (f"; did you mean {key}={close[0]}?" if close else "")
                   + f" (options: {', '.join(sorted(options))})")
            if key == "task" and not close:
                msg += ("; a task from your own package needs its config folder on the search "
                        "path, e.g. 'hydra.searchpath=[pkg://mypkg.conf]' (docs/tasks.md)")
            if key == "model":
                msg += model_hint(option)
            return msg
    return None


# -- the composed config ------------------------------------------------------------------------
def _with_config_dir(overrides: Sequence[str], config_dir: str | None) -> list[str]:
    """``overrides`` with ``--config-dir``'s folder on ``hydra.searchpath``, where Hydra puts it
    (after ``conf/``)."""
    if not config_dir:
        return list(overrides)
    extra = f"file://{Path(config_dir).resolve()}"
    out, added = [], False
    for item in overrides:
        key, eq, value = item.partition("=")
        if eq and key.lstrip("+") == "hydra.searchpath" and value.strip().startswith("["):
            inner = value.strip()[1:-1].strip()
            item, added = f"{key}=[{inner + ',' if inner else ''}{extra}]", True
        out.append(item)
    return out if added else [*out, f"hydra.searchpath=[{extra}]"]


def _hydra_compose(overrides: Sequence[str], config_dir: str | None = None,
                   config_name: str = "train") -> Any:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose(config_name, overrides=_with_config_dir(overrides, config_dir))


def compose_problem(overrides: Sequence[str], config_dir: str | None = None,
                    config_name: str = "train") -> str | None:
    """One line for why the config of ``overrides`` does not compose from ``conf/``,
    ``--config-dir``'s folder and ``hydra.searchpath``: YAML that does not parse, a defaults
    list naming an option that is not there, an interpolation that does not parse, a key the
    overrides name wrongly (``override_problem``), else Hydra's own message in one line;
    None when it composes. An error that is not Hydra's or OmegaConf's (a bug) is left to
    Hydra's traceback."""
    from hydra.errors import HydraException, MissingConfigException
    from omegaconf.errors import OmegaConfBaseException

    try:
        _hydra_compose(overrides, config_dir, config_name)
    except MissingConfigException as exc:
        return missing_option_line(exc)
    except Exception as exc:  # noqa: BLE001 - every failure to compose is this check's finding
        if (bad := bad_value(exc)) is not None:
            return omegaconf_line(bad)
        if found := yaml_line(exc) or override_problem(overrides):
            return found
        if isinstance(exc, (HydraException, OmegaConfBaseException)):
            return " ".join(str(exc).split())
    return None


def compose(overrides: list[str]) -> Any:
    """The composed ``train`` config for ``overrides`` (as on the command line), without the
    run-folder fields that need a running Hydra job. ValueError: a one-line cause."""
    from hydra.errors import HydraException, MissingConfigException
    from omegaconf.errors import OmegaConfBaseException

    problem = (grammar_problem(overrides, groups()) or searchpath_problem(overrides)
               or group_problem(overrides))
    if problem:
        raise ValueError(problem)
    try:
        return _hydra_compose(overrides)
    except MissingConfigException as exc:
        raise ValueError(missing_option_line(exc)) from None
    except (HydraException, OmegaConfBaseException, yaml.YAMLError) as exc:
        # a YAML mistake first: a file that does not parse is missing from ``schema``, so a
        # key it defines would read as unknown
        bad = bad_value(exc)
        raise ValueError(yaml_line(exc) or (omegaconf_line(bad) if bad else None)
                         or override_problem(overrides) or " ".join(str(exc).split())) from None


__all__ = ["CONF", "UNREADABLE", "check_known_keys", "compose", "group_problem",
           "groups", "override_problem", "schema", "searchpath_problem", "compose_problem"]
