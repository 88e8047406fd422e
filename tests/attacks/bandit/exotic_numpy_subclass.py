# outcome: wrong_return
# A numpy integer subclass-like value and a 0-d array: neither is an int arm.
import numpy as np


class Weird(np.ndarray):
    def __int__(self):
        return 0


def policy(contexts, history, t, state):
    if t % 2:
        return np.array(1).view(Weird)
    return np.array([1])
