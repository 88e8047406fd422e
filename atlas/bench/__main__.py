"""Dispatch ``python -m atlas.bench <name> [args]`` to ``atlas.bench.<name>.main(args)``."""

from __future__ import annotations

import importlib
import sys

BENCHES = {"accept": "atlas.bench.accept", "agent": "atlas.bench.agent",
           "decode": "atlas.bench.decode", "dpo": "atlas.bench.dpo",
           "engine": "atlas.bench.engine", "gate": "atlas.bench.gate", "learn": "atlas.bench.learn",
           "paper": "atlas.bench.paper", "prompts": "atlas.bench.prompts",
           "parity": "atlas.bench.parity", "pinn": "atlas.bench.pinn",
           "sampler": "atlas.bench.sampler",
           "supporters": "atlas.bench.supporters"}


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in BENCHES:
        sys.exit(f"usage: python -m atlas.bench {{{'|'.join(BENCHES)}}} [options]")
    importlib.import_module(BENCHES[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    main()
