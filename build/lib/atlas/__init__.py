"""ATLAS: a small LLM research agent that improves itself with Evolving DPO."""

__version__ = "0.1.0"
