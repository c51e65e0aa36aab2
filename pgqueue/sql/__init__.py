"""Every statement pgqueue runs, built with SQLAlchemy constructs; pure (no I/O here).

One module per topic: ``enqueue``, ``claim``, ``outcomes``, ``maintenance``, ``control``,
``admin``, and ``server`` (databases and sessions rather than jobs); ``common`` holds the
fragments they share. Each builder returns an executable statement whose bind parameters its
docstring names, and is cached, so a statement is one object for the process's life and the
driver executor (``pgqueue.db``) compiles it once.
Batched statements take parallel arrays and ``unnest`` them, so a batch of any size is one
round trip and one statement.

State changes follow ``pgqueue.states``: each transition is an ``UPDATE`` guarded by the
transition's source states (and the lease token when the worker holding the job writes), so a
worker whose lease was lost updates 0 rows instead of overwriting someone else's outcome.
"""
