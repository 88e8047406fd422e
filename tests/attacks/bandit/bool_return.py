def policy(contexts, history, t, state):
    return True
