"""Bin-packing instance sets: FunSearch's generated Weibull sets and OR-Library files.

Why generated, not downloaded: the Weibull sets are defined by their distribution (FunSearch,
Nature 2023: shape 3, scale 45, rounded, clipped to [1, 100], capacity 100), so fixed seeds
make them reproducible offline; OR-Library files (binpack1..8) are read from a path the user
gives. ``write_orlib`` writes the same format (tests, and OR3-like uniform sets).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from atlas.sandbox.secret import derive_seed


@dataclass(frozen=True)
class Instance:
    """One online bin-packing problem: items arrive in order, bins hold ``capacity``."""

    name: str
    capacity: float
    items: tuple[float, ...]

    @property
    def l1_bound(self) -> int:
        """ceil(sum(items) / capacity): no packing uses fewer bins (FunSearch's ``l1_bound``)."""
        return int(math.ceil(math.fsum(self.items) / self.capacity - 1e-9))

    def to_json(self) -> dict[str, object]:
        """Plain JSON for the sandbox (integral sizes stay ints)."""
        return {"name": self.name, "capacity": _num(self.capacity),
                "items": [_num(x) for x in self.items]}

    @classmethod
    def from_json(cls, data: dict) -> Instance:
        return cls(str(data["name"]), float(data["capacity"]),
                   tuple(float(x) for x in data["items"]))


def _num(x: float) -> float | int:
    return int(x) if float(x).is_integer() else float(x)


def check_instance(inst: Instance, where: str) -> Instance:
    """ValueError naming the instance unless every item is in (0, capacity]."""
    if not (math.isfinite(inst.capacity) and inst.capacity > 0):
        raise ValueError(f"{where}: instance {inst.name!r} has capacity {inst.capacity!r}; "
                         f"it must be a positive number")
    if not inst.items:
        raise ValueError(f"{where}: instance {inst.name!r} has no items")
    bad = next((x for x in inst.items if not (math.isfinite(x) and 0 < x <= inst.capacity)),
               None)
    if bad is not None:
        raise ValueError(f"{where}: instance {inst.name!r} has item {bad!r}; every item must "
                         f"be in (0, capacity={inst.capacity:g}]")
    return inst


def weibull_instances(count: int = 5, n_items: int = 5000, *, shape: float = 3.0,
                      scale: float = 45.0, capacity: int = 100, seed: int = 0,
                      secret: str | None = None, program: str | None = None) -> list[Instance]:
    """FunSearch's Weibull sets: sizes ~ scale * Weibull(shape), rounded, clipped to
    [1, capacity]. Without ``secret`` instance k draws from ``default_rng([seed, k])``: public
    and fixed (the baselines command, FunSearch's table). With a run's secret it draws from a
    seed derived from the secret, ``seed`` and k, so a candidate cannot regenerate the scored
    set and carry an offline packing of it; with a ``program`` key
    (``atlas.sandbox.inputs.program_key``) also from the program, so items one candidate saw
    and relayed are not the next one's."""
    out = []
    for k in range(count):
        rng = np.random.default_rng(
            [seed, k] if secret is None
            else derive_seed(secret, "binpacking-weibull", seed, k,
                             *(() if program is None else (program,))))
        sizes = np.clip(np.round(scale * rng.weibull(shape, n_items)), 1, capacity)
        name = f"weibull_{n_items}_{seed}_{k}" + ("" if secret is None else "_hidden")
        out.append(Instance(name, float(capacity), tuple(float(x) for x in sizes)))
    return out


def uniform_instances(count: int = 20, n_items: int = 500, *, low: int = 20, high: int = 100,
                      capacity: int = 150, seed: int = 0) -> list[Instance]:
    """Integer sizes uniform in [low, high]: the distribution of OR-Library's binpack1-4
    (binpack3 = u500: 20 x 500 items, capacity 150). Not the OR3 file itself."""
    out = []
    for k in range(count):
        rng = np.random.default_rng([seed, 1000 + k])
        sizes = rng.integers(low, high + 1, n_items)
        out.append(Instance(f"u{n_items}_{k:02d}", float(capacity),
                            tuple(float(x) for x in sizes)))
    return out


def read_orlib(path: str | Path) -> list[Instance]:
    """Parse an OR-Library bin-packing file: the number of problems P, then per problem its
    name, a line ``capacity item-count best-known``, and the items one per line."""
    path = Path(path)
    try:
        tokens = path.read_text().split()
    except OSError as exc:
        raise ValueError(f"task.instances={str(path)!r} cannot be read ({exc.strerror}); give "
                         f"an OR-Library file (binpack1.txt..binpack8.txt format) or 'weibull'"
                         ) from None
    where = f"task.instances={str(path)!r}"
    pos = 0

    def take(what: str) -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise ValueError(f"{where}: the file ends where {what} should be; expected the "
                             f"OR-Library format (P, then per problem: name, 'capacity n "
                             f"best-known', n item sizes)")
        pos += 1
        return tokens[pos - 1]

    def number(what: str, text: str) -> float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{where}: {what} is {text!r}, not a number") from None

    problems = number("the problem count", take("the problem count"))
    if not problems.is_integer() or problems < 1:
        raise ValueError(f"{where}: the problem count is {problems:g}; it must be an integer >= 1")
    out = []
    for p in range(int(problems)):
        name = take(f"the name of problem {p + 1}")
        capacity = number(f"{name}'s capacity", take(f"{name}'s capacity"))
        n = number(f"{name}'s item count", take(f"{name}'s item count"))
        take(f"{name}'s best-known bin count")
        if not n.is_integer() or n < 1:
            raise ValueError(f"{where}: {name}'s item count is {n:g}; it must be an integer >= 1")
        items = tuple(number(f"an item of {name}", take(f"item {i + 1} of {name}"))
                      for i in range(int(n)))
        out.append(check_instance(Instance(name, capacity, items), where))
    if pos != len(tokens):
        raise ValueError(f"{where}: {len(tokens) - pos} value(s) after the last of the "
                         f"{int(problems)} problems; is the problem count on the first line right?")
    return out


def write_orlib(path: str | Path, instances: Sequence[Instance]) -> Path:
    """Write ``instances`` in the OR-Library format; the best-known column holds the L1
    bound (a generated set has no known optimum)."""
    lines = [f" {len(instances)}"]
    for inst in instances:
        lines += [f" {inst.name}", f" {_num(inst.capacity)} {len(inst.items)} {inst.l1_bound}"]
        lines += [f"{_num(x)}" for x in inst.items]
    path = Path(path)
    path.write_text("\n".join(lines) + "\n")
    return path


def excess_pct(bins_used: Sequence[int], instances: Sequence[Instance]) -> float:
    """FunSearch's score: (mean bins used - mean L1 bound) / mean L1 bound, in percent."""
    used = math.fsum(bins_used) / len(bins_used)
    bound = math.fsum(i.l1_bound for i in instances) / len(instances)
    return 100.0 * (used - bound) / bound
