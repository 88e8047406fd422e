"""Prompts for a small research agent: versioned programs with scores, then a prefilled header.

Why this shape (FunSearch/EvoTune style, tuned for SmolLM2-135M): free-form chat prompts gave
0-4 valid programs out of 8, so the prompt is mostly code. The island's best programs are shown
as versions ``v0 .. v{n-1}`` ordered worst -> best, each a fenced block whose first line is
``# vI: score S``; the model is asked for ``v{n}`` and its answer is *prefilled* with the
opening fence, the best parent's preamble (imports, constants, helpers the body may call),
the function signature and the best parent's opening body comments, so generation starts
inside the function body. Measured on SmolLM2-135M: a ``# vN`` comment in the prefill was
copied as prose and spawned ``policy_v2``-style junk, so the prefill carries none.
"""

from __future__ import annotations

import hashlib
import math

from atlas.evolution.extract import split_program, strip_version_comments
from atlas.tasks.base import PromptSpec
from atlas.types import Program

MAX_CRITIQUE_CHARS = 600  # a supporter's critique is cut here: the agent's context is small

#: the prompt's forms (``explore.prompt_form``): the instruction after the versions, and
#: whether the prefill repeats the best parent's opening body comments. Why several: a small
#: model asked for "a better version" of one parent, with that parent's comments prefilled,
#: writes the parent out again; ``python -m atlas.bench prompts`` measures each form's copy
#: and valid rates on the base model.
PROMPT_FORMS: dict[str, tuple[str, bool]] = {
    "better": ("Write v{n}, a better version of v{last} (higher score). "
               "Keep the signature. Reply with code only.", True),
    "better_bare": ("Write v{n}, a better version of v{last} (higher score). "
                    "Keep the signature. Reply with code only.", False),
    "change": ("Write v{n}: change how v{last} works so that it scores higher. Do not repeat "
               "an earlier version. Keep the signature. Reply with code only.", True),
    "change_bare": ("Write v{n}: change how v{last} works so that it scores higher. Do not "
                    "repeat an earlier version. Keep the signature. Reply with code only.",
                    False),
}


def prompt_hash(prompt: str) -> str:
    """A short stable name of a prompt for events.jsonl (G_k's, D_k's, the probe's, a copy's)."""
    return hashlib.sha1(prompt.encode()).hexdigest()[:10]


def format_score(score: float) -> str:
    """Short, sign-preserving score text for the ``# vI: score S`` comment."""
    if not math.isfinite(score):
        return "failed"
    return f"{score:.4g}"


def _signature_line(spec: PromptSpec) -> str:
    sig = spec.signature.strip()
    if not sig.startswith(("def ", "async def ")):
        raise ValueError(f"PromptSpec.signature must be a def line like 'def {spec.entry_point}"
                         f"(...):', got {spec.signature!r} (fix the task's prompt_spec)")
    return sig if sig.endswith(":") else sig + ":"


def build_prompt(spec: PromptSpec, parents: list[Program], critique: str | None = None,
                 form: str = "better") -> tuple[str, str, str]:
    """``(system, user, prefill)`` for one island; ``parents`` in any order (sorted here);
    ``form`` one of ``PROMPT_FORMS``.

    The prefill is the start of the assistant's answer; the agent's ``chat_prompt`` appends it
    after the generation prompt so the model continues the function body.
    """
    if form not in PROMPT_FORMS:
        raise ValueError(f"explore.prompt_form={form!r} is not one of {sorted(PROMPT_FORMS)}")
    instruction, with_lead = PROMPT_FORMS[form]
    sig = _signature_line(spec)
    shown = sorted(parents, key=lambda p: (p.score, -p.id))  # worst -> best
    n = len(shown)
    parts = [spec.problem.strip()]
    if spec.hints:
        parts.append("\n".join(f"- {h.strip()}" for h in spec.hints))
    if shown:
        parts.append("Earlier versions, worst to best:")
        for i, p in enumerate(shown):
            code = strip_version_comments(p.code)
            parts.append(f"```python\n# v{i}: score {format_score(p.score)}\n{code}\n```")
    if critique and critique.strip():
        note = " ".join(critique.split())[:MAX_CRITIQUE_CHARS]
        parts.append(f"Reviewer note: {note}")
    if shown:
        parts.append(instruction.format(n=n, last=n - 1))
    else:
        parts.append(f"Write {spec.entry_point}. Keep the signature. Reply with code only.")
    user = "\n\n".join(parts)

    preamble, lead = "", []
    if shown:
        split = split_program(strip_version_comments(shown[-1].code), spec.entry_point)
        if split is not None:
            preamble = split[0]
            lead = _leading_comments(split[1]) if with_lead else []
    prefill = PREFILL_START
    if preamble:
        prefill += preamble + "\n\n"
    # no trailing newline: BPE tokenizers merge "\n" with the next line's indentation
    # ("\n   " is one SmolLM2 token), so a prompt ending in a bare "\n" token makes the model
    # start the next line at column 0, i.e. leave the function (measured: 7/8 no_code)
    prefill += sig + "".join("\n" + line for line in lead)
    return spec.system.strip(), user, prefill


PREFILL_START = "```python\n"


def prefill_of(prompt: str) -> str:
    """The prefill a chat prompt built from ``build_prompt`` ends with (from its last code
    fence on), so a completion of a stored prompt can be turned back into a program."""
    at = prompt.rfind(PREFILL_START)
    if at < 0:
        raise ValueError("prompt holds no '```python' prefill; it was not built by build_prompt")
    return prompt[at:]


def _leading_comments(function_source: str) -> list[str]:
    """The comment lines that open the function body.

    Why: they fix the body's indentation and put the model in "rewrite this function" mode
    without committing it to any statement; a version comment here was copied as prose.
    """
    out = []
    for line in function_source.splitlines()[1:]:
        if line.strip().startswith("#") and line.startswith((" ", "\t")):
            out.append(line)
        else:
            break
    return out
