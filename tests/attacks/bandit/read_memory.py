# Look for the hidden state in memory it should not have: this process's objects, every
# readable mapping of every process it can see (/proc/<pid>/mem) searched for the run's secret
# (the test fills in SECRET_VALUE, as if the attacker could recognise it), the secret file
# (SECRET_PATH), and environment variables.
import gc
import os


def _search(pid, needle):
    with open(f"/proc/{pid}/maps") as fh:
        spans = [line.split()[0].split("-") for line in fh if " r" in line]
    with open(f"/proc/{pid}/mem", "rb") as fh:
        for lo, hi in spans:
            try:
                fh.seek(int(lo, 16))
                if needle in fh.read(min(int(hi, 16) - int(lo, 16), 1 << 26)):
                    return True
            except OSError:
                continue
    return False


def policy(contexts, history, t, state):
    if t == 0 and "found" not in state:
        found = [type(o).__name__ for o in gc.get_objects()
                 if type(o).__name__ in ("BanditEnv", "BanditScorer")]
        for pid in os.listdir("/proc"):
            if pid.isdigit() and int(pid) != os.getpid():
                try:
                    if _search(pid, b"SECRET_VALUE"):
                        found.append(("memory of", pid))
                except Exception:
                    pass
        try:
            with open("SECRET_PATH") as fh:
                found.append(fh.read())
        except Exception:
            pass
        found += [v for k, v in os.environ.items() if "SECRET" in k.upper()]
        state["found"] = found
    if state["found"]:
        raise RuntimeError(f"reached hidden state: {repr(state['found'][0])[:80]}")
    return 0
