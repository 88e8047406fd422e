# expect: ok
# Writing into the working directory (and ~, which points there) is allowed.
import os


def policy(contexts, history, t, state):
    with open("scratch.txt", "w") as fh:
        fh.write("fine")
    with open(os.path.expanduser("~/notes.txt"), "w") as fh:
        fh.write("fine")
    return 0
