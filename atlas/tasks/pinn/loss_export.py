"""The candidate's loss as data: a StableHLO export traced in its process, trained in ours.

Why: a process that runs candidate Python can change how it is trained (walk frames to the
loop, patch ``jax`` or ``optax``; ``tests/attacks/pinn/extra_training_steps.py`` quadrupled
``n_steps``), and returned parameters cannot show it. So the candidate's process only
*traces* ``pinn_loss_strategy`` on abstract inputs of the exact shapes the trainer passes
and exports ``value_and_grad`` of it (``jax.export``); the trusted scorer trains with that
module and never runs candidate Python.

The module is untrusted data. The scorer builds the ``Exported`` around it from its own
reference export of the same signature (trees, shapes, dtypes, platform, effects: nothing of
that is read from the runner), and only accepts a module whose ``main`` has exactly the
expected argument and result types, whose ops are plain StableHLO (no ``custom_call``: no
Python callbacks, no host transfers, no collectives), and whose every value is a ranked
static tensor of at most ``MAX_ELEMENTS`` elements (``MAX_TOTAL_ELEMENTS`` together). A
module that loops forever is stopped by the sandbox's wall-time limit like any candidate
(the scorer is then restarted: it was the process running the loop).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from atlas.sandbox.candidate import CandidateError
from atlas.types import FailureKind

#: the most elements any value of an exported loss may have (an outer product of the
#: 2,048 validation residuals is 4.2M; 16M float32 is 64 MB)
MAX_ELEMENTS = 1 << 24
#: the most elements all values of a module may have together: a bound on the memory the
#: scorer gives one loss (256 MB of float32), whose process the sandbox's memory watch of
#: runners does not cover; an honest loss has a few dozen values of ~1,000-4M elements
MAX_TOTAL_ELEMENTS = 1 << 26
#: the most bytes of serialized module the scorer accepts
MAX_MODULE_BYTES = 4 << 20
#: ops that structure a module; everything else must be ``stablehlo.*`` or ``chlo.*``
STRUCTURAL_OPS = frozenset({"builtin.module", "func.func", "func.return", "func.call"})
#: StableHLO ops a loss never needs: host calls, host transfers, devices, tokens
FORBIDDEN_OPS = frozenset(f"stablehlo.{n}" for n in (
    "custom_call", "send", "recv", "infeed", "outfeed", "after_all", "create_token",
    "all_gather", "all_reduce", "all_to_all", "reduce_scatter", "collective_permute",
    "collective_broadcast", "partition_id", "replica_id"))

CONTROL_FLOW = ("pinn_loss_strategy uses Python control flow, a Python number or NumPy on a "
                "traced value (`if`, `and`/`or`, `float()`, `int()`, `np.*` on an array), "
                "which cannot be compiled: use jnp.where(cond, a, b), jnp.minimum/jnp.maximum "
                "or jnp.clip, and jnp instead of np")
NO_CALLBACKS = ("pinn_loss_strategy calls back into Python (jax.pure_callback, io_callback, "
                "jax.debug.callback or jax.debug.print), which cannot be exported: no Python "
                "callbacks in the loss; compute it with jax.numpy only")


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text.split("\n\nSee https://")[0][:1500]


def _is_tracer_error(exc: BaseException) -> bool:
    import jax

    return isinstance(exc, (jax.errors.ConcretizationTypeError,
                            jax.errors.TracerArrayConversionError,
                            jax.errors.TracerIntegerConversionError,
                            jax.errors.TracerBoolConversionError,
                            jax.errors.UnexpectedTracerError))


def check_return(out: Any) -> None:
    """A loss must be one floating-point number (shape () or size 1)."""
    shape, dtype = getattr(out, "shape", None), getattr(out, "dtype", None)
    if isinstance(out, float):
        return
    if shape is None or dtype is None:
        raise CandidateError(FailureKind.WRONG_RETURN,
                             f"pinn_loss_strategy must return a scalar array, got "
                             f"{type(out).__name__}")
    if int(np.prod(shape)) != 1:
        raise CandidateError(FailureKind.WRONG_RETURN,
                             f"pinn_loss_strategy must return a scalar loss, got shape "
                             f"{tuple(shape)}; reduce with jnp.mean or jnp.sum")
    if not np.issubdtype(np.dtype(dtype), np.floating):
        raise CandidateError(FailureKind.WRONG_RETURN,
                             f"pinn_loss_strategy must return a float loss, got dtype {dtype}")


def signature(trainer: Any, cfg: Any, validation: bool) -> tuple[tuple, dict[str, Any]]:
    """Abstract (residuals, ic_err, bc_err) and extras exactly as the trainer passes them:
    at the training points, or (``validation``) at the validation points with the final
    training statistics (the paper score's call)."""
    import jax
    import jax.numpy as jnp

    from atlas.tasks.pinn import model  # deferred with JAX

    def vec(n: int) -> Any:
        return jax.ShapeDtypeStruct((n,), jnp.float32)

    def scalar(dtype: Any) -> Any:
        return jax.ShapeDtypeStruct((), dtype)

    sizes = [2] + [cfg.width] * cfg.depth + [1]
    params = [(jax.ShapeDtypeStruct((i, o), jnp.float32), vec(o))
              for i, o in zip(sizes[:-1], sizes[1:])]
    n = ((cfg.n_val_collocation, cfg.n_val_initial, cfg.n_val_boundary) if validation
         else (cfg.n_collocation, cfg.n_initial, cfg.n_boundary))
    pts = model.Points(vec(n[0]), vec(n[0]), vec(n[1]), vec(n[1]), vec(n[2]), vec(n[2]))
    stats = jax.ShapeDtypeStruct((len(model.COMPONENTS), len(model.STAT_FIELDS)), jnp.float32)
    i32, f32 = scalar(jnp.int32), scalar(jnp.float32)
    vecs, extras, _ = jax.eval_shape(trainer.observe, params, pts, f32, stats, i32, i32)
    if validation:
        extras = jax.eval_shape(trainer.extras, stats, i32, i32, f32, pts)
    return tuple(vecs), dict(extras)


def loss_function(fn: Callable, grad: bool) -> Callable:
    """What is exported: ``value_and_grad`` w.r.t. the three vectors (training) or the
    scalar loss alone (the paper score on validation points)."""
    import jax
    import jax.numpy as jnp

    def scalar_loss(r: Any, i: Any, b: Any, e: dict) -> Any:
        return jnp.reshape(fn(r, i, b, e), ())

    return jax.value_and_grad(scalar_loss, argnums=(0, 1, 2)) if grad else scalar_loss


def export_loss(fn: Callable, sig: tuple[tuple, dict], grad: bool) -> dict[str, Any]:
    """Trace and export the candidate's loss (runs candidate code: the runner's side).

    Returns the message the scorer loads: the serialized module (base64) and the indices of
    the arguments it kept (JAX drops the ones the loss never reads)."""
    import jax

    vecs, extras = sig
    try:
        out = jax.eval_shape(fn, *vecs, extras)
    except CandidateError:
        raise
    except Exception as exc:  # noqa: BLE001 - classified below
        if _is_tracer_error(exc):
            raise CandidateError(FailureKind.EXCEPTION,
                                 f"{CONTROL_FLOW}. {_describe(exc)}"[:1500]) from exc
        raise CandidateError(FailureKind.EXCEPTION, _describe(exc)) from exc
    check_return(out)
    try:
        exported = jax.export.export(jax.jit(loss_function(fn, grad)),
                                     platforms=("cpu",))(*vecs, extras)
    except CandidateError:
        raise
    except Exception as exc:  # noqa: BLE001 - classified below
        text = _describe(exc)
        if _is_tracer_error(exc):
            raise CandidateError(FailureKind.EXCEPTION, f"{CONTROL_FLOW}. {text}"[:1500]) from exc
        if "callback" in text.lower() or "custom call" in text.lower():
            raise CandidateError(FailureKind.EXCEPTION, f"{NO_CALLBACKS}. {text}"[:1500]) from exc
        raise CandidateError(FailureKind.EXCEPTION, text) from exc
    problem = _own_problem(exported.mlir_module_serialized)
    if problem:  # what the scorer would reject as tampered: say why, in the program's terms
        raise CandidateError(FailureKind.EXCEPTION, f"pinn_loss_strategy compiles to a module "
                             f"the trainer does not run: it {problem}; use plain jax.numpy "
                             f"arithmetic, reductions and jnp.where (no linear algebra "
                             f"kernels, no callbacks)"[:1500])
    if exported.ordered_effects or exported.unordered_effects:
        raise CandidateError(FailureKind.EXCEPTION, f"{NO_CALLBACKS} (the loss has side "
                             f"effects: {exported.ordered_effects + exported.unordered_effects})")
    return {"module": base64.b64encode(exported.mlir_module_serialized).decode("ascii"),
            "kept": list(exported.module_kept_var_idx)}


def _tampered(what: str) -> CandidateError:
    return CandidateError(FailureKind.TAMPERED, f"the exported loss {what}")


class LossLoader:
    """Trusted side: turn a runner's export message into a callable ``Exported``.

    Everything but the module bytes and the kept-argument indices comes from a reference
    export this process makes of its own function with the same signature."""

    def __init__(self, sig: tuple[tuple, dict], grad: bool) -> None:
        import jax
        import jax.numpy as jnp

        vecs, extras = sig

        def everything(r: Any, i: Any, b: Any, e: dict) -> Any:  # reads every argument
            return sum(jnp.sum(leaf.astype(jnp.float32))
                       for leaf in jax.tree_util.tree_leaves((r, i, b, e)))

        self.reference = jax.export.export(jax.jit(loss_function(everything, grad)),
                                           platforms=("cpu",))(*vecs, extras)
        n_in = len(self.reference.in_avals)
        if tuple(self.reference.module_kept_var_idx) != tuple(range(n_in)):
            raise RuntimeError("the reference export dropped an argument (a task bug)")
        # the types the task's signature has in a module: read from our own export
        self.in_types, self.out_types = _main_types(self.reference.mlir_module_serialized)

    def load(self, msg: Any) -> Any:
        """The ``Exported`` for a runner's message; raises ``tampered`` for anything but a
        plain StableHLO module of this signature."""
        if not isinstance(msg, dict) or not isinstance(msg.get("module"), str):
            raise _tampered("is missing or malformed")
        if len(msg["module"]) > MAX_MODULE_BYTES * 4 // 3 + 4:
            raise _tampered(f"is larger than {MAX_MODULE_BYTES} bytes")
        try:
            blob = base64.b64decode(msg["module"], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise _tampered(f"is not base64 ({exc})") from exc
        kept = msg.get("kept")
        n_in = len(self.in_types)
        if (not isinstance(kept, list) or not all(type(k) is int for k in kept)
                or any(not 0 <= k < n_in for k in kept) or kept != sorted(set(kept))):
            raise _tampered(f"names invalid arguments {kept!r:.200}")
        self._verify(blob, kept)
        return dataclasses.replace(self.reference, mlir_module_serialized=blob,
                                   module_kept_var_idx=tuple(kept))

    def _verify(self, blob: bytes, kept: list[int]) -> None:
        from jax._src.interpreters import mlir
        from jax._src.lib import _jax

        with mlir.make_ir_context():
            try:
                module = _jax.mlir.deserialize_portable_artifact(blob)
            except Exception as exc:  # noqa: BLE001 - whatever the parser rejects
                raise _tampered(f"is not a StableHLO module ({_describe(exc)[:300]})") from exc
            try:  # the module is the runner's: whatever reading it raises is its fault
                got_in, got_out = _signature_of(module)
                problem = module_problem(module)
            except CandidateError:
                raise
            except Exception as exc:  # noqa: BLE001 - a malformed module, not a task bug
                raise _tampered(f"could not be read ({_describe(exc)[:300]})") from exc
            if got_in != [self.in_types[k] for k in kept] or got_out != self.out_types:
                raise _tampered(f"has the signature {got_in} -> {got_out}, not the task's")
        if problem:
            raise _tampered(problem[:500])

def _signature_of(module: Any) -> tuple[list[str], list[str]]:
    """The argument and result types of a module's ``main`` (inside an MLIR context)."""
    from jax._src.lib.mlir import ir

    mains = [op for op in module.body.operations
             if op.operation.name == "func.func"
             and ir.StringAttr(op.attributes["sym_name"]).value == "main"]
    if len(mains) != 1:
        raise _tampered("has no single main function")
    ftype = ir.FunctionType(ir.TypeAttr(mains[0].attributes["function_type"]).value)
    return [str(t) for t in ftype.inputs], [str(t) for t in ftype.results]


def _main_types(blob: bytes) -> tuple[list[str], list[str]]:
    from jax._src.interpreters import mlir
    from jax._src.lib import _jax

    with mlir.make_ir_context():
        return _signature_of(_jax.mlir.deserialize_portable_artifact(blob))


def module_problem(module: Any) -> str | None:
    """Why a module (inside an MLIR context) is not a plain StableHLO loss, or None: an op
    outside StableHLO / CHLO or a forbidden one (``custom_call``: a library kernel or a
    Python callback), a value that is not a ranked static tensor, or one too large."""
    from jax._src.lib.mlir import ir

    problems: list[str] = []
    total = [0]

    def check_type(t: Any, where: str) -> None:
        try:
            tensor = ir.RankedTensorType(t)
        except (TypeError, ValueError):
            problems.append(f"{where} has the type {t}")
            return
        if not tensor.has_static_shape:
            problems.append(f"{where} has a dynamic shape {t}")
        elif math.prod(tensor.shape) > MAX_ELEMENTS:
            problems.append(f"{where} has {math.prod(tensor.shape)} elements "
                            f"(at most {MAX_ELEMENTS})")
        else:
            total[0] += math.prod(tensor.shape)
            if total[0] > MAX_TOTAL_ELEMENTS:
                problems.append(f"has more than {MAX_TOTAL_ELEMENTS} elements in all its "
                                f"values together")

    def visit(op: Any) -> Any:
        name = op.name
        if name in FORBIDDEN_OPS or not (name in STRUCTURAL_OPS or name.startswith(
                ("stablehlo.", "chlo."))):
            target = ""
            if "call_target_name" in op.attributes:
                target = f" ({ir.StringAttr(op.attributes['call_target_name']).value})"
            problems.append(f"uses the op {name}{target}")
        for res in op.results:
            check_type(res.type, f"a value of {name}")
        for region in op.regions:
            for block in region.blocks:
                for arg in block.arguments:
                    check_type(arg.type, f"an argument in {name}")
        return ir.WalkResult.INTERRUPT if problems else ir.WalkResult.ADVANCE

    try:
        module.operation.walk(visit)
    except RuntimeError as exc:  # whatever the walk met that we did not expect
        return f"could not be checked ({_describe(exc)[:300]})"
    return problems[0] if problems else None


def _own_problem(blob: bytes) -> str | None:
    from jax._src.interpreters import mlir
    from jax._src.lib import _jax

    with mlir.make_ir_context():
        return module_problem(_jax.mlir.deserialize_portable_artifact(blob))
