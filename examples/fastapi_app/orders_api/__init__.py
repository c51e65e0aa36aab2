"""A small orders service on FastAPI: creating an order enqueues a job that sends its receipt,
in the same ``AsyncSession`` transaction.

Run it (see ../README.md)::

    python -m orders_api init-db                       # pgqueue's tables and the service's
    uvicorn orders_api.app:app                         # the web app
    pgqueue worker orders_api.tasks:pgq                # the worker, in another terminal
"""
