"""A config that does not compose or resolve, as one line naming the file or key and the fix.

Why: Hydra lets PyYAML's many-line error through as it is (naming ``"<unicode string>"`` when
the text was read first), prints OmegaConf's key and node type on lines of their own, and
lists every option of a group it could not find. ``atlas.compose`` and ``atlas.config`` turn
each into the one line a command prints.
"""

from __future__ import annotations

import difflib

import yaml


def yaml_line(exc: BaseException) -> str | None:
    """One line naming the file, line, column and problem of a YAML error in ``exc``'s chain
    (Hydra lets PyYAML's many-line error through as it is); None when there is none."""
    while exc is not None and not isinstance(exc, yaml.YAMLError):
        exc = exc.__cause__ or exc.__context__
    if exc is None:
        return None
    mark = getattr(exc, "problem_mark", None)
    if mark is None:
        return f"a YAML file cannot be read: {' '.join(str(exc).split())}; fix its YAML"
    problem = getattr(exc, "problem", None) or "cannot be parsed"
    where = f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}"
    context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and start is not None and (start.line, start.column) != (mark.line, mark.column):
        problem += f" ({context} at line {start.line + 1}, column {start.column + 1})"
    hint = ("indent with spaces: YAML refuses tabs" if "'\\t'" in problem
            else "close the bracket or quote opened there" if "<stream end>" in problem
            else "quote a value that holds ': '" if "mapping values are not allowed" in problem
            else "fix the YAML there")
    return f"{where}: {problem}; {hint}"


def omegaconf_line(exc: BaseException) -> str:
    """One line for an OmegaConf error (its message puts the key and the node's type on lines
    of their own), naming the key and the fix."""
    from omegaconf.errors import GrammarParseError, InterpolationKeyError, MissingMandatoryValue

    key = getattr(exc, "full_key", None) or ""
    text = getattr(exc, "msg", None) or str(exc)
    message = " ".join(str(text).split("\n    full_key")[0].split())
    if isinstance(exc, InterpolationKeyError):
        fix = "an interpolation ${...} names a key the config does not have: fix it"
    elif isinstance(exc, GrammarParseError):
        fix = "write an interpolation as ${group.field}, braces closed"
    elif isinstance(exc, MissingMandatoryValue):
        fix = f"give it a value: {key}=<value>"
    else:
        fix = "fix the value in its YAML file or override"
    return f"{key + ': ' if key else ''}{message}; {fix}"


def missing_option_line(exc: BaseException) -> str:
    """One line for Hydra's "Could not find 'group/option'" (a defaults list naming an option
    that is not there), with the closest option."""
    first = str(exc).strip().splitlines()[0]
    missing = str(getattr(exc, "missing_cfg_file", "") or "")
    options = [str(o) for o in getattr(exc, "options", None) or []]
    close = difflib.get_close_matches(missing.rsplit("/", 1)[-1], options, n=1)
    group = missing.rsplit("/", 1)[0] if "/" in missing else ""
    fix = f"; did you mean {group + '/' if group else ''}{close[0]}?" if close else ""
    return f"{first}{fix}" + (f" (options: {', '.join(options)})" if options else "")


def bad_value(exc: BaseException) -> BaseException | None:
    """The OmegaConf error in ``exc``'s chain about a value (an interpolation that does not
    parse or resolve, ``???``), not about a key (``override_problem`` says those better)."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

    while exc is not None:
        if isinstance(exc, OmegaConfBaseException):
            return None if isinstance(exc, (ConfigKeyError, ConfigAttributeError)) else exc
        exc = exc.__cause__ or exc.__context__
    return None
