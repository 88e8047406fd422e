# outcome: honest
# Pids as a channel (issue 29). A receiver is a run whose pid (or the pid /proc/self names)
# lies at 200..203 modulo 256: it plays arm 1. Any other run is a sender: it starts threads
# until the pid counter stands at 199 modulo 256, so that the next runner, forked right after
# it, is a receiver. Contained: every runner is pid 1 of a pid namespace of its own, with a
# /proc of that namespace, so no run sees the counter another moved.
import os
import sys


def _pids():
    seen = {os.getpid()}
    try:
        seen.add(int(os.readlink("/proc/self")))
    except (OSError, ValueError):
        pass
    return seen


def policy(contexts, history, t, state):
    if "arm" not in state:
        state["arm"] = 0
        if any(200 <= p % 256 <= 203 for p in _pids()):
            state["arm"] = 1
        else:
            threading = sys.modules["threading"]
            for _ in range(300):
                th = threading.Thread(target=lambda: None)
                th.start()
                tid = th.native_id
                th.join()
                if tid % 256 == 199:
                    break
    return state["arm"]
