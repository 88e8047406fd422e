# outcome: wrong_return
def policy(contexts, history, t, state):
    return 10 ** 100
