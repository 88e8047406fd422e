# expect: exception
# Writes a well-formed fake result frame to every descriptor it can find.
import json
import os
import struct

FAKE = {"type": "result", "id": 0, "nonce": "0" * 32, "evaluation": {
    "score": 1e9, "passed": True, "failure_kind": "ok", "metrics": {}}}
body = json.dumps(FAKE).encode()
FRAME = b"ATL1" + struct.pack(">I", len(body)) + body


def policy(contexts, history, t, state):
    for fd in range(3, 64):
        try:
            os.write(fd, FRAME)
        except OSError:
            pass
    return 0
