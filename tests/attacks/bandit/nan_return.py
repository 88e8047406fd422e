# outcome: wrong_return
def policy(contexts, history, t, state):
    return float("nan")
