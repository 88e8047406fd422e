"""The novelty issue's check on run folders: before and after phase 1, pooled over runs.

    python scripts/novelty_check.py outputs/cpu/bandit_atlas_s*

"Before phase 1" is exploration phase 1 (the rounds before the first training), "after" the
later phases. Printed per run and pooled: the agent's proposals, copies (not evaluated under
``explore.copies=skip``), evaluated programs and how many were ``new``, new valid programs,
and new valid programs per proposal. The pooled rows give Fisher's exact two-sided p of
"new and valid" per proposal, after against before, and a copy count by our own syntax-tree
rule (``ast.dump`` of the whole module, comments dropped) beside atlas's labels.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

from scipy.stats import fisher_exact


def _ours(code: str) -> str:
    try:
        return ast.dump(ast.parse(code))
    except SyntaxError:
        return code.strip()


def run_rows(run: Path) -> dict[str, dict[str, int]]:
    results = json.loads((run / "results.json").read_text())
    programs = [json.loads(x) for x in (run / "programs.jsonl").read_text().splitlines() if x]
    out = {}
    for side, keep in (("before", lambda k: k == 1), ("after", lambda k: k > 1)):
        rows = [r for r in results["novelty"]["by_phase"] if keep(int(r["phase"]))]
        agent = [r["agent"] for r in rows]
        total = {k: sum(int(a.get(k) or 0) for a in agent)
                 for k in ("proposals", "copies", "evaluated", "new_valid")}
        total["new"] = sum(int((a.get("labels") or {}).get("new") or 0) for a in agent)
        # our own check: evaluated agent programs whose module repeats an earlier program
        seen, repeats = set(), 0
        for p in sorted(programs, key=lambda p: int(p["id"])):
            key = _ours(p.get("code") or "")
            if p.get("source") == "agent" and keep(int(p.get("phase", 0))) and key in seen:
                repeats += 1
            seen.add(key)
        total["evaluated_repeats_ours"] = repeats
        out[side] = total
    return out


def main(paths: list[str]) -> None:
    pooled = {s: {} for s in ("before", "after")}
    for path in paths:
        rows = run_rows(Path(path))
        for side, t in rows.items():
            for k, v in t.items():
                pooled[side][k] = pooled[side].get(k, 0) + v
            print(f"{Path(path).name:22s} {side:6s} " + " ".join(f"{k} {v}" for k, v in t.items()))
    for side, t in pooled.items():
        share = t["new_valid"] / t["proposals"] if t["proposals"] else float("nan")
        new_share = t["new"] / t["evaluated"] if t["evaluated"] else float("nan")
        print(f"pooled {side:6s} proposals {t['proposals']} copies {t['copies']} evaluated "
              f"{t['evaluated']} new {t['new']} ({new_share:.2f} of evaluated) new&valid "
              f"{t['new_valid']} ({share:.3f} per proposal); evaluated repeats by our own "
              f"rule {t['evaluated_repeats_ours']}")
    b, a = pooled["before"], pooled["after"]
    table = [[a["new_valid"], a["proposals"] - a["new_valid"]],
             [b["new_valid"], b["proposals"] - b["new_valid"]]]
    print(f"new & valid per proposal, after vs before: Fisher exact two-sided p "
          f"{fisher_exact(table)[1]:.3g}")


if __name__ == "__main__":
    main(sys.argv[1:])
