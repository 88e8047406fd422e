# expect: exception
def dig(n):
    return dig(n + 1) + 1


def policy(contexts, history, t, state):
    return dig(0)
