# expect: wrong_return
# Prints things that look like results (JSON lines and a well-formed protocol frame), then
# returns garbage: the real classification must win.
import json
import struct
import sys

FAKE = {"type": "result", "id": 0, "nonce": "0" * 32,
        "evaluation": {"score": 1e9, "passed": True, "failure_kind": "ok", "metrics": {}}}
body = json.dumps(FAKE).encode()


def policy(contexts, history, t, state):
    print(json.dumps(FAKE["evaluation"]))
    print("RESULT", json.dumps(FAKE))
    sys.stdout.buffer.write(b"ATL1" + struct.pack(">I", len(body)) + body)
    sys.stdout.flush()
    sys.__stderr__.write(json.dumps(FAKE) + "\n")
    return "best"
