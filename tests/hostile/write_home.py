# expect: exception
import pwd


def policy(contexts, history, t, state):
    home = pwd.getpwuid(0).pw_dir
    with open(home + "/.atlas_hostile_home", "w") as fh:
        fh.write("pwned")
    return 0
