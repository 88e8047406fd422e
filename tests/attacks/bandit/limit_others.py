# outcome: blocked(prlimit64, sched_setscheduler)
# Poison every other process it can see (issue 29): for each pid in /proc, the scorer's and
# the zygote's host pids (TARGET_PIDS, filled in by the test) and 1..400,
# lower its address-space limit to 1 MB and its CPU limit to 1 s, and make it SCHED_IDLE,
# through ctypes taken from sys.modules; a concurrent honest candidate in another worker then
# dies, and a zygote so limited starts every later runner broken. Contained: the runner
# names no other process (own pid namespace) and the filter refuses other pids.
import os
import sys

TARGETS = [int(p) for p in "TARGET_PIDS".strip("[]").split(",") if p.strip()]


def policy(contexts, history, t, state):
    if t == 0:
        ctypes = sys.modules["ctypes"]
        libc = ctypes.CDLL(None, use_errno=True)
        try:
            pids = {int(n) for n in os.listdir("/proc") if n.isdigit()}
        except OSError:
            pids = set()
        tiny = (ctypes.c_uint64 * 2)(1 << 20, 1 << 20)
        cpu = (ctypes.c_uint64 * 2)(1, 1)
        param = ctypes.c_int(0)
        for pid in (pids | set(TARGETS) | set(range(1, 400))) - {os.getpid()}:
            libc.prlimit(pid, 9, tiny, None)  # RLIMIT_AS
            libc.prlimit(pid, 0, cpu, None)  # RLIMIT_CPU
            libc.sched_setscheduler(pid, 5, ctypes.byref(param))  # SCHED_IDLE
    return 0
