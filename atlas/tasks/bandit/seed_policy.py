import numpy as np


def policy(contexts, history, t, state):
    # Sliding-window LinUCB: ridge regression on the last `window` steps only,
    # so the estimate can follow a drifting theta.
    window, alpha, lam = 50, 1.0, 1.0
    d = contexts.shape[1]
    A = lam * np.eye(d)
    b = np.zeros(d)
    recent = history[-window:]
    if recent:
        X = np.array([x for _, x, _ in recent])
        y = np.array([r for _, _, r in recent])
        A += X.T @ X
        b += X.T @ y
    A_inv = np.linalg.inv(A)
    theta = A_inv @ b
    bonus = np.sqrt(np.sum((contexts @ A_inv) * contexts, axis=1))
    return int(np.argmax(contexts @ theta + alpha * bonus))
