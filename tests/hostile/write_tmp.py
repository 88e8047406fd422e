# expect: exception
def policy(contexts, history, t, state):
    with open("/tmp/atlas_hostile_tmp", "w") as fh:
        fh.write("pwned")
    return 0
