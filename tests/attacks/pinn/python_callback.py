# A Python callback inside the loss: if the trainer ran it, it would run candidate Python in
# the training process (here: a call counter that could, e.g., walk frames from there). The
# loss is exported and trained where no candidate Python runs, and a serialized export cannot
# carry a callback: a clear failure that names the fix ("no Python callbacks in the loss").
import jax
import jax.numpy as jnp

_CALLS = []


def _weight(progress):
    _CALLS.append(1)
    return progress * 0 + 10.0


def pinn_loss_strategy(residuals, ic_err, bc_err, extras):
    w = jax.pure_callback(_weight, jax.ShapeDtypeStruct((), jnp.float32), extras["progress"])
    return jnp.mean(residuals ** 2) + w * jnp.mean(ic_err ** 2) + w * jnp.mean(bc_err ** 2)
