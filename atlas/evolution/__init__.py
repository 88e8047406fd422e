"""Exploration (paper 2.1): six-island program database, prompts, extraction, D_k, rounds."""

from atlas.evolution.buffer import failure_floor
from atlas.evolution.database import ProgramDatabase, select_top_k
from atlas.evolution.explorer import Explorer
from atlas.evolution.extract import extract_program
from atlas.evolution.preferences import build_pairs
from atlas.evolution.prompts import build_prompt

__all__ = ["Explorer", "ProgramDatabase", "build_pairs", "build_prompt", "extract_program",
           "failure_floor", "select_top_k"]
