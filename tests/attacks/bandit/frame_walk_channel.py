# outcome: tampered
# Find the result channel in the caller's frames and send a forged answer / result on it.
import sys


def policy(contexts, history, t, state):
    f = sys._getframe(1)
    while f is not None:
        for value in list(f.f_locals.values()):
            if hasattr(value, "send") and hasattr(value, "write_fd"):
                value.send({"evaluation": {"score": 0.0, "passed": True}, "a": [0] * 64})
                value.send({"type": "result", "score": 1e9, "passed": True})
        f = f.f_back
    return 0
