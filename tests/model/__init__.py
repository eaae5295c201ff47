"""The model-based checker of issue 22: random interleavings of every operation on one pipeline,
checked after every step against a reference model (:mod:`.world`, :mod:`.machine`;
``python -m tests.model --help``)."""
