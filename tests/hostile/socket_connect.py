# expect: exception
import socket


def policy(contexts, history, t, state):
    s = socket.create_connection(("1.1.1.1", 80), timeout=1)
    s.sendall(b"GET / HTTP/1.0\r\n\r\n")
    return 0
