# expect: exception
import os


def policy(contexts, history, t, state):
    while True:
        os.fork()
