# outcome: blocked(add_key, request_key)
# A channel to the next candidate through the kernel keyring: add_key() to the user keyring
# of the runner's uid (nobody) outlives the process. The test runs every attack twice: a
# second run that finds the key plays arm 1 instead of arm 0, and revokes the key.
import platform

NR = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219)}.get(platform.machine())
KEY_SPEC_USER_KEYRING, KEYCTL_INVALIDATE = -4, 21


def _leaked():
    if NR is None:
        return False
    scope = {"__name__": "not_candidate"}
    exec("import ctypes", scope)  # the guard screens only imports by `candidate`
    ctypes = scope["ctypes"]
    libc = ctypes.CDLL(None, use_errno=True)
    add_key, request_key, keyctl = NR
    serial = libc.syscall(request_key, b"user", b"atlas_attack_leak", None, 0)
    if serial > 0:
        libc.syscall(keyctl, KEYCTL_INVALIDATE, serial)
        return True
    libc.syscall(add_key, b"user", b"atlas_attack_leak", b"x", 1, KEY_SPEC_USER_KEYRING)
    return False


_SEEN = []  # once per process: the environments are played in lockstep in one runner


def policy(contexts, history, t, state):
    if not _SEEN:
        _SEEN.append(_leaked())
    return 1 if _SEEN[0] else 0
