"""Helpers the test files share, one module per kind, each helper in one version:

- ``polling``: ``wait_until``, waiting for an event (a row, a log line, a registered worker)
  rather than for a fixed time;
- ``workers``: ``in_thread``, a real worker in a thread of the test process for a ``with``
  block, and ``wait_for_heartbeats`` of a running job;
- ``processes``: the ``pgqueue`` command run as a user runs it, in an environment that names the
  database and the settings and nothing else of the run's: in-process (``cli_invoke``) or as a
  real subprocess;
- ``cli_invoke``: ``python -m pgqueue ...`` and ``python -m flask ...`` run in the test's
  process as a fresh process runs them (click's test runner), and everything they leave
  behind undone;
- ``locks``: the sessions waiting for a lock, and waiting until one does;
- ``network``: a free TCP port;
- ``dashboard``: the Flask dashboard on a test database, served over real HTTP, the headless
  Chromium that reads it, and a page's forms as a browser submits them;
- ``roles``: the role with DML rights only that the documentation has operators create;
- ``migration_runs``: ``pgqueue migrate`` as a user runs it, and a lock held beside it;
- ``examples``: how many examples a Hypothesis property runs (fewer in the quick loop);
- ``docs_pages``, ``flow_checks``, ``host_alembic``, ``json_rows``, ``same_values``,
  ``tracing_spans``: the checks and fixtures of one topic each, used by several files.

The tests directory is on pytest's path, so a test imports them as ``support.<module>``.
"""
