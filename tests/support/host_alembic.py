"""A host's Alembic whose ``env.py`` begins the migration's transaction itself, on a connection
the test gives: the setup under which pgqueue's revisions build indexes ``CONCURRENTLY``."""

from __future__ import annotations

from pathlib import Path

from alembic.config import Config
from sqlalchemy import Connection

from pgqueue import migrations

OWNED_TRANSACTION_ENV = """
from alembic import context

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=None)
with context.begin_transaction():
    context.run_migrations()
"""


def owned_transaction_config(directory: Path, connection: Connection) -> Config:
    """An Alembic config whose environment (written into ``directory``, with an empty
    ``versions`` of the host's own) runs pgqueue's lineage on ``connection`` in a transaction
    Alembic begins."""
    (directory / "versions").mkdir()
    (directory / "env.py").write_text(OWNED_TRANSACTION_ENV)
    config = Config()
    config.set_main_option("script_location", str(directory))
    config.set_main_option("path_separator", "space")
    config.set_main_option(
        "version_locations", f"{directory / 'versions'} {migrations.VERSION_LOCATION}"
    )
    config.attributes["connection"] = connection
    return config
