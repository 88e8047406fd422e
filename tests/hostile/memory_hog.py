# expect: killed
def policy(contexts, history, t, state):
    hog = []
    while True:
        hog.append(bytearray(16 << 20))
        hog[-1][::4096] = b"x" * len(hog[-1][::4096])
