# expect: exception
import os


def policy(contexts, history, t, state):
    os._exit(0)
