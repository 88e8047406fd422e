"""The research agent: a Hugging Face causal LM with two LoRA adapters, ``policy`` and ``ref``."""
