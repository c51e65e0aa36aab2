"""pgqueue's benchmark suite: pgqueue against a hand-written raw-SQL SKIP LOCKED baseline.

Run ``python -m benchmarks`` (full, about 5-10 minutes) or ``python -m benchmarks --quick``
(a smoke run under a minute, used by CI) from the repository root. See ``BENCHMARKS.md``.
"""
