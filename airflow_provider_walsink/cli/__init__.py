"""The ``walsink`` command: commit state, history, abort, GC and migrations (the parser and
``main`` in ``cli/commands.py``, one module per group of commands beside it)."""
