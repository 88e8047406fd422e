"""The research agent: base LM + LoRA adapters ``policy``/``ref``, chat prompts, fast sampling.

One object owns the model so that the explorer (sampling), the DPO step (training the
``policy`` adapter) and the gate (``ref`` vs candidates) all act on the same weights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from peft import PeftModel

from atlas.agent import adapters
from atlas.agent.adapters import POLICY, REF, attach_adapters
from atlas.agent.device import resolve_device
from atlas.agent.model import load_base_model
from atlas.agent.precision import Precision, choose_precision
from atlas.agent.sampling import Request, SampleStats, sample, sample_requests
from atlas.schema import ModelConfig


def choose_attention(device: str) -> str:
    """Pick an attention kernel that does not rebuild an execution plan every decode step,
    and name it (recorded with each round).

    On CUDA, cuDNN's SDPA plans per sequence length: 3.4 ms of CPU per call for 11 us of GPU
    work while the KV length grows, so it is turned off process-wide and PyTorch falls back
    to flash / memory-efficient SDPA. The CPU's SDPA kernel has no plans to rebuild.
    """
    if torch.device(device).type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)
        return "sdpa (flash/mem-efficient; cudnn off)"
    return f"sdpa ({torch.device(device).type})"


class ResearchAgent:
    """A causal LM with two LoRA adapters and a batched sampler.

    ``generate(..., adapter=None)`` samples from the base model (EvoTune's fixed reference);
    ``adapter="policy"`` (default) from the trained adapter, ``adapter="ref"`` from the
    reference (``atlas.agent.adapters.promote`` copies policy -> ref).
    """

    def __init__(self, model_cfg: ModelConfig, device: str = "cpu", seed: int = 0,
                 precision: Precision | None = None) -> None:
        self.device = resolve_device(device)
        self.seed = int(seed)
        # model.dtype=auto resolves per machine (atlas.agent.precision); a run passes the
        # precision recorded in its folder so that a resume keeps it
        self.precision = precision or choose_precision(model_cfg.dtype, self.device,
                                                       model_cfg.cache_dir)
        self.cfg = dataclasses.replace(model_cfg, dtype=self.precision.dtype)
        base, self.tokenizer = load_base_model(self.cfg, self.device)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)  # LoRA A init: same seed, same adapters
            self.model: PeftModel = attach_adapters(
                base, r=model_cfg.lora_r, alpha=int(model_cfg.lora_alpha),
                dropout=model_cfg.lora_dropout, targets=list(model_cfg.lora_targets))
        self.model.to(self.device)
        self.model.eval()
        self.attention = choose_attention(self.device)
        self.last_stats: SampleStats | None = None
        #: ``sampling``'s decode path: auto (a CUDA graph on CUDA, prompt lookup on the CPU),
        #: lookup, compact or graph; each call's ``last_stats.path`` says which one ran
        self.decode_path = "auto"
        # generate(on_done=...) reports each finished row while the others decode
        self.streams_results = True
        # torch threads to generate with, polled while sampling (the run sets it to the cores
        # sandbox workers leave free); None: the caller's torch setting
        self.thread_budget: Callable[[], int] | None = None

    # ------------------------------------------------------------------ prompts
    def chat_prompt(self, system: str, user: str, prefill: str = "") -> str:
        """Chat-template text ending in the assistant header, then ``prefill`` verbatim.

        A prefill such as "```python\\ndef policy(" makes a small model continue code
        instead of chatting; the completion returned by ``generate`` excludes it.
        """
        messages = [{"role": "user", "content": user}]
        if system:
            messages.insert(0, {"role": "system", "content": system})
        text = self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=True)
        return text + prefill

    # ------------------------------------------------------------------ sampling
    def generate(self, prompts: list[str], num_samples: int, *, temperature: float, top_p: float,
                 max_new_tokens: int, stop: list[str] | None = None,
                 adapter: str | None = POLICY, seed: int | None = None,
                 on_done: Callable[[int, str], None] | None = None) -> list[list[str]]:
        """``num_samples`` completions per prompt (text after the prompt, cut at a stop string).

        ``adapter=None`` samples from the base model with adapters disabled. Deterministic
        for a given ``seed``; statistics of the call are left in ``self.last_stats``.
        """
        if isinstance(prompts, str):
            raise TypeError("prompts must be a list of strings, not one string")
        with self._sampling(adapter):
            texts, self.last_stats = sample(
                self.model, self.tokenizer, prompts, num_samples, temperature=temperature,
                top_p=top_p, max_new_tokens=max_new_tokens, stop=stop, seed=seed,
                threads=self.thread_budget, on_done=on_done, path=self.decode_path)
        return texts

    def generate_batch(self, requests: list[Request], *, top_p: float, max_new_tokens: int,
                       stop: list[str] | None = None, adapter: str | None = POLICY,
                       on_done: Callable[[int, str], None] | None = None) -> list[list[str]]:
        """Completions for several requests (e.g. a round's islands) decoded as one batch,
        each with its own temperature and seed (``atlas.agent.sampling.sample_requests``)."""
        with self._sampling(adapter):
            texts, self.last_stats = sample_requests(
                self.model, self.tokenizer, requests, top_p=top_p,
                max_new_tokens=max_new_tokens, stop=stop, threads=self.thread_budget,
                on_done=on_done, path=self.decode_path)
        return texts

    @contextmanager
    def _sampling(self, adapter: str | None) -> Iterator[None]:
        """Eval mode under ``adapter`` (None: adapters off) for one sampling call."""
        if adapter not in (None, POLICY, REF):
            raise ValueError(f"adapter={adapter!r} is unknown; use {POLICY!r}, {REF!r} or None")
        was_training = self.model.training
        self.model.eval()
        try:
            with adapters.adapter(self.model, adapter):
                yield
        finally:
            self.model.train(was_training)

    # ------------------------------------------------------------------ device
    def model_device(self) -> torch.device:
        """Where the model's weights are now."""
        return next(self.model.parameters()).device

    def check_device(self, where: str) -> None:
        """Stop the run when the model is not on the device the run put it on.

        Lightning's teardown moves a LightningModule to the CPU after ``fit``; a model that
        silently left its GPU would make every later round run on the CPU.
        """
        want, have = torch.device(self.device), self.model_device()
        if have.type != want.type or (want.index is not None and have.index != want.index):
            raise RuntimeError(f"{where}: the agent's model is on {have} but the run put it on "
                               f"{want}; something moved it (a bug: report it with the run's "
                               "train.log)")
