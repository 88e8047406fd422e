# outcome: tampered
# Crash the trusted scorer's JSON decoder: a well-formed frame (magic, length) whose body is
# 200,000 nested lists. json.loads raises RecursionError, which is neither a ValueError nor a
# ProtocolError: unless the scorer classifies it, the scorer process dies (a crash of the
# trusted side) instead of reporting `tampered`.
import struct
import sys


def policy(contexts, history, t, state):
    if t == 0 and not state.get("sent"):
        state["sent"] = True
        protocol = sys.modules.get("atlas.sandbox.protocol")
        f = sys._getframe(1)
        while f is not None:
            link = f.f_locals.get("link")
            if link is not None and hasattr(link, "write_fd") and protocol is not None:
                depth = 200_000
                body = b'{"a": ' + b"[" * depth + b"]" * depth + b"}"
                frame = b"ATL1" + struct.pack(">I", len(body)) + body
                view = memoryview(frame)
                while view:
                    view = view[protocol._os_write(link.write_fd, view):]
                break
            f = f.f_back
    return 0
