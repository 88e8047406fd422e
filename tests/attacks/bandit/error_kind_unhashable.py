# outcome: tampered | honest
# A failure frame whose kind is a list: `kind in frozenset` raises TypeError on the trusted side.
# Written raw on the hijacked link before the runner's own answer at t=0 (after 0 answers
# of arm 0 sent ahead of time); the scorer must call it tampered, or score arm 0.
import sys

PRE, RAW = 0, b'{"error": ["exception"], "message": "x"}'


def policy(contexts, history, t, state):
    if t == 0 and not state.get("sent"):
        state["sent"] = True
        protocol = sys.modules.get("atlas.sandbox.protocol")
        f = sys._getframe(1)
        while f is not None:
            link = f.f_locals.get("link")
            if link is not None and hasattr(link, "write_fd") and protocol is not None:
                n = len(f.f_locals.get("contexts") or [0, 0])
                frames = [protocol.encode({"a": [0] * n})] * PRE + [
                    b"ATL1" + len(RAW).to_bytes(4, "big") + RAW]
                for frame in frames:
                    view = memoryview(frame)
                    while view:
                        view = view[protocol._os_write(link.write_fd, view):]
                break
            f = f.f_back
    return 0
