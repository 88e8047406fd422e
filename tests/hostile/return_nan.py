# expect: non_finite
def policy(contexts, history, t, state):
    return float("nan")
