"""The bin-packing baselines as program files: each module is a whole program, scored as a
candidate would be (``python -m atlas.score task=binpacking
atlas/tasks/binpacking/heuristics/best_fit.py``) and imported by the baselines command."""
