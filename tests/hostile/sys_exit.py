# expect: exception
import sys


def policy(contexts, history, t, state):
    sys.exit(0)
