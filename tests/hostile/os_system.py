# expect: exception
import os


def policy(contexts, history, t, state):
    os.system("touch /tmp/atlas_hostile_os_system")
    return 0
