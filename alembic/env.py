"""Authoring environment for pgqueue's revisions; the same body as the shipped env."""

from alembic import context
from pgqueue.migrations.authoring import run_environment

run_environment(context)
