# expect: exception
import subprocess


def policy(contexts, history, t, state):
    subprocess.run(["touch", "/tmp/atlas_hostile_subprocess"])
    return 0
