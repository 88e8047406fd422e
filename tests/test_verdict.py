"""The pre-registered verdict (``atlas.verdict``) and the pairing check (``atlas.pairing``) on
small synthetic run records whose numbers are known: the endpoint per run, the family's exact
signed-rank p with its ties and Holm adjustment, a block on two secrets named and left out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from atlas import pairing, verdict
from atlas.sandbox.secret import fingerprint
from atlas.verdict import ABOVE_PARENTS, NEW_VALID, Comparison, Endpoint, Preregistration

SEEDS = (10, 11, 12)
INITIAL = {("bandit", 10): -0.40, ("bandit", 11): -0.36, ("bandit", 12): -0.37,
           ("pinn", 10): -0.22, ("pinn", 11): -0.25, ("pinn", 12): -0.23}


def result(task: str, method: str, seed: int, new_valid: int, above: int,
           proposals: int = 8, **extra: Any) -> dict[str, Any]:
    """A results record as ``atlas.report.load_run`` gives it: phases 3 and 4 each with
    ``proposals`` agent proposals, ``new_valid`` of them new and valid and ``above`` above
    their parents, split 1 : rest between the phases; phases 1-2 all new and valid (they must
    not count)."""
    def t(nv: int, ab: int) -> dict[str, Any]:
        return {"proposals": proposals, "new_valid": nv, "beats_parents": ab}
    by_phase = [{"phase": 1, "agent": t(proposals, proposals)},
                {"phase": 2, "agent": t(proposals, proposals)},
                {"phase": 3, "agent": t(min(1, new_valid), min(1, above))},
                {"phase": 4, "agent": t(new_valid - min(1, new_valid), above - min(1, above))}]
    return {"task": task, "method": method, "seed": seed, "experiment": "study",
            "complete": True, "initial_score": INITIAL[(task, seed)],
            "secret": {"secret_file": f"multirun/study/.task_secret_s{seed}",
                       "secret_fingerprint": None},
            "novelty": {"by_phase": by_phase}, **extra}


#: per (task, seed) block: (new_valid, above) out of 16 proposals in phases 3-4, per arm
BLOCKS = {
    # random_literals: never new; sample above it by 1..6 above-parents programs (all > 0)
    "random_literals": {b: (0, i) for i, b in enumerate(INITIAL)},
    "sample": {b: (2, 2 * i + 1) for i, b in enumerate(INITIAL)},
    # evotune - sample on new_valid: +1, +2, +3, +4, +5 and one zero (pinn 12)
    "evotune": {b: (2 + (i + 1 if b != ("pinn", 12) else 0), 0) for i, b in enumerate(INITIAL)},
    # evodpo = evotune on every block: six zero differences
    "evodpo": {},
    # atlas - evodpo: +1 .. +6, but pinn 12 ran on another secret (its seed scores differ)
    "atlas": {},
}
BLOCKS["evodpo"] = dict(BLOCKS["evotune"])
BLOCKS["atlas"] = {b: (nv + i + 1, 0) for i, (b, (nv, _)) in enumerate(BLOCKS["evodpo"].items())}


@pytest.fixture
def runs() -> list[dict[str, Any]]:
    out = []
    for method, blocks in BLOCKS.items():
        for (task, seed), (nv, above) in blocks.items():
            r = result(task, method, seed, nv, above)
            if (method, task, seed) == ("atlas", "pinn", 12):
                r["initial_score"] = -0.31  # another secret
            out.append(r)
    return out


PRE = Preregistration(experiment="study", tasks=("bandit", "pinn"), seeds=SEEDS,
                      arms=verdict.PREREGISTRATION.arms, family=verdict.PREREGISTRATION.family)


def test_the_endpoint_pools_phases_3_and_4_per_run() -> None:
    r = result("bandit", "atlas", 10, new_valid=5, above=3)
    assert NEW_VALID.value(r) == 5 / 16 and ABOVE_PARENTS.value(r) == 3 / 16
    # phase 3: 1 of 8; phase 4: 4 of 4 proposals -> 5 / 12, not the mean of the two rates
    r["novelty"]["by_phase"][3]["agent"]["proposals"] = 4
    assert NEW_VALID.value(r) == 5 / 12
    assert Endpoint("all phases", "new_valid", phases=(1, 2, 3, 4)).value(r) == (8 + 8 + 5) / 28
    # a record from before the count existed, or without proposals there: no value
    del r["novelty"]["by_phase"][2]["agent"]["beats_parents"]
    assert ABOVE_PARENTS.value(r) is None
    assert NEW_VALID.value({"novelty": {"by_phase": []}}) is None


def test_the_family_by_hand_with_ties_holm_and_a_block_left_out(runs: list[dict[str, Any]]
                                                                 ) -> None:
    rows = {r["question"]: r for r in verdict.family(runs, PRE)}
    assert list(rows) == [c.question for c in PRE.family]
    llm = rows["does the LLM beat blind tuning?"]
    # above parents: sample 1, 3, 5, ... against random_literals 0, 1, 2, ...: diffs 1..6 / 16
    assert llm["n"] == 6 and llm["diffs"] == pytest.approx([d / 16 for d in (1, 2, 3, 4, 5, 6)])
    assert llm["p_signed_rank"] == pytest.approx(2 / 64) and llm["ties"] == {"zero": 0, "tied": 0}
    tuned = rows["does fine-tuning help?"]
    # diffs 1..5 / 16 and a zero (pinn 12): the zero is dropped -> 5 positive pairs, 2/32
    assert tuned["n"] == 6 and tuned["ties"] == {"zero": 1, "tied": 0}
    assert tuned["p_signed_rank"] == pytest.approx(0.0625) and tuned["wins"] == 5
    ref = rows["does the evolving reference help?"]
    assert ref["ties"] == {"zero": 6, "tied": 0} and ref["p_signed_rank"] == 1.0
    atlas = rows["does ATLAS help?"]
    # pinn 12 is left out (another secret): 5 positive blocks -> 2/32
    assert atlas["n"] == 5 and atlas["p_signed_rank"] == pytest.approx(0.0625)
    assert [(x["task"], x["seed"]) for x in atlas["left_out"]] == [("pinn", 12)]
    assert atlas["left_out"][0]["reason"].startswith("secrets differ: initial_score")
    assert "pinn s12" not in atlas["blocks"] and len(atlas["blocks"]) == 5
    # Holm over m = 4: sorted 1/32 (x4 = 0.125), 1/16 (x3 = 0.1875), 1/16 (x2 -> 0.1875), 1 (x1)
    assert [rows[q]["p_holm"] for q in rows] == pytest.approx([0.125, 0.1875, 1.0, 0.1875])
    assert all(r["family_size"] == 4 for r in rows.values())


def test_runs_outside_the_study_and_unfinished_runs_never_enter_it(runs: list[dict[str, Any]]
                                                                   ) -> None:
    dev = [dict(r, seed=3) for r in runs if r["seed"] == 10]  # a development seed
    other = [dict(r, experiment="cpu") for r in runs]
    assert all(r["n"] == 0 for r in verdict.family(dev + other, PRE))
    cut = [dict(r, complete=False) if (r["method"], r["task"], r["seed"]) == ("sample", "bandit", 11)
           else r for r in runs]
    llm = verdict.family(cut, PRE)[0]
    assert llm["n"] == 5 and llm["left_out"] == [{"task": "bandit", "seed": 11,
                                                  "reason": "sample unfinished"}]
    missing = [r for r in runs if (r["method"], r["seed"]) != ("random_literals", 12)]
    assert verdict.left_out_summary(verdict.family(missing, PRE)[0]) == "2 no random_literals run"


def test_the_per_task_rows_and_the_endpoint_means_are_rates_inside_zero_and_one(
        runs: list[dict[str, Any]]) -> None:
    per_task = verdict.by_task(runs, PRE)
    assert len(per_task) == 8 and {r["task"] for r in per_task} == {"bandit", "pinn"}
    bandit_llm = next(r for r in per_task if r["task"] == "bandit"
                      and r["question"] == "does the LLM beat blind tuning?")
    assert bandit_llm["diffs"] == pytest.approx([1 / 16, 2 / 16, 3 / 16])
    means = verdict.endpoint_means(runs, PRE)
    assert len(means) == 2 * 5 * 2  # tasks x arms x the family's two endpoints
    assert all(0.0 <= r["lo"] <= r["mean"] <= r["hi"] <= 1.0 for r in means if r["n"] > 1
               and r["std"] > 0)
    sample = next(r for r in means if (r["task"], r["method"]) == ("bandit", "sample")
                  and r["endpoint"] == ABOVE_PARENTS.label)
    assert sample["mean"] == pytest.approx((1 + 3 + 5) / 3 / 16)


def test_a_preregistration_holds_at_most_four_named_arms_and_questions() -> None:
    c = PRE.family
    with pytest.raises(ValueError, match=r"Preregistration.family: 5 comparisons"):
        Preregistration("study", ("bandit",), SEEDS, PRE.arms,
                        (*c, Comparison("and more?", "atlas", "sample", NEW_VALID)))
    with pytest.raises(ValueError, match=r"family\[1\].b: 'smaple' is not one of arms"):
        Preregistration("study", ("bandit",), SEEDS, PRE.arms,
                        (c[0], Comparison("does fine-tuning help?", "evotune", "smaple", NEW_VALID)))
    with pytest.raises(ValueError, match=r"Preregistration.alpha: 1.5 is not a level"):
        Preregistration("study", ("bandit",), SEEDS, PRE.arms, c, alpha=1.5)
    with pytest.raises(ValueError, match="two comparisons ask one question"):
        Preregistration("study", ("bandit",), SEEDS, PRE.arms, (c[1], c[1]))
    assert len(verdict.PREREGISTRATION.family) == 4
    assert verdict.PREREGISTRATION.seeds == tuple(range(10, 20))


def test_a_block_on_two_secrets_is_named_by_each_piece_of_evidence(runs: list[dict[str, Any]]
                                                                   ) -> None:
    blocks = {(b["task"], b["seed"]): b for b in pairing.blocks(runs)}
    assert len(blocks) == 6 and blocks[("bandit", 10)]["conflicts"] == []
    (why,) = blocks[("pinn", 12)]["conflicts"]
    assert why.startswith("initial_score -0.23 (") and "-0.31 (atlas)" in why
    (line,) = pairing.warnings(list(blocks.values()))
    assert line.startswith("warning: pinn seed 12: its arms did not face one task secret")
    # the same seed score, but another secret file (no fingerprint to settle it) ...
    a, b = runs[0], dict(runs[0], method="sample",
                         secret={"secret_file": None, "secret_fingerprint": None})
    assert pairing.conflicts([a, b]) == [
        "sandbox.secret_file multirun/study/.task_secret_s10 (random_literals) / "
        "none (a fresh secret) (sample)"]
    # ... and one secret read from two paths: the fingerprints settle it
    same = {"secret_fingerprint": "ab" * 8}
    assert pairing.conflicts([dict(a, secret={**same, "secret_file": "x"}),
                              dict(b, secret={**same, "secret_file": "y"})]) == []
    other = dict(b, secret={"secret_fingerprint": "cd" * 8, "secret_file": "x"})
    assert pairing.conflicts([dict(a, secret={**same, "secret_file": "x"}), other])[0].startswith(
        "secret fingerprint")


def test_secret_evidence_reads_the_config_and_fingerprints_the_folders_secret(tmp_path: Path
                                                                              ) -> None:
    cfg = {"sandbox": {"secret_file": "multirun/study/.task_secret_s10"}}
    assert pairing.secret_evidence(tmp_path, cfg) == {
        "secret_file": "multirun/study/.task_secret_s10", "secret_fingerprint": None}
    (tmp_path / ".task_secret").write_text("5eed" * 16 + "\n")
    ev = pairing.secret_evidence(tmp_path, {})
    assert ev["secret_file"] is None and len(ev["secret_fingerprint"] or "") == 16
    assert "5eed" not in json.dumps(ev)  # a hash, never the secret
    # the run's own record wins: an archived folder no longer holds its secret
    assert pairing.secret_evidence(tmp_path, {}, "0123456789abcdef")["secret_fingerprint"] == \
        "0123456789abcdef"
    assert ev["secret_fingerprint"] == fingerprint("5eed" * 16)
