# expect: ok
import sys

LINE = "x" * 1023 + "\n"


def policy(contexts, history, t, state):
    if t == 0:
        for _ in range(8 * 1024):  # 8 MB to stdout, 8 MB to stderr
            print(LINE, end="")
            sys.stderr.write(LINE)
    return 0
