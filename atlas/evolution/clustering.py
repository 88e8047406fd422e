"""Clustering of an island's programs by *what the code does*, not by its constants.

Why: the paper's coverage signal (2.1) is meant to catch mode collapse, i.e. an island whose
buffer is full of one algorithm with different hyper-parameters. So the signature abstracts
away everything a hyper-parameter sweep changes (numeric/string constants, local variable
names) and keeps the structure (AST node types) and the vocabulary of operations (attribute
names such as ``argmax``/``linalg``, and builtin calls such as ``max``/``sum``).

Rule (deterministic for a given insertion order, which the explorer keeps fixed):
- a program's features are the multiset of those tokens;
- similarity of two programs is the weighted Jaccard ``sum(min) / sum(max)`` of the multisets;
- *leader clustering*: a new program joins the most similar existing cluster leader if the
  similarity is >= ``threshold``; otherwise it founds a new cluster while the island has fewer
  than ``max_clusters``; once the cap is hit it joins the most similar cluster regardless.
Failed programs are not clustered (label ``FAILED``); clusters are over passed candidates.
"""

from __future__ import annotations

import ast
import builtins
from collections import Counter
from dataclasses import dataclass, field

from atlas.evolution.extract import parse

FAILED = "failed"  # cluster label of programs that did not pass evaluation
UNPARSED = "unparsed"  # cluster label of passed code that ast cannot parse (should not happen)

_BUILTINS = frozenset(dir(builtins))


def code_features(code: str) -> Counter[str] | None:
    """Structural token multiset of ``code``; ``None`` when it does not parse."""
    tree = parse(code)
    if tree is None:
        return None
    tokens: Counter[str] = Counter()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Load, ast.Store, ast.Del, ast.expr_context)):
            continue
        tokens[type(node).__name__] += 1
        if isinstance(node, ast.Attribute):
            tokens["." + node.attr] += 1
        elif isinstance(node, ast.Name) and node.id in _BUILTINS:
            tokens["builtin:" + node.id] += 1
        elif isinstance(node, ast.Constant):
            tokens["const:" + type(node.value).__name__] += 1
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                tokens["import:" + alias.name] += 1
    return tokens


def similarity(a: Counter[str], b: Counter[str]) -> float:
    """Weighted Jaccard similarity in [0, 1] (1 = same structure and vocabulary)."""
    keys = a.keys() | b.keys()
    num = sum(min(a[k], b[k]) for k in keys)
    den = sum(max(a[k], b[k]) for k in keys)
    return 1.0 if den == 0 else num / den


@dataclass
class IslandClusters:
    """The cluster leaders of one island; ``assign`` files a program's code into a cluster."""

    max_clusters: int
    threshold: float  # explore.cluster_similarity
    leaders: dict[str, str] = field(default_factory=dict)  # cluster id -> leader code
    _features: dict[str, Counter[str]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.max_clusters < 1:
            raise ValueError(f"max_clusters must be >= 1, got {self.max_clusters} "
                             "(config field explore.clusters)")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"cluster similarity threshold must be in (0, 1], got "
                             f"{self.threshold} (config field explore.cluster_similarity)")
        for cid, code in self.leaders.items():
            feats = code_features(code)
            self._features[cid] = feats if feats is not None else Counter()

    def assign(self, code: str) -> str:
        """Cluster id for ``code`` (founding a new cluster if the rule says so)."""
        feats = code_features(code)
        if feats is None:
            return UNPARSED
        best_id, best_sim = None, -1.0
        for cid, lead in self._features.items():  # insertion order: ties go to the older one
            sim = similarity(feats, lead)
            if sim > best_sim:
                best_id, best_sim = cid, sim
        if best_id is not None and (best_sim >= self.threshold
                                    or len(self.leaders) >= self.max_clusters):
            return best_id
        cid = f"c{len(self.leaders)}"
        self.leaders[cid] = code
        self._features[cid] = feats
        return cid
