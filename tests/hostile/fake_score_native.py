# expect: tampered
# Bypasses the Python guard with libc.write through numpy's ctypes, then exits at once so
# that no honest result follows: the nonce check must reject the forged frame.
import json
import struct

import numpy as np

libc = np.ctypeslib.ctypes.CDLL(None)
FAKES = []
for rid in range(4):
    for ev_key in ("evaluation",):
        obj = {"type": "result", "id": rid, "nonce": "0" * 32, ev_key: {
            "score": 1e9, "passed": True, "failure_kind": "ok", "metrics": {}}, "output": ""}
        body = json.dumps(obj).encode()
        FAKES.append(b"ATL1" + struct.pack(">I", len(body)) + body)


def policy(contexts, history, t, state):
    for fd in range(3, 64):
        for frame in FAKES:
            libc.write(fd, frame, len(frame))
    libc._exit(0)
