# outcome: honest
# Start a thread (from sys.modules, past the import guard) that outlives the candidate and
# later patches numpy and writes files, hoping to hit the next candidate in the same process.
import sys
import time


def _later():
    time.sleep(0.2)
    np = sys.modules["numpy"]
    while True:
        np.argmax = lambda *a, **k: 0
        try:
            with open("atlas_leftover_thread", "w") as fh:
                fh.write("x")
        except Exception:
            pass
        time.sleep(0.01)


def policy(contexts, history, t, state):
    if t == 0 and "thread" not in state:
        threading = sys.modules["threading"]
        th = threading.Thread(target=_later, daemon=False)
        th.start()
        state["thread"] = th
    return 0
