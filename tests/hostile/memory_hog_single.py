# expect: killed
import numpy as np


def policy(contexts, history, t, state):
    big = np.ones(64 << 30, dtype=np.uint8)
    return int(big[0])
