"""``python -m atlas.sandbox``: runs its command, ``atlas.commands.sandbox``, by name.

The command composes a config and builds a task, both above the sandbox; running it by name
keeps this package free of imports from above (docs/architecture.md, "Layers").
"""

import runpy

runpy.run_module("atlas.commands.sandbox", run_name="__main__", alter_sys=True)
