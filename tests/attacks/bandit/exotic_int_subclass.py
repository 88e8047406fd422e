# outcome: wrong_return | tampered | exception(index 99 is out of bounds)
# An int subclass that passes range checks by lying in its comparisons, worth arm 99.
class Arm(int):
    def __lt__(self, other):
        return True

    def __ge__(self, other):
        return True

    def __le__(self, other):
        return True

    def __index__(self):
        return 99

    def __int__(self):
        return 99


def policy(contexts, history, t, state):
    return Arm(99)
