"""Turn a model completion into program source, and split programs into their parts.

Why this is forgiving: a 135M model writes code inside chat markup, adds prose, closes the
fence late or never, repeats the prefilled header, or is cut off by ``max_new_tokens``.
Every repair below is cheap and deterministic; what survives must parse and define a
function, otherwise ``None`` (the explorer files it as ``FailureKind.NO_CODE``).

Kept: imports, classes, functions, and module-level assignments *before* the entry point
(constants); dropped: any other top-level statement (prose that happens to parse, example
calls, ``if __name__ == "__main__":`` blocks), because it would run at load time in the
sandbox and is never part of the policy.

``as_completion`` is the inverse: the completion with which the agent would have written a
given program (how a supporter's patch enters D_k).
"""

from __future__ import annotations

import ast
import re
import textwrap

from atlas.types import parse_program

_FENCE = re.compile(r"^[ \t]*```")
_OPEN_FENCE = re.compile(r"^[ \t]*```[ \t]*(?:python3?|py)?[ \t]*$", re.IGNORECASE)
_VERSION_COMMENT = re.compile(r"^\s*#\s*v\d+\b.*$")
_MAX_TRIMS = 200


def _fenced_blocks(text: str) -> list[str]:
    """Contents of fenced blocks in order; an unclosed last block runs to the end."""
    blocks, current = [], None
    for line in text.splitlines():
        if current is None:
            if _OPEN_FENCE.match(line):
                current = []
        elif _FENCE.match(line):
            blocks.append("\n".join(current))
            # "```python" inside a block: the model re-opened a block without closing one
            current = [] if _OPEN_FENCE.match(line) and line.strip() != "```" else None
        else:
            current.append(line)
    if current is not None:
        blocks.append("\n".join(current))
    return blocks


def _parse_prefix(code: str) -> tuple[ast.Module, list[str]] | None:
    """Parse ``code``, dropping lines from the first syntax error on (truncated completions,
    trailing prose; a bad first line, i.e. leading prose, is dropped alone). Returns the tree
    and the lines it was parsed from; ``None`` when no non-empty part parses."""
    lines = code.splitlines()
    for _ in range(_MAX_TRIMS):
        src = "\n".join(lines)
        if not src.strip():
            return None
        try:
            return parse_program(src), lines
        except SyntaxError as exc:
            cut = min((exc.lineno or len(lines)) - 1, len(lines) - 1)
            # error on the first line: leading prose, drop it; else keep what precedes it
            lines = lines[1:] if cut <= 0 else lines[:cut]
        except ValueError:  # null bytes
            return None
    return None


def _keep(tree: ast.Module, lines: list[str], entry_point: str) -> str | None:
    """Source of the kept top-level statements (comments inside them preserved)."""
    chunks, seen_entry, has_def = [], False, False
    for node in tree.body:
        is_def = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        keep = is_def or isinstance(node, (ast.Import, ast.ImportFrom)) or (
            not seen_entry and isinstance(node, (ast.Assign, ast.AnnAssign)))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            has_def = True
            if node.name == entry_point:
                seen_entry = True
        if keep:
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            if is_def and chunks:
                chunks.append("")  # one blank line before a def, as people write it
            chunks.append("\n".join(lines[start - 1:node.end_lineno]))
    if not has_def:
        return None
    return "\n".join(chunks).strip() + "\n"


def _clean(code: str, entry_point: str) -> str | None:
    code = code.replace("\t", "    ")
    candidates = [code]
    dedented = textwrap.dedent(code)
    if dedented != code:
        candidates.append(dedented)
    for cand in candidates:
        parsed = _parse_prefix(cand)
        if parsed is not None:
            kept = _keep(*parsed, entry_point)
            if kept is not None and defines_entry_point(kept, entry_point):
                return kept
    return None


def entry_point_def(tree: ast.Module, entry_point: str
                    ) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The top-level ``def`` of ``entry_point`` in ``tree`` (the one rule for "defines the
    entry point": what the sandbox's loader then looks up by name)."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry_point:
            return node
    return None


def parse(code: str) -> ast.Module | None:
    """``code``'s syntax tree; None when it does not parse (a syntax error, a null byte)."""
    try:
        return parse_program(code)
    except (SyntaxError, ValueError):
        return None


def find_entry_point(code: str, entry_point: str
                     ) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The top-level ``def`` of ``entry_point`` in ``code``; None when ``code`` does not parse
    or does not define it."""
    tree = parse(code)
    return None if tree is None else entry_point_def(tree, entry_point)


def defines_entry_point(code: str, entry_point: str) -> bool:
    """True iff ``code`` parses and defines a top-level function ``entry_point``."""
    return find_entry_point(code, entry_point) is not None


def _indent_body(code: str, header_line: int) -> str:
    """Indent everything after a def header that the model left at column 0."""
    lines = code.splitlines()
    out = lines[:header_line + 1]
    for line in lines[header_line + 1:]:
        if re.match(r"^(def |class |import |from |@)", line):
            out.append(line)
            out.extend(lines[len(out):])
            break
        out.append("    " + line if line.strip() else line)
    return "\n".join(out)


def _is_head(line: str, entry_point: str) -> bool:
    return re.match(rf"^\s*def {re.escape(entry_point)}\b", line) is not None


def _attempts(text: str, entry_point: str) -> list[str]:
    """Candidate code strings for ``text``, most faithful first."""
    blocks = (_fenced_blocks(text) if "```" in text else []) or [text]
    tries: list[str] = []
    first = blocks[0].splitlines()
    head0 = next((i for i, ln in enumerate(first) if _is_head(ln, entry_point)), len(first))
    preamble = "\n".join(first[:head0])  # the prefill's imports, for re-opened blocks
    for n, block in enumerate(blocks):
        if n and preamble.strip():
            tries.append(preamble + "\n" + block)
        tries.append(block)
        lines = block.splitlines()
        heads = [i for i, ln in enumerate(lines) if _is_head(ln, entry_point)]
        if len(heads) > 1:  # the model repeated the prefilled header: keep its own version
            tries.append("\n".join(lines[:heads[0]] + lines[heads[1]:]))
        if heads:
            tries.append(_indent_body(block, heads[0]))
    return tries


def extract_program(prefill: str, completion: str, entry_point: str) -> str | None:
    """Program source from ``prefill + completion`` (see module docstring), or ``None``."""
    texts = [prefill + completion]
    if prefill and not prefill.endswith("\n") and completion[:1] in (" ", "\t"):
        texts.insert(0, prefill + "\n" + completion)  # a sampler stripped the line break
    tries: list[str] = []
    for text in texts:
        tries.extend(_attempts(text, entry_point))
    fallback = None
    for code in tries:
        kept = _clean(code, entry_point)
        if kept is not None:
            return kept
        if fallback is None:
            parsed = _parse_prefix(code.replace("\t", "    "))
            if parsed is not None:
                fallback = _keep(*parsed, entry_point)
    return fallback  # parses and defines some function, but not the entry point


def strip_version_comments(code: str) -> str:
    """Drop ``# vN: ...`` header lines (prompts add their own)."""
    return "\n".join(ln for ln in code.strip().splitlines() if not _VERSION_COMMENT.match(ln))


def split_program(code: str, entry_point: str) -> tuple[str, str] | None:
    """``(preamble, rest)``: the source before the entry point's ``def`` (imports, constants,
    helpers) and from it on; ``None`` when the code does not parse or lacks the entry point."""
    node = find_entry_point(code, entry_point)
    if node is None:
        return None
    lines = code.splitlines()
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return "\n".join(lines[:start - 1]).strip(), "\n".join(lines[start - 1:])


def _statements(code: str) -> list[tuple[str, ast.stmt]] | None:
    """Top-level statements as ``(ast.dump, node)``; None when ``code`` does not parse."""
    tree = parse(code)
    return None if tree is None else [(ast.dump(n), n) for n in tree.body]


def as_completion(prefill: str, code: str, entry_point: str) -> str | None:
    """The completion, after ``prefill`` (a prompt's opening fence, preamble, signature and
    leading comments), with which the agent would have written ``code``; None if it cannot.

    Why: a supporter's program enters D_k as a completion of the prompt the agent was served
    (paper 2.1-2.2), so the DPO loss must train on tokens the agent could have produced:
    text that continues the prefill inside the open fence, never a closing fence (generation
    stops there). The function is the text after the prefill's header; helpers and imports
    the patch added before the function (e.g. the Huber helper) follow the function, where
    the extractor keeps them. A patch that changed the prefill's header or added module-level
    constants cannot be written after the prefill: None. The result is checked: extracting
    ``prefill + completion`` gives ``code``'s statements (plus any the prefill already had).
    """

    fence = "```python\n"
    if not prefill.startswith(fence):
        return None
    head = prefill[len(fence):]
    code = code.strip("\n") + "\n"
    if code.startswith(head):
        completion = code[len(head):].rstrip()
    else:
        head_split, code_split = split_program(head + "\n    pass", entry_point), \
            split_program(code, entry_point)
        if head_split is None or code_split is None:
            return None
        head_fn = head_split[1][: -len("\n    pass")]
        if not code_split[1].startswith(head_fn):
            return None
        known = {d for d, _ in _statements(head_split[0]) or []}
        extras = []
        lines = code.splitlines()
        for dump, node in _statements(code_split[0]) or []:
            if dump in known:
                continue
            if not isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef,
                                     ast.AsyncFunctionDef, ast.ClassDef)):
                return None  # a constant after the function would be dropped by extraction
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            extras.append("\n".join(lines[start - 1:node.end_lineno]))
        completion = code_split[1][len(head_fn):].rstrip()
        if extras:
            completion += "\n\n\n" + "\n\n\n".join(extras)
    if not completion.strip() or "```" in completion:
        return None
    extracted = extract_program(prefill, completion, entry_point)
    want, got = _statements(code), _statements(extracted or "")
    if got is None or want is None:
        return None
    allowed = {d for d, _ in want} | {d for d, _ in _statements(head + "\n    pass") or []}
    if not {d for d, _ in want} <= {d for d, _ in got} or not {d for d, _ in got} <= allowed:
        return None
    return completion
