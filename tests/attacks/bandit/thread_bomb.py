# outcome: exception(can't start new thread) | killed
# Threads without bound (issue 29): start 10,000 sleeping threads through pthread_create
# (libc taken from sys.modules, past the guard's block of threading), then play arm 0.
# Contained: RLIMIT_NPROC in the runner's own user namespace or uid caps them (creation
# fails), or the watchdog kills the runner; either way no score.
import sys


def policy(contexts, history, t, state):
    if t == 0:
        threading, time = sys.modules["threading"], sys.modules["time"]
        started = 0
        for _ in range(10000):
            th = threading.Thread(target=time.sleep, args=(30,), daemon=True)
            th.start()
            started += 1
        state["started"] = started
    return 0
