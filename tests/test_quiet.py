"""The library warnings a run filters (atlas/quiet.py), each by its message and module, and
the one fixed at our call (W&B's "anonymous" notice)."""

from __future__ import annotations

import warnings

import pytest

from atlas.quiet import FILTERS, install


def _emitted(message: str, category: type[Warning], module: str) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        install()
        warnings.warn_explicit(message, category, filename=f"{module.replace('.', '/')}.py",
                               lineno=1, module=module)
    return [str(w.message) for w in caught]


def test_the_filters_are_these() -> None:
    assert [(m, c.__name__, mod) for m, c, mod in FILTERS] == [
        (r"`past_key_values` is deprecated", "FutureWarning", r"torch\.nn\.modules\.module"),
        (r"`is_gradient_checkpointing` is deprecated", "FutureWarning",
         r"transformers\.modeling_utils"),
    ]


@pytest.mark.parametrize("message,category,module", [
    ("`past_key_values` is deprecated and will be removed in version 5.40.0 for "
     "`LlamaForCausalLM.forward`. Use `cache` instead.", FutureWarning, "torch.nn.modules.module"),
    ("`is_gradient_checkpointing` is deprecated and will be removed in v6. Use "
     "`is_activation_checkpointing` instead.", FutureWarning, "transformers.modeling_utils"),
])
def test_each_filter_hides_its_warning_and_only_it(message, category, module) -> None:
    assert _emitted(message, category, module) == []
    # the same library's other warnings still show, as does this text from another module
    assert _emitted("something else is deprecated", category, module)
    assert _emitted(message, category, "mypkg.model")


def test_the_real_is_gradient_checkpointing_warning_is_filtered() -> None:
    from atlas.agent.tiny import build_tiny_model

    model, _ = build_tiny_model(hidden_size=16, num_layers=1, num_heads=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        install()
        _ = model.is_gradient_checkpointing
    assert not [w for w in caught if "is_gradient_checkpointing" in str(w.message)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _ = model.is_gradient_checkpointing
    assert [w for w in caught if "is_gradient_checkpointing" in str(w.message)]  # unfiltered


def test_wandb_run_prints_no_anonymous_notice(tmp_path, capfd, monkeypatch) -> None:
    from atlas.loggers import finish_logger, wandb_logger

    monkeypatch.setenv("WANDB_MODE", "offline")
    logger = wandb_logger(tmp_path, {"method": {"name": "atlas"}}, mode="offline")
    assert "anonymous" not in logger._wandb_init
    _ = logger.experiment  # wandb.init
    finish_logger(logger, "success")
    out, err = capfd.readouterr()
    assert "anonymous" not in out + err
