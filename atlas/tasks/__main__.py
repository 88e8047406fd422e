"""``python -m atlas.tasks``: runs its command, ``atlas.commands.tasks``, by name.

The command composes a config (``atlas.compose``, above the tasks); running it by name keeps
this package free of imports from above (docs/architecture.md, "Layers").
"""

import runpy

runpy.run_module("atlas.commands.tasks", run_name="__main__", alter_sys=True)
