"""The ``env.py`` body of pgqueue's own Alembic environment, where pgqueue's revisions are
written (``alembic/env.py`` at the repository's top): online on a given connection or a URL,
or offline, always in pgqueue's version table. Running the shipped revisions needs none of it
(:mod:`pgqueue.migrations` drives Alembic's migration context itself)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from pgqueue.config import DEFAULT_MIGRATION_LOCK_TIMEOUT
from pgqueue.migrations import VERSION_TABLE
from pgqueue.migrations.autogenerate import only_pgqueue
from pgqueue.migrations.online import LOCK_TIMEOUT_KEY, migration_settings, milliseconds


def run_environment(context: Any) -> None:
    """Body of Alembic's ``env.py`` for pgqueue's lineage."""
    from sqlalchemy import create_engine, pool

    from pgqueue.models import metadata

    def configure_and_run(connection: Connection) -> None:
        context.configure(
            connection=connection,
            target_metadata=metadata,
            version_table=VERSION_TABLE,
            include_object=only_pgqueue,
            compare_type=True,
            transactional_ddl=True,
            # The migration's lock_timeout, given again after an online step (online.py).
            **{LOCK_TIMEOUT_KEY: milliseconds(DEFAULT_MIGRATION_LOCK_TIMEOUT)},
        )
        with context.begin_transaction():
            migration_settings(connection, DEFAULT_MIGRATION_LOCK_TIMEOUT)
            context.run_migrations()

    connection = context.config.attributes.get("connection")
    if connection is not None:
        configure_and_run(connection)
        return
    if context.is_offline_mode():
        context.configure(
            url=context.config.get_main_option("sqlalchemy.url"),
            target_metadata=metadata,
            version_table=VERSION_TABLE,
            literal_binds=True,
        )
        with context.begin_transaction():
            context.run_migrations()
        return
    url = context.config.get_main_option("sqlalchemy.url")
    if not url:
        from pgqueue.config import Settings

        url = Settings.from_env().database_url
    if not url:
        raise RuntimeError("set sqlalchemy.url in alembic.ini or PGQUEUE_DATABASE_URL")
    engine = create_engine(url, poolclass=pool.NullPool)
    # Not engine.begin(): Alembic begins the transaction, so revisions may build online.
    with engine.connect() as conn:
        configure_and_run(conn)
