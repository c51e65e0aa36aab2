"""A randomized fault harness with an invariant checker for pgqueue's workers.

``python -m tests.chaos --seed S --minutes M [--database-url URL] [--bouncer]`` runs real
``pgqueue worker`` processes against a fresh database while a seeded workload enqueues a mix of
job kinds and a seeded injector kills, freezes and disconnects them; at the end it checks the
invariants of ``invariants.py`` and prints a report (exit code 1 on any violation).
``test_chaos.py`` runs it from pytest (marked slow) on fixed seeds.

``tests`` has no ``__init__.py`` (pytest puts ``tests`` on the path): it is a namespace package
for ``python -m tests.chaos``, and this package imports its own modules relatively, so it also
works as ``chaos`` under pytest.
"""
