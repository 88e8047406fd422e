"""How far a run's model work is above this machine's arithmetic floor (docs/results.md, "The
main command on AVX2 in fp32: the arithmetic floor").

    python scripts/compute_floor.py <run dir> [--dtype float32]

Measures the machine's matrix-multiply rate at SmolLM2's layer shapes
(``torch.nn.functional.linear``, 2 threads, ``--dtype``, the best of five timings), counts
the multiply-adds each part of the run had to do at the least (from its ``events.jsonl`` and
``programs.jsonl``), and prints each part's floor (that work at that rate) beside its
measured seconds:

- generation: each prompt token once through the decoder layers, each generated token once
  through the layers and the LM head (what any sampler must compute; guessed tokens that were
  not kept, and attention, are not counted);
- DPO: the tokens each step ran, twice through the decoder layers (the forward and the
  backward to the inputs the LoRA factors need; the LM head, attention and the reference
  table are not counted);
- the gate: per item, its prompt through the decoder layers and each distinct completion
  through the layers and the LM head, once per candidate of C_k and once for the reference
  (attention not counted).

Every count leaves something out, so each floor is a lower bound: no implementation on this
machine and at this rate does the run's work in less. Run it with nothing else running; under
``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`` it measures
the AVX2 kernels.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from atlas.bench.floor import SMOLLM2, linear_rate, macs_per_token


def parts(run: Path, tokenizer, dims: dict[str, int] = SMOLLM2, max_length: int = 768
          ) -> list[tuple[str, float, float]]:
    """(part, least multiply-adds, measured seconds) for each part of a run."""
    from atlas.dpo.prefix import encode_group

    body, head = macs_per_token(dims)
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    programs = {r["id"]: r for r in map(json.loads, (run / "programs.jsonl").open())}
    rounds = [e for e in events if e["event"] == "round"]
    rows = [("generation, all rounds",
             sum(e["sampler"]["prompt_tokens"] * body
                 + e["sampler"]["new_tokens"] * (body + head) for e in rounds),
             sum(e["seconds"]["generate"] for e in rounds))]
    for e in events:
        if e["event"] != "phase" or "dpo" not in e:
            continue
        k = e["phase"]
        rows.append((f"DPO phase {k}", 2 * e["dpo"]["tokens"] * body,
                     e["seconds_dpo"] - e["dpo"].get("reference_table_seconds", 0.0)))
        gate = e.get("gate") or {}
        policies = len(gate.get("candidates", [])) + 1
        work = 0
        for ids in gate.get("evidence", {}).get("program_ids", []):
            texts = list(dict.fromkeys(programs[j]["completion"] for j in ids))
            group = encode_group(tokenizer, programs[ids[0]]["prompt"], texts, max_length)
            work += policies * (len(group.prompt) * body
                                + sum(len(c) for c in group.completions) * (body + head))
        rows.append((f"gate phase {k} ({policies} policies)", work,
                     e["seconds_gate_parts"]["pass"]))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a run folder (events.jsonl, programs.jsonl)")
    ap.add_argument("--dtype", default="float32", help="float32 | bfloat16")
    ap.add_argument("--max-length", type=int, default=768, help="gate.max_length of the run")
    args = ap.parse_args()

    import torch

    from atlas.agent.model import shipped_tokenizer
    from atlas.bench.machine import bench_model_cfg
    from atlas.schema import ModelConfig

    torch.set_num_threads(2)
    tok = shipped_tokenizer(ModelConfig.from_cfg(bench_model_cfg("smollm2")))
    rate = linear_rate(args.dtype)
    print(f"{torch.backends.cpu.get_cpu_capability()} kernels, {args.dtype}, 2 threads: "
          f"{2 * rate / 1e9:.0f} GFLOP/s (median over SmolLM2's linear shapes)")
    rows = parts(args.run, tok, max_length=args.max_length)
    print(f"{'part':32s} {'GMAC':>8s} {'floor s':>8s} {'measured s':>10s} {'x floor':>8s}")
    for name, work, seconds in rows:
        floor = work / rate
        print(f"{name:32s} {work / 1e9:8.0f} {floor:8.1f} {seconds:10.1f} {seconds / floor:8.2f}")
    total = sum(w for _, w, _ in rows) / rate
    print(f"{'all of the above':32s} {'':8s} {total:8.1f} {sum(s for *_, s in rows):10.1f}")


if __name__ == "__main__":
    main()
