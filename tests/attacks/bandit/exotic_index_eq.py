# outcome: wrong_return
# An object with __index__ and __eq__ tricks (equal to everything).
class Sneaky:
    def __index__(self):
        return 0

    def __eq__(self, other):
        return True

    def __hash__(self):
        return 0


def policy(contexts, history, t, state):
    return Sneaky()
