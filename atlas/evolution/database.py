"""The six-island program database (paper 2.1): per-island buffers, clusters, coverage-aware top-k.

Layout:
- an *archive* of every program ever added (passed or failed), for telemetry, preference
  data and resume;
- per island, a *buffer* of at most ``buffer_size`` passed programs, each labelled with a
  cluster (see ``clustering``); failed programs never take buffer slots.

Eviction (when a buffer overflows) removes the lowest-scoring program among clusters that have
more than one member in the buffer, so a cluster keeps its last representative as long as
possible; only when every cluster is a singleton does the globally worst program go.

Coverage-aware count-based top-k (``select_top_k``), the rule the paper describes as
"prioritise candidates that preserve diverse coverage rather than concentrating on a single
mode":
1. rank passed programs by score (ties: older id first) and drop exact code duplicates;
2. keep the *pool* of the best ``max(k, ceil(pool_factor * k))`` of them ("high scorers");
3. walk the pool best-first and take each program whose cluster is not yet represented;
4. fill the remaining slots from the pool best-first.
So a lower-scored program from a new cluster beats a duplicate of a covered cluster, but
only if it is inside the pool: diversity never pulls in a program outside the top
``pool_factor * k``. The result is returned best first.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from atlas.evolution.clustering import FAILED, IslandClusters
from atlas.novelty import NoveltyIndex, beats_parents
from atlas.schema import ExploreConfig
from atlas.types import Program, ProgramSource

STATE_VERSION = 1


def _rank_key(p: Program) -> tuple[float, int]:
    return (-p.score, p.id)


def select_top_k(programs: Iterable[Program], k: int, pool_factor: float = 2.0) -> list[Program]:
    """Coverage-aware count-based top-k passed programs (rule in the module docstring)."""
    if k < 0:
        raise ValueError(f"top_k must be >= 0, got {k} (config field dpo.top_k or "
                         "explore.programs_in_prompt)")
    if pool_factor < 1.0:
        raise ValueError(f"pool_factor must be >= 1, got {pool_factor} "
                         "(config field explore.topk_pool_factor)")
    ranked, seen_code = [], set()
    for p in sorted((p for p in programs if p.passed and math.isfinite(p.score)), key=_rank_key):
        key = p.code.strip()
        if key in seen_code:
            continue
        seen_code.add(key)
        ranked.append(p)
    pool = ranked[:max(k, math.ceil(pool_factor * k))]
    picked: list[Program] = []
    covered: set[str] = set()
    for p in pool:
        if len(picked) < k and p.cluster not in covered:
            covered.add(p.cluster)
            picked.append(p)
    taken = {id(p) for p in picked}
    for p in pool:
        if len(picked) < k and id(p) not in taken:
            picked.append(p)
    return sorted(picked, key=_rank_key)


class ProgramDatabase:
    """Independent island populations with clustering and coverage tracking."""

    def __init__(self, settings: ExploreConfig, seed: int = 0,
                 entry_point: str | None = None) -> None:
        """``settings``: the ``explore`` group (islands, buffer_size, clusters,
        topk_pool_factor, cluster_similarity; their bounds are the schema's).
        ``entry_point``: the task's, so novelty ignores code it never reaches."""
        self.num_islands = settings.islands
        self.buffer_size = settings.buffer_size
        self.max_clusters = settings.clusters
        self.seed = seed  # stored for resume checks; the database itself is deterministic
        self.pool_factor = settings.topk_pool_factor
        self.cluster_similarity = settings.cluster_similarity
        self._clusters = [IslandClusters(self.max_clusters, self.cluster_similarity)
                          for _ in range(self.num_islands)]
        self._buffers: list[list[Program]] = [[] for _ in range(self.num_islands)]
        self._archive: list[Program] = []
        self._next_id = 0
        #: (code, regime) -> (archive position, the first program with that code to pass there)
        self._passed: dict[tuple[str, str], tuple[int, Program]] = {}
        self.novelty = NoveltyIndex(entry_point)
        self._by_id: dict[int, Program] = {}

    # ---- ids and filing -------------------------------------------------------------------
    def next_id(self) -> int:
        """A fresh program id (monotonic, survives ``state_dict`` round trips)."""
        i = self._next_id
        self._next_id += 1
        return i

    def _check_island(self, island: int) -> None:
        if not 0 <= island < self.num_islands:
            raise ValueError(f"island {island} out of range [0, {self.num_islands}) "
                             "(explore.islands sets the number of islands)")

    def add(self, program: Program, *, buffer: bool = True) -> None:
        """Archive ``program`` and, if it passed, file it in its island's buffer and cluster
        (``buffer=False``: archive only, e.g. an incumbent re-scored on a new equation)."""
        self._check_island(program.island)
        self._next_id = max(self._next_id, program.id + 1)
        self._label(program)
        if not buffer:
            program.cluster = ""
        elif program.passed and math.isfinite(program.score):
            program.cluster = self._clusters[program.island].assign(program.code)
            buf = self._buffers[program.island]
            buf.append(program)
            if len(buf) > self.buffer_size:
                buf.remove(self._victim(buf))
        else:
            program.cluster = FAILED
        self._remember(program, len(self._archive))
        self._archive.append(program)

    def parents_of(self, program: Program) -> list[Program]:
        """The filed programs its prompt showed."""
        return [self._by_id[i] for i in program.parents if i in self._by_id]

    def copy_of(self, code: str | None, parents: Iterable[Program] = ()) -> int | None:
        """The id of the filed program (or parent) ``code`` repeats (``atlas.novelty``)."""
        return self.novelty.copy_of(code, parents)

    def _label(self, program: Program) -> None:
        """Label a proposal (agent or supporter) against what was filed before it, once."""
        if program.source in (ProgramSource.AGENT, ProgramSource.SUPPORTER) \
                and not program.novelty:
            parents = self.parents_of(program)
            score = program.score if program.passed and math.isfinite(program.score) else None
            behaviour = program.evaluation.behaviour if score is not None else None
            program.novelty = self.novelty.label(program.code, score, program.regime, parents,
                                                 behaviour)
            program.beats_parents = beats_parents(score, program.regime, parents)

    def _remember(self, program: Program, position: int) -> None:
        self._by_id[program.id] = program
        self.novelty.add_program(program)
        if program.code and program.passed and math.isfinite(program.score):
            self._passed.setdefault((program.code, program.regime), (position, program))

    @staticmethod
    def _victim(buf: list[Program]) -> Program:
        counts: dict[str, int] = {}
        for p in buf:
            counts[p.cluster] = counts.get(p.cluster, 0) + 1
        shared = [p for p in buf if counts[p.cluster] > 1]
        return max(shared or buf, key=_rank_key)  # max rank key = lowest score, newest id

    # ---- queries --------------------------------------------------------------------------
    def island(self, i: int) -> list[Program]:
        """The island's buffer (passed programs, insertion order)."""
        self._check_island(i)
        return list(self._buffers[i])

    def top_k(self, island: int, k: int) -> list[Program]:
        """Coverage-aware count-based top-k of the island's buffer, best first."""
        self._check_island(island)
        return select_top_k(self._buffers[island], k, self.pool_factor)

    def select_top_k(self, programs: Iterable[Program], k: int) -> list[Program]:
        """The same rule applied to any list (e.g. one phase's programs of an island)."""
        return select_top_k(programs, k, self.pool_factor)

    def coverage(self, island: int, k: int) -> dict[str, Any]:
        """Clusters represented in the buffer and in the top-k, and their ratio."""
        self._check_island(island)
        in_buffer = {p.cluster for p in self._buffers[island]}
        in_top = {p.cluster for p in self.top_k(island, k)}
        return {"clusters_in_buffer": len(in_buffer), "clusters_in_top_k": len(in_top),
                "ratio": len(in_top) / len(in_buffer) if in_buffer else 0.0,
                "buffer_size": len(self._buffers[island])}

    def best(self, island: int | None = None) -> Program | None:
        """Best passed program overall or of one island (``None`` when nothing passed)."""
        if island is not None:
            self._check_island(island)
        cands = [p for p in self._archive if p.passed and math.isfinite(p.score)
                 and (island is None or p.island == island)]
        return min(cands, key=_rank_key) if cands else None

    def scored(self, code: str, regime: str, among_first: int | None = None) -> Program | None:
        """The first program with exactly ``code`` that passed on ``regime``, looked for
        among the first ``among_first`` programs filed (all when None); None if there is none.
        Its evaluation stands for a copy's: the sandbox seeds a program's randomness by
        regime, so a deterministic scorer gives the copy the same score."""
        hit = self._passed.get((code, regime))
        if hit is None or (among_first is not None and hit[0] >= among_first):
            return None
        return hit[1]

    def all_programs(self) -> list[Program]:
        """Every program ever added (passed and failed), in insertion order."""
        return list(self._archive)

    # ---- regimes: scores compare only on one equation ---------------------------------------
    def origin(self, program: Program) -> Program:
        """The program a re-score measured (a re-score's parent), else ``program`` itself."""
        if program.source == ProgramSource.RESCORE and program.parents:
            return next((q for q in self._archive if q.id == program.parents[0]), program)
        return program

    def best_score(self, regime: str) -> float:
        """Best passed score on the equation ``regime`` (``-inf`` when none passed)."""
        return max((p.score for p in self._archive if p.passed and p.regime == regime),
                   default=-math.inf)

    def incumbents(self, regime: str) -> list[tuple[Program, float]]:
        """The programs to re-score when the equation leaves ``regime``: the seed, the best
        program of any source and the best the agent wrote, each as (the original program,
        its best score on ``regime``), without repeating a program's code."""
        scored = [p for p in self._archive if p.passed and p.regime == regime]
        picks: list[tuple[Program, float]] = []
        for keep in (lambda q: q.source == ProgramSource.SEED, lambda q: True,
                     lambda q: q.source == ProgramSource.AGENT):
            best = max((p for p in scored if keep(self.origin(p))),
                       key=lambda p: (p.score, -p.id), default=None)
            if best is not None and all(best.code != q.code for q, _ in picks):
                picks.append((self.origin(best), best.score))
        return picks

    def __len__(self) -> int:
        return len(self._archive)

    # ---- persistence ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """JSON-able snapshot (non-finite scores become ``null`` via ``Program.to_dict``)."""
        return {
            "version": STATE_VERSION,
            "num_islands": self.num_islands, "buffer_size": self.buffer_size,
            "max_clusters": self.max_clusters, "seed": self.seed,
            "pool_factor": self.pool_factor, "cluster_similarity": self.cluster_similarity,
            "next_id": self._next_id,
            "programs": [p.to_dict() for p in self._archive],
            "buffers": [[p.id for p in buf] for buf in self._buffers],
            "cluster_leaders": [dict(c.leaders) for c in self._clusters],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a snapshot taken by ``state_dict`` (shape settings must match)."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"database state version {state.get('version')!r} is not "
                             f"{STATE_VERSION}; start a fresh run_dir")
        for name in ("num_islands", "buffer_size", "max_clusters"):
            if state[name] != getattr(self, name):
                raise ValueError(f"resumed database has {name}={state[name]} but the config "
                                 f"gives {getattr(self, name)}; use the original explore config "
                                 "or a fresh run_dir")
        programs = [Program.from_dict(d) for d in state["programs"]]
        by_id = {p.id: p for p in programs}
        self._archive = programs
        self._passed = {}
        self.novelty = NoveltyIndex(self.novelty.entry_point)
        self._by_id = {}
        for position, program in enumerate(programs):
            self._remember(program, position)
        self._buffers = [[by_id[i] for i in ids] for ids in state["buffers"]]
        self._clusters = [IslandClusters(self.max_clusters, self.cluster_similarity, dict(lead))
                          for lead in state["cluster_leaders"]]
        self._next_id = int(state["next_id"])
