# expect: timeout
def policy(contexts, history, t, state):
    while True:
        pass
