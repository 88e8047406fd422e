# expect: wrong_return
def policy(contexts, history, t, state):
    return len(contexts)
