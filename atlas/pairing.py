"""Which runs may be paired: the arms of one task and seed (a paired block) must have faced one
task secret, or their difference mixes the methods with the problems.

Why a check: a study run in chunks can give a seed's arms different secrets without an error
(a chunk run without ``experiment=study``, a mistyped ``sandbox.secret_file`` beside
``create_secret``, a run folder resumed elsewhere). The evidence, from what runs record:

- ``initial_score``: the seed program's score on the last equation. The hidden environments
  (bandit) and validation points (PINN) follow the secret, so arms on one secret score the
  seed alike, and arms on two secrets almost never do;
- ``secret_fingerprint``: a hash of the secret (``atlas.sandbox.secret.fingerprint``), as the
  run recorded it in its end record, else of the run folder's own ``.task_secret`` where the
  folder still holds it (an archive keeps the secrets beside the runs instead);
- ``secret_file``: ``sandbox.secret_file`` in the config event (None: a fresh secret drawn),
  compared only where a fingerprint is missing, since one secret may be read from two paths.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from atlas.sandbox.secret import SECRET_FILE, fingerprint

#: initial scores this close (relative) count as equal: the same program on the same secret
#: scores exactly alike (the archived study: equal to the last bit), a float's round trip aside
SCORE_REL_TOL = 1e-9


def secret_evidence(run_dir: Path, config: dict[str, Any], recorded: str | None = None
                    ) -> dict[str, str | None]:
    """What a run folder says about its secret: the configured file and the secret's
    fingerprint, as ``recorded`` in the end record or else from the folder's own secret;
    None where absent."""
    source = (config.get("sandbox") or {}).get("secret_file")
    found = recorded
    if found is None:
        try:
            value = (Path(run_dir) / SECRET_FILE).read_text().strip()
        except OSError:
            value = ""
        found = fingerprint(value) if value else None
    return {"secret_file": None if source is None else str(source),
            "secret_fingerprint": found}


def _classes(values: dict[str, Any], same: Any) -> list[tuple[Any, list[str]]]:
    """Arms grouped by a value (``same(a, b)`` says two values agree), unknown ones left out;
    the largest group first, so the odd arms come last."""
    groups: list[tuple[Any, list[str]]] = []
    for arm_name, v in values.items():
        if v is None:
            continue
        for value, arms in groups:
            if same(value, v):
                arms.append(arm_name)
                break
        else:
            groups.append((v, [arm_name]))
    return sorted(groups, key=lambda g: (-len(g[1]), sorted(g[1])))


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=SCORE_REL_TOL, abs_tol=0.0)


def conflicts(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Why ``runs`` (one task and seed, results records with ``secret``) cannot have shared a
    secret, one phrase per piece of evidence that differs; [] when nothing recorded differs."""
    def split(key: str, values: dict[str, Any], same: Any, fmt: Any) -> str | None:
        groups = _classes(values, same)
        if len(groups) < 2:
            return None
        return f"{key} " + " / ".join(f"{fmt(v)} ({', '.join(sorted(arms))})"
                                      for v, arms in groups)

    def name(r: dict[str, Any]) -> str:
        return str(r["method"])

    out = []
    scores = {name(r): r.get("initial_score") for r in runs}
    found = split("initial_score", scores, _close, lambda v: format(v, ".6g"))
    if found:
        out.append(found)
    evidence = {name(r): r.get("secret") or {} for r in runs}
    prints = {a: e.get("secret_fingerprint") for a, e in evidence.items()}
    found = split("secret fingerprint", prints, str.__eq__, str)
    if found:
        out.append(found)
    if any(v is None for v in prints.values()):
        files = {a: e.get("secret_file") or "none (a fresh secret)" for a, e in evidence.items()
                 if e}
        found = split("sandbox.secret_file", files, str.__eq__, str)
        if found:
            out.append(found)
    return out


def blocks(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per task and seed, the arms that ran and whether they share a secret: ``conflicts``
    names what differs (empty when nothing does)."""
    by: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        by[(str(r["task"]), int(r["seed"]))].append(r)
    return [{"task": task, "seed": seed, "arms": sorted(str(r["method"]) for r in rs),
             "conflicts": conflicts(rs)}
            for (task, seed), rs in sorted(by.items())]


def warnings(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One warning line per block whose arms did not share a secret (``blocks``' rows)."""
    return [f"warning: {b['task']} seed {b['seed']}: its arms did not face one task secret "
            f"({'; '.join(b['conflicts'])}); the paired differences of this block compare "
            f"different problems, so the block is not complete: run the odd arm on the seed's "
            f"secret (sandbox.secret_file)"
            for b in rows if b["conflicts"]]
