"""Every statement pgqueue runs, its migrations' revision scripts aside: pure builders, no I/O.

Statements are SQLAlchemy constructs. Those that run on a raw psycopg connection (``COPY``,
``LISTEN``, ``DISCARD PLANS``, naming a session, reading a server's data directory) are composed
by psycopg. Values are binds and names are quoted by the dialect or by psycopg: no SQL text is
formatted from input (``tests/unit/test_no_pickle_no_fstring_sql.py``). One module per topic:

- adding jobs: ``enqueue`` (a plan's ids, rows by ``unnest`` or ``COPY``, tickets and workflow
  row, the one-row insert, unique keys), ``queue_bounds`` (a bounded queue's depth, its
  enqueuers' locks, the bound);
- running them: ``claim`` (with ``flow``, per-key limits and rate limits), ``atomic_runs`` (an
  atomic job's row lock), ``outcomes`` (what became of running jobs, and the heartbeat),
  ``dependencies`` (settling the jobs that wait on others), ``signals`` (durable sleep and
  signals), ``steps`` (durable steps), ``workflows`` (closing, reading, cancelling one);
- the worker's upkeep: ``maintenance`` (rescue, pruning, counters), ``workers`` (the registry),
  ``history`` (the partitioned history's move and partitions);
- operators: ``control`` and ``flow_settings`` (queue switches, key overrides, rates, schedule
  ticks), ``admin`` and ``job_lists`` (one job, counts, lists, manual actions), ``bulk`` (the
  actions by filter and their audit record), ``explain`` ("why isn't this job running?");
- ``schema``: what the migrations run around their revisions; ``server``: databases and
  sessions rather than jobs;
- ``common``: the fragments the others share.

Each builder's docstring names the binds of its statement. Most builders are cached, so their
statement is one object for the process's life and the driver's executor (``pgqueue.driver``)
compiles it once. The others build anew at each call: those that take what the statement's text
depends on (a database's name, a partition's day, a bulk action's filter), the fragments, and a
few that run rarely (the partitioned history's DDL, the ``COPY`` of a workflow's jobs). Batched statements take parallel arrays and ``unnest`` them, so a batch of any
size is one statement and one round trip.

State changes follow ``pgqueue.states``: each transition is an ``UPDATE`` guarded by the
transition's source states (and the lease token when the worker holding the job writes), so a
worker whose lease was lost updates 0 rows instead of overwriting someone else's outcome.

The data layer (``pgqueue.data``) runs these statements and is the only importer of this package,
``server``'s connection statements aside (``tests/unit/test_import_layers.py``).
"""
