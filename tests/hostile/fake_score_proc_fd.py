# expect: exception
# Reaches the protocol pipes through /proc/self/fd and io.FileIO.
import io
import json
import os
import struct

body = json.dumps({"nonce": "0" * 32, "evaluation": {"score": 1e9, "passed": True}}).encode()
FRAME = b"ATL1" + struct.pack(">I", len(body)) + body


def policy(contexts, history, t, state):
    for name in os.listdir("/proc/self/fd"):
        for opener in (lambda n=name: open("/proc/self/fd/" + n, "wb"),
                       lambda n=name: io.FileIO(int(n), "w", closefd=False)):
            try:
                with opener() as fh:
                    fh.write(FRAME)
            except (OSError, ValueError):
                pass
    return 0
