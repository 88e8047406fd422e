"""Online bin packing: FunSearch's semantics, its published baselines, the scorer's checks."""

from __future__ import annotations

import numpy as np
import pytest

from atlas.sandbox import Resources, Sandbox
from atlas.sandbox.candidate import CandidateError
from atlas.sandbox.inputs import program_key
from atlas.tasks import make_task
from atlas.tasks.binpacking import BinPackingTask
from atlas.tasks.binpacking.baselines import (
    best_fit,
    first_fit,
    funsearch_weibull,
    instance_sets,
    main,
)
from atlas.tasks.binpacking.evaluator import (
    online_pack,
    online_pack_plain,
    replay,
    score_priority,
)
from atlas.tasks.binpacking.instances import (
    Instance,
    read_orlib,
    uniform_instances,
    weibull_instances,
    write_orlib,
)
from atlas.types import FailureKind

SECRET = "ab" * 32


def last_fit(item: float, bins: np.ndarray) -> np.ndarray:
    """Position-dependent: the last bin the item fits in (an untouched bin far right)."""
    return np.arange(len(bins), dtype=float)


@pytest.mark.parametrize("priority", [first_fit, best_fit, funsearch_weibull, last_fit])
def test_fast_loop_is_funsearchs_loop(priority) -> None:
    for inst in (*weibull_instances(2, 400, seed=3), *uniform_instances(2, 300)):
        fast = online_pack(priority, inst.items, inst.capacity)
        assert (fast == online_pack_plain(priority, inst.items, inst.capacity)).all()


def test_bins_used_and_excess_by_hand() -> None:
    inst = Instance("tiny", 10.0, (6.0, 5.0, 4.0, 5.0))
    # first fit: [6,4] [5,5]; best fit: 6->b0, 5->b1, 4->b0 (fills it), 5->b1
    assert online_pack(first_fit, inst.items, 10.0).tolist() == [0, 1, 0, 1]
    assert replay(inst, [0, 1, 0, 1])[0] == 2 and inst.l1_bound == 2
    # last fit: 6->b3 (4 left), 5->b2 (b3 too small), 4->b3 (last it fits), 5->b2
    assert online_pack(last_fit, inst.items, 10.0).tolist() == [3, 2, 3, 2]
    pair = Instance("pair", 10.0, (6.0, 4.0))  # worst fit opens a second bin: 2 vs L1 bound 1
    score, metrics = score_priority(lambda item, bins: bins, [pair])
    assert metrics["bins_used"] == 2 and metrics["l1_bound"] == 1
    assert metrics["excess_pct"] == pytest.approx(100.0) and score == pytest.approx(-100.0)


def test_replay_refuses_invalid_packings() -> None:
    inst = Instance("tiny", 10.0, (6.0, 5.0, 4.0))
    with pytest.raises(CandidateError, match="not a valid packing") as err:
        replay(inst, [0, 0, 1])  # 6 + 5 > 10
    assert err.value.kind == FailureKind.TAMPERED
    for forged in ([0, 1], [0, 1, 3], [0, 1, True], "0 1 0", [0.0, 1, 0]):
        with pytest.raises(CandidateError, match="not 3 bin indices"):
            replay(inst, forged)


def test_baselines_reproduce_funsearch_table() -> None:
    """Our generated sets are not FunSearch's files: numbers near Table 1, pinned exactly."""
    sets = instance_sets()
    weibull, or_like = (sets[k] for k in sets)
    ff_w, bf_w = (score_priority(f, weibull)[1]["excess_pct"] for f in (first_fit, best_fit))
    ff_o, bf_o = (score_priority(f, or_like)[1]["excess_pct"] for f in (first_fit, best_fit))
    assert ff_w == pytest.approx(4.39, abs=0.005) and bf_w == pytest.approx(4.08, abs=0.005)
    assert abs(ff_w - 4.23) < 0.25 and abs(bf_w - 3.98) < 0.25  # FunSearch Table 1, Weibull 5k
    assert ff_o == pytest.approx(5.56, abs=0.005) and bf_o == pytest.approx(4.96, abs=0.005)
    assert bf_w < ff_w and bf_o < ff_o


def test_funsearch_heuristic_beats_best_fit_on_weibull() -> None:
    insts = weibull_instances(1, 2000, seed=7)
    fs = score_priority(funsearch_weibull, insts)[1]["excess_pct"]
    bf = score_priority(best_fit, insts)[1]["excess_pct"]
    print(f"FunSearch {fs:.2f} %, best fit {bf:.2f} %")
    assert fs < 2.0 < 3.5 < bf  # Table 1 on 5k items: 0.68 % vs 3.98 %


def test_orlib_round_trip_and_task_instances(tmp_path) -> None:
    path = write_orlib(tmp_path / "or3like.txt", uniform_instances(3, 50))
    text = path.read_text().split("\n")
    assert text[0].strip() == "3" and text[1].strip() == "u50_00"
    assert text[2].split()[:2] == ["150", "50"]
    insts = read_orlib(path)
    assert insts == uniform_instances(3, 50)
    task = make_task("binpacking", instances=str(path))
    assert len(task.instances) == 3 and task.evaluator_config()["instances"][0]["capacity"] == 150
    assert task.instance_set_label().endswith("(3 instances)")
    # floats (binpack5-8 triplets) parse too
    (tmp_path / "t.txt").write_text(" 1\n t3_00\n 100.0 3 1\n20.5\n39.5\n40.0\n")
    assert read_orlib(tmp_path / "t.txt")[0].items == (20.5, 39.5, 40.0)


@pytest.mark.parametrize("content,message", [
    (" 2\n a\n 10 1 1\n5\n", "ends where the name of problem 2"),
    (" 1\n a\n 10 1 1\n12\n", "item 12.0; every item must be in"),
    (" 1\n a\n 10 2 1\nx\n3\n", "an item of a is 'x'"),
    (" 1\n a\n 10 1 1\n5\n6\n", "after the last of the 1 problems"),
])
def test_orlib_errors_name_the_problem(tmp_path, content: str, message: str) -> None:
    (tmp_path / "bad.txt").write_text(content)
    with pytest.raises(ValueError, match="task.instances=") as err:
        make_task("binpacking", instances=str(tmp_path / "bad.txt"))
    assert message in str(err.value)


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"task\.weibul_count"):
        BinPackingTask(weibul_count=3)
    with pytest.raises(ValueError, match=r"task\.weibull_items"):
        BinPackingTask(weibull_items=0)
    with pytest.raises(ValueError, match="cannot be read"):
        BinPackingTask(instances="/nonexistent/binpack3.txt")
    assert BinPackingTask(timeout_s=5).timeout_s == 5.0


RANDOM = "import numpy as np\n\ndef priority(item, bins):\n    return np.random.random(len(bins))\n"
NAN = "import numpy as np\n\ndef priority(item, bins):\n    return (bins - bins) / (bins - bins)\n"
SCALAR = "def priority(item, bins):\n    return 1.0\n"


def test_sandbox_scores_checks_and_audits() -> None:
    task = BinPackingTask(weibull_count=2, weibull_items=300, audit_steps=8)
    with Sandbox.for_task(task, secret=SECRET, resources=Resources(workers=1)) as sb:
        seed, rnd, nan, scalar = sb.evaluate_many(
            [task.seed_program(), RANDOM, NAN, SCALAR], task.context(0))
    assert seed.passed, seed.message
    # the seed's own instances (drawn from the secret and its program key)
    expected, metrics = score_priority(
        best_fit, task.scored_instances(SECRET, program_key(task.seed_program())))
    assert seed.score == pytest.approx(expected, abs=1e-12) and seed.score < 0
    assert seed.metrics["bins_used"] == metrics["bins_used"]
    assert seed.metrics["audited_steps"] == 8
    assert rnd.failure_kind == "wrong_return" and "pure function" in rnd.message
    assert nan.failure_kind == "wrong_return" and "NaN" in nan.message
    assert scalar.failure_kind == "wrong_return" and "shape" in scalar.message


def test_baselines_command_prints_both_sets(capsys, tmp_path) -> None:
    main(["--write-or", str(tmp_path / "or.txt")])
    assert len(read_orlib(tmp_path / "or.txt")) == 20
    assert "wrote" in capsys.readouterr().out
