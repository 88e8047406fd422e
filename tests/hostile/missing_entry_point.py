# expect: missing_entry_point
def choose(contexts, history, t, state):
    return 0
