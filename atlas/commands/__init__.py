"""The command lines of packages that sit low in the house: ``python -m atlas.sandbox``
(``sandbox.py``) and ``python -m atlas.tasks`` (``tasks.py``). A command composes a config
and builds a task, so it stands above the sandbox and the tasks it serves; each package's
``__main__`` only runs its command here by name.
"""
