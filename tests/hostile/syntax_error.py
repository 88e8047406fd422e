# expect: syntax_error
def policy(contexts, history, t, state)
    return 0
