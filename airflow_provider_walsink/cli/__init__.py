"""The ``walsink`` command (``cli/commands.py``): commit state, history, abort, GC and migrations."""
