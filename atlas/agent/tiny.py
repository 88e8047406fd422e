"""A tiny randomly initialised Llama model with a byte-level tokenizer, built in-process.

Tests use it so that every model path (sampling, DPO, KL, promotion) runs in seconds
without weights on disk. The tokenizer is byte-level (256 bytes + 3 specials), so any
text round-trips exactly.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIALS = ["<|pad|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer: ids 0..255 are bytes (via GPT-2's byte alphabet), then specials."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|pad|>",
                                   bos_token="<|im_start|>", eos_token="<|im_end|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def build_tiny_model(hidden_size: int = 32, num_layers: int = 2, num_heads: int = 4,
                     seed: int = 0, num_kv_heads: int | None = None, **_: object
                     ) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """Return ``(model, tokenizer)``; same seed, same weights. ``num_kv_heads`` below
    ``num_heads``: query heads share key and value heads (grouped-query attention, as
    SmolLM2's 9 query heads share 3)."""
    tokenizer = byte_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads or num_heads, max_position_embeddings=2048,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True,
    )
    gen = torch.random.fork_rng()
    with gen:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.eval()
    return model, tokenizer
