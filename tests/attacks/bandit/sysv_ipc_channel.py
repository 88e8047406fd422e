# outcome: blocked(shmget, msgget, semget)
# A channel to the next candidate through kernel objects that outlive the process: SysV shared
# memory, a SysV message queue and a semaphore set under fixed keys (seccomp allowed
# shmget/msgget/semget; bubblewrap's IPC namespace is per worker, not per runner, and the
# rlimits mode shares the host's). The test runs every attack twice: if the second run finds
# what the first left, it plays arm 1 instead of arm 0 (a score other than the honest one),
# and removes what it found.
KEYS = (0xA7150, 0xA7151, 0xA7152)
IPC_CREAT, IPC_RMID = 0o1000, 0


def _libc():
    scope = {"__name__": "not_candidate"}  # the guard only screens imports by `candidate`
    exec("import ctypes", scope)
    ctypes = scope["ctypes"]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    return ctypes, libc


def _leaked():
    ctypes, libc = _libc()
    shm, msq, sem = KEYS
    found = False
    sid = libc.shmget(shm, 0, 0)
    if sid >= 0:
        addr = libc.shmat(sid, None, 0)
        if addr not in (None, ctypes.c_void_p(-1).value):
            found = found or ctypes.string_at(addr, 6) == b"leaked"
            libc.shmdt(ctypes.c_void_p(addr))
        libc.shmctl(sid, IPC_RMID, None)
    qid = libc.msgget(msq, 0)
    if qid >= 0:
        found = True
        libc.msgctl(qid, IPC_RMID, None)
    semid = libc.semget(sem, 0, 0)
    if semid >= 0:
        found = True
        libc.semctl(semid, 0, IPC_RMID)
    if found:
        return True
    sid = libc.shmget(shm, 4096, IPC_CREAT | 0o666)
    if sid >= 0:
        addr = libc.shmat(sid, None, 0)
        if addr not in (None, ctypes.c_void_p(-1).value):
            ctypes.memmove(addr, b"leaked", 6)
    libc.msgget(msq, IPC_CREAT | 0o666)
    libc.semget(sem, 1, IPC_CREAT | 0o666)
    return False


_SEEN = []  # once per process: the environments are played in lockstep in one runner


def policy(contexts, history, t, state):
    if not _SEEN:
        _SEEN.append(_leaked())
    return 1 if _SEEN[0] else 0
