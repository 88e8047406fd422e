"""Scoring half of the bandit task: play a candidate ``policy`` on the hidden environments.

In the sandbox the task is split across two processes. ``make_scorer(config, secret)`` runs in
the trusted scorer worker: it generates the environments from seeds derived from the run's
secret and the public ``env_seeds`` (so a policy cannot rebuild them from the repository) and
keeps the regret accounting. ``make_runner(config)`` runs in the candidate's single-use
process, which never held the environments: it receives one context matrix per step and
the reward of the arm it chose, over a pipe, and answers with an arm.
``make_evaluator(config)`` plays both halves in one process, for trusted policies only
(baselines, tests). The score is the negative mean (pseudo-)regret, NMR, averaged over the env seeds; the
same ``score_policy`` function scores the baselines, so the baseline table is comparable.

After the hidden environments the scorer has a twin of the program play one public
environment (``public_env``); the arms played there become ``Evaluation.behaviour``, the
fingerprint ``atlas.novelty`` compares (``atlas.sandbox.behaviour``). It is no part of the
score. ``make_evaluator`` gives no fingerprint.

Candidate API: ``policy(contexts, history, t, state) -> int``; ``contexts`` is a fresh read-only
(K, d) copy, ``history`` a list of ``(arm, x, reward)`` that the evaluator appends to after each
step (the same list object, so passing it is O(1)), ``state`` a dict private to one episode.
Candidate exceptions propagate unchanged (the sandbox classifies them).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from hashlib import blake2b
from math import fsum, isfinite, sqrt
from typing import Any

import numpy as np

from atlas.sandbox.behaviour import PUBLIC_SEED, Twin, fingerprint
from atlas.sandbox.candidate import CandidateError, load_candidate
from atlas.sandbox.inputs import inputs_key
from atlas.sandbox.link import Link
from atlas.sandbox.secret import derive_seed
from atlas.tasks.bandit.env import BanditConfig, BanditEnv, make_env
from atlas.types import Evaluation, FailureKind

Policy = Callable[[np.ndarray, list, int, dict], Any]
ENTRY_POINT = "policy"

# Bound at import, before any candidate runs: candidate code shares this process's numpy, and
# a program that reassigns ``np.mean`` or ``np.integer`` must not bend the scoring. Aggregates
# below use ndarray methods, ``tolist`` and ``math.fsum`` for the same reason.
_empty, _arange, _contiguous = np.empty, np.arange, np.ascontiguousarray
_INT_TYPES, _BOOL_TYPES, _INT64 = (int, np.integer), (bool, np.bool_), np.int64


def check_arm(arm: Any, n_arms: int, t: int) -> int:
    """Validate one returned arm; bools and floats are rejected (``True`` is not arm 1)."""
    if isinstance(arm, _BOOL_TYPES) or not isinstance(arm, _INT_TYPES):
        shown = repr(arm)[:60]
        raise CandidateError(FailureKind.WRONG_RETURN,
                             f"policy returned {shown} ({type(arm).__name__}) at step t={t}; "
                             f"it must return an int arm index in [0, {n_arms}), e.g. "
                             f"int(np.argmax(scores))")
    if not 0 <= arm < n_arms:
        raise CandidateError(FailureKind.WRONG_RETURN,
                             f"policy returned arm {int(arm)} at step t={t}; valid arms are "
                             f"0..{n_arms - 1}")
    return int(arm)


def require_finite(name: str, value: float) -> float:
    """Raise NON_FINITE for a NaN/inf score so it never enters the program database."""
    if not isfinite(value):
        raise CandidateError(FailureKind.NON_FINITE, f"{name} is {value} (not finite)")
    return value


def pack_contexts(x: np.ndarray) -> str:
    """One step's (K, d) contexts for the pipe: base64 of their float64 bytes. Exact, like
    JSON numbers, and about ten times cheaper to write and read (a message every step)."""
    return base64.b64encode(_contiguous(x, dtype=np.float64).tobytes()).decode("ascii")


def unpack_contexts(text: str, n_arms: int, dim: int) -> np.ndarray:
    """``pack_contexts``' array again: a fresh, writable (K, d) float64 copy."""
    return unpack_floats(text, n_arms, dim)


def unpack_floats(text: str, *shape: int) -> np.ndarray:
    """Any array ``pack_contexts`` packed, as a fresh, writable float64 array of ``shape``."""
    return np.frombuffer(base64.b64decode(text), dtype=np.float64).reshape(*shape).copy()


def run_episode(policy: Policy, env: BanditEnv) -> np.ndarray:
    """Play one episode of ``env`` with ``policy``; return the (T,) arms it chose."""
    T, K = env.horizon, env.n_arms
    contexts, rewards = env.contexts, env.rewards
    arms = _empty(T, dtype=_INT64)
    history: list[tuple[int, np.ndarray, float]] = []
    state: dict[str, Any] = {}
    for t in range(T):
        x = contexts[t].copy()  # a copy: the candidate may scribble on what it gets
        x.flags.writeable = False
        a = check_arm(policy(x, history, t, state), K, t)
        arms[t] = a
        history.append((a, x[a], float(rewards[t, a])))
    return arms


def _mean(values: np.ndarray) -> float:
    items = values.tolist()
    return fsum(items) / len(items)


def episode_metrics(env: BanditEnv, arms: np.ndarray) -> dict[str, float]:
    """Per-episode numbers: NMR, regret per half, realised reward, optimal-arm rate."""
    T = env.horizon
    if arms.shape != (T,):
        raise ValueError(f"arms must have shape ({T},), got {arms.shape}")
    idx = _arange(T)
    best = env.means.max(axis=1)
    chosen = env.means[idx, arms]
    regret = best - chosen
    half = T // 2
    return {
        "nmr": -_mean(regret),
        "regret_first_half": _mean(regret[:half]),
        "regret_second_half": _mean(regret[half:]),
        "mean_reward": _mean(env.rewards[idx, arms]),
        "optimal_rate": _mean((chosen >= best - 1e-12).astype(float)),
    }


def _fingerprint(envs: Sequence[BanditEnv]) -> str:
    h = blake2b(digest_size=16)
    for env in envs:
        for arr in (env.contexts, env.thetas, env.means, env.rewards):
            h.update(memoryview(_contiguous(arr)).cast("B"))
    return h.hexdigest()


def score_policy(policy_factory: Callable[[BanditEnv], Policy],
                 envs: Sequence[BanditEnv]) -> tuple[float, dict[str, float]]:
    """Score a policy on each env (fresh policy per env); return (mean NMR, metrics).

    ``policy_factory(env)`` returns the callable for that env; candidates ignore ``env``, the
    oracle baseline uses it. Metrics hold ``nmr_seed<k>`` per env seed plus means over seeds.
    """
    return score_arms([(env, run_episode(policy_factory(env), env)) for env in envs])


def score_arms(played: Sequence[tuple[BanditEnv, np.ndarray]]) -> tuple[float, dict[str, float]]:
    """(mean NMR, metrics) of the arms played on each environment."""
    per: list[dict[str, float]] = []
    metrics: dict[str, float] = {}
    for env, arms in played:
        m = episode_metrics(env, arms)
        per.append(m)
        metrics[f"nmr_seed{env.seed}"] = m["nmr"]
    for key in per[0]:
        metrics[key] = fsum(m[key] for m in per) / len(per)
    mu = metrics["nmr"]
    metrics["nmr_std"] = sqrt(fsum((m["nmr"] - mu) ** 2 for m in per) / len(per))
    return metrics["nmr"], metrics


def check_env_seeds(seeds: Any) -> list[int]:
    """Validate ``env_seeds``: a non-empty list of distinct non-negative integers."""
    if (not isinstance(seeds, (list, tuple)) or not seeds
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)):
        raise ValueError(f"task.env_seeds={seeds!r} is invalid: use a non-empty list of "
                         f"non-negative integers, e.g. [0, 1, 2, 3]")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"task.env_seeds={seeds!r} repeats a seed: list each seed once")
    return [int(s) for s in seeds]


def build_envs(config: dict[str, Any], secret: str | None = None,
               program: str | None = None) -> list[BanditEnv]:
    """The evaluation environments named by ``config['env_seeds']``.

    With the run's ``secret`` each public seed only indexes a hidden seed derived from it; the
    environment keeps the public seed as its label (``nmr_seed<k>`` metrics). With a
    ``program`` key (``atlas.sandbox.inputs.program_key``) the hidden seed depends on the
    program too: what one program learns of its environments is worth nothing to another.
    """
    seeds = check_env_seeds(config.get("env_seeds"))
    cfg = BanditConfig.from_mapping(config)
    if secret is None:
        return [make_env(cfg, s) for s in seeds]
    labels: tuple[object, ...] = () if program is None else (program,)
    return [replace(make_env(cfg, derive_seed(secret, "bandit-env", s, *labels)), seed=s)
            for s in seeds]


def public_env(config: dict[str, Any]) -> BanditEnv | None:
    """The public environment every program also plays, for its behaviour fingerprint
    (``atlas.sandbox.behaviour``): the task's shape drawn from ``PUBLIC_SEED``, never from the
    secret. None where the scorer's config says ``behaviour: false`` (a trusted caller's
    switch: the test that it changes no score)."""
    if not config.get("behaviour", True):
        return None
    cfg = BanditConfig.from_mapping(config)
    return make_env(replace(cfg, T=min(cfg.T, PUBLIC_STEPS)), PUBLIC_SEED)


#: the public environment's horizon: a witness of behaviour at a few percent of a candidate's
#: cost (the full horizon, 2,000 steps by default, cost 16-26 % a candidate, over the 10 % an
#: isolation measure may cost); programs that play alike for these steps and differ only
#: later share a fingerprint
PUBLIC_STEPS = 500


#: steps of the public environment per message (a message stays far below the frame limit)
PUBLIC_CHUNK = 500


class BanditScorer:
    """Trusted half: holds the hidden environments, sends contexts and rewards, counts regret.

    After the hidden environments the runner plays the public environment (``public_env``)
    with a twin of the program (``atlas.sandbox.behaviour.Twin``), ``PUBLIC_CHUNK`` steps a
    message, contexts and rewards together (it is public: nothing to hide from the runner):
    the arms played there are hashed into ``Evaluation.behaviour``; the score is the hidden
    environments' alone."""

    def __init__(self, config: dict[str, Any], secret: str | None = None) -> None:
        self.config, self.secret = dict(config), secret
        self.envs = build_envs(self.config, secret)
        self.cfg = BanditConfig.from_mapping(config)
        self.public = public_env(self.config)
        self._by_program: dict[str, list[BanditEnv]] = {}

    def envs_for(self, code: str, context: dict[str, Any]) -> list[BanditEnv]:
        """The program's own hidden environments (``atlas.sandbox.inputs``): drawn from the
        secret and its program key, so a relay from an earlier candidate, which faced other
        environments, carries nothing about them. Without a secret, the public ones."""
        if self.secret is None:
            return self.envs
        key = inputs_key(code, context)
        if key not in self._by_program:
            if len(self._by_program) >= 4:  # a few: a fresh audit or a resend reuses them
                self._by_program.pop(next(iter(self._by_program)))
            self._by_program[key] = build_envs(self.config, self.secret, key)
        return self._by_program[key]

    def public_config(self) -> dict[str, Any]:
        """What the runner may know: the shapes of the problem, nothing hidden."""
        return {"K": self.cfg.K, "d": self.cfg.d, "T": self.cfg.T}

    def _play(self, link: Link, envs: list[BanditEnv]) -> np.ndarray:
        """All environments in lockstep: one round trip per step carries every episode's
        contexts and last rewards (a round trip costs a scheduler wake-up on a busy machine)."""
        K = self.cfg.K
        T, E = envs[0].horizon, len(envs)
        arms = _empty((E, T), dtype=_INT64)
        for t in range(T):
            msg: dict[str, Any] = {"t": t, "x": [pack_contexts(env.contexts[t]) for env in envs]}
            if t > 0:
                msg["r"] = [float(env.rewards[t - 1, arms[i, t - 1]])
                            for i, env in enumerate(envs)]
            link.send(msg)
            answer = link.recv().get("a")
            if (type(answer) is not list or len(answer) != E
                    or not all(type(a) is int and 0 <= a < K for a in answer)):
                # the runner validated each arm with check_arm: this answer is forged
                raise CandidateError(FailureKind.TAMPERED, f"the policy's process answered "
                                     f"{repr(answer)[:60]} at t={t}, not {E} arms in [0, {K})")
            arms[:, t] = answer
        return arms

    def _play_public(self, link: Link) -> str | None:
        """The fingerprint of the twin's arms on the public environment, sent in chunks of
        ``PUBLIC_CHUNK`` steps (``public``: the first step; ``x``, ``r``: the chunk's
        contexts and rewards), each answered with its arms (``p``); fewer arms than steps:
        the twin raised at the next step, and its play ends there. None without one."""
        public, K = self.public, self.cfg.K
        if public is None:
            return None
        T, played = public.horizon, []
        for t0 in range(0, T, PUBLIC_CHUNK):
            t1 = min(T, t0 + PUBLIC_CHUNK)
            link.send({"public": t0, "x": pack_contexts(public.contexts[t0:t1]),
                       "r": pack_contexts(public.rewards[t0:t1])})
            got = link.recv().get("p")
            if (type(got) is not list or len(got) > t1 - t0
                    or not all(type(a) is int and 0 <= a < K for a in got)):
                raise CandidateError(FailureKind.TAMPERED, f"the policy's process answered "
                                     f"{repr(got)[:60]} for the public environment's steps "
                                     f"{t0}-{t1 - 1}, not at most {t1 - t0} arms in [0, {K})")
            played += got
            if len(got) < t1 - t0:
                return fingerprint("bandit", played, len(played))
        return fingerprint("bandit", played)

    def score(self, code: str, context: dict[str, Any], link: Link) -> Evaluation:
        start = time.perf_counter()
        envs = self.envs_for(code, context)
        arms = self._play(link, envs)
        behaviour = self._play_public(link)
        link.send({"done": True})
        score, metrics = score_arms(list(zip(envs, arms)))
        require_finite("NMR score", score)
        for key, value in metrics.items():
            require_finite(f"metric {key}", value)
        return Evaluation(score=score, passed=True, metrics=metrics,
                          seconds=time.perf_counter() - start, behaviour=behaviour)


def make_scorer(config: dict[str, Any], secret: str | None = None) -> BanditScorer:
    """Factory of the trusted half (called once per scorer worker)."""
    return BanditScorer(config, secret)


def make_runner(config: dict[str, Any]) -> Callable[[str, dict[str, Any], Link], None]:
    """Factory of the untrusted half: plays the policy on whatever contexts arrive."""
    n_arms, dim = int(config["K"]), int(config["d"])

    def run(code: str, context: dict[str, Any], link: Link) -> None:
        twin = Twin(code, ENTRY_POINT)  # first: its random streams begin as the seeded ones
        policy = load_candidate(code, ENTRY_POINT)
        histories: list[list[tuple[int, np.ndarray, float]]] = []
        states: list[dict[str, Any]] = []
        prev: list[tuple[int, np.ndarray]] = []
        public: dict[str, Any] = {}
        while True:
            msg = link.recv()
            if msg.get("done"):
                return
            if "public" in msg:  # after the hidden ones: the twin's play, the fingerprint's
                link.send({"p": _play_public(twin, public, msg, n_arms, dim)})
                continue
            t = int(msg["t"])
            contexts = msg["x"]
            if t == 0:  # a fresh history and state per environment, as in score_policy
                histories, states = [[] for _ in contexts], [{} for _ in contexts]
            else:
                for hist, (a, xa), r in zip(histories, prev, msg["r"]):
                    hist.append((a, xa, float(r)))
            prev, answer = [], []
            for hist, state, packed in zip(histories, states, contexts):
                x = unpack_contexts(packed, n_arms, dim)
                x.flags.writeable = False
                a = check_arm(policy(x, hist, t, state), n_arms, t)
                prev.append((a, x[a]))
                answer.append(a)
            link.send({"a": answer})

    return run


def _play_public(twin: Twin, public: dict[str, Any], msg: dict[str, Any], n_arms: int,
                 dim: int) -> list[int]:
    """The twin's arms on one chunk of the public environment (its history and state kept
    in ``public`` from chunk to chunk), in one ``Twin.within``; fewer than the chunk's steps
    where it raised, none once it has: the scored play is over, and stands."""
    t0 = int(msg["public"])
    if t0 == 0:
        public.update(history=[], state={}, stopped=False)
    played: list[int] = []
    if public.get("stopped"):
        return played
    contexts = unpack_floats(msg["x"], -1, n_arms, dim)
    rewards = unpack_floats(msg["r"], -1, n_arms)
    history, state = public["history"], public["state"]

    def play(policy: Policy) -> None:
        for i in range(len(contexts)):
            x = contexts[i].copy()  # as in run_episode: a read-only copy per step
            x.flags.writeable = False
            a = check_arm(policy(x, history, t0 + i, state), n_arms, t0 + i)
            played.append(a)
            history.append((a, x[a], float(rewards[i, a])))

    try:
        twin.within(play)
    except Exception:  # noqa: BLE001 - the twin's failure ends its play, not the program's
        public["stopped"] = True
    return played


def make_evaluator(config: dict[str, Any]) -> Callable[[str, dict[str, Any]], Evaluation]:
    """Build the worker-side evaluator (environments are generated once, here)."""
    envs = build_envs(dict(config))
    stamp = _fingerprint(envs)

    def evaluate(code: str, context: dict[str, Any]) -> Evaluation:
        nonlocal envs, stamp
        start = time.perf_counter()
        policy = load_candidate(code, ENTRY_POINT)
        try:
            score, metrics = score_policy(lambda env: policy, envs)
        finally:
            if _fingerprint(envs) != stamp:  # the candidate reached the shared arrays
                envs = build_envs(dict(config))
                stamp = _fingerprint(envs)
                raise RuntimeError("the policy modified the environment's arrays; a policy "
                                   "may only read its arguments and its own state")
        require_finite("NMR score", score)
        for key, value in metrics.items():
            require_finite(f"metric {key}", value)
        return Evaluation(score=score, passed=True, metrics=metrics,
                          seconds=time.perf_counter() - start)

    return evaluate
