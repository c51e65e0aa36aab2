"""The data layer: one module per topic of ``pgqueue.sql``, each operation a function that takes
a caller's ``Session`` or an ``db.Executor`` and never commits.

It translates between Python values and the bind parameters of ``pgqueue.sql``'s statements and
is meant to be their only user (``sql.server``'s connection statements aside); callers import
the topic's module, e.g. ``from pgqueue.data import claim as claim_data``.
"""
