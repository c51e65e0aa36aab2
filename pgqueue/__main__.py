"""``python -m pgqueue``: the same as the ``pgqueue`` command."""

from pgqueue.cli import entrypoint

entrypoint()
