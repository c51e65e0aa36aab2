"""pgqueue's Alembic lineage: matches the models, round-trips, and lives beside a host's."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import (
    Column,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    event,
    inspect,
    text,
)
from sqlalchemy.engine import URL
from support.host_alembic import owned_transaction_config
from support.processes import run_pgqueue

from alembic import command
from pgqueue import migrations
from pgqueue.errors import SchemaRecordedElsewhere
from pgqueue.models import metadata as pgqueue_metadata


def _pgqueue_tables(url: URL) -> set[str]:
    engine = create_engine(url)
    try:
        return {
            t
            for t in inspect(engine).get_table_names()
            if t.startswith("pgqueue_") and not migrations.is_history_partition(t)
        }
    finally:
        engine.dispose()


def test_migrated_schema_equals_models(database_url: URL) -> None:
    engine = create_engine(database_url)
    with engine.connect() as connection:
        context = MigrationContext.configure(
            connection,
            opts={
                "version_table": migrations.VERSION_TABLE,
                "compare_type": True,
                "include_object": lambda obj, name, type_, reflected, compare_to: (
                    not migrations.include_object(obj, name, type_, reflected, compare_to)
                    and name != migrations.VERSION_TABLE
                    and not (type_ == "table" and migrations.is_history_partition(name))
                ),
            },
        )
        diff = compare_metadata(context, pgqueue_metadata)
    engine.dispose()
    assert diff == []


def test_upgrade_downgrade_upgrade(empty_database_url: URL) -> None:
    engine = create_engine(empty_database_url)
    with engine.begin() as connection:
        assert migrations.current(connection) is None
        migrations.upgrade(connection)
        assert migrations.current(connection) == migrations.head()
    assert _pgqueue_tables(empty_database_url) == {
        *(t.name for t in pgqueue_metadata.sorted_tables),
        migrations.VERSION_TABLE,
    }
    with engine.begin() as connection:
        migrations.downgrade(connection, "base")
        assert migrations.current(connection) is None
        # No function of pgqueue's is left behind (0001's trigger function, 0020's enqueue).
        functions = connection.execute(
            text("SELECT count(*) FROM pg_proc WHERE proname LIKE 'pgqueue\\_%'")
        ).scalar_one()
        assert functions == 0
    assert _pgqueue_tables(empty_database_url) == {migrations.VERSION_TABLE}
    with engine.begin() as connection:
        migrations.upgrade(connection)
        assert migrations.current(connection) == migrations.head()
    assert "pgqueue_jobs" in _pgqueue_tables(empty_database_url)
    engine.dispose()


def _host_metadata() -> MetaData:
    host = MetaData()
    Table("orders", host, Column("id", Integer, primary_key=True), Column("item", String(50)))
    return host


def test_host_autogenerate_with_include_object_proposes_nothing(database_url: URL) -> None:
    host = _host_metadata()
    engine = create_engine(database_url)
    with engine.begin() as connection:
        host.create_all(connection)
    with engine.connect() as connection:
        without_helper = compare_metadata(MigrationContext.configure(connection), host)
        with_helper = compare_metadata(
            MigrationContext.configure(
                connection, opts={"include_object": migrations.include_object}
            ),
            host,
        )
    engine.dispose()
    # Without the helper the host would drop pgqueue's tables: the helper is what prevents it.
    dropped = {d[1].name for d in without_helper if d[0] == "remove_table"}
    assert {"pgqueue_jobs", "pgqueue_message_queue"} <= dropped
    assert with_helper == []


HOST_ENV = """
from alembic import context
from pgqueue.migrations import include_object

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=None, include_object=include_object)
with context.begin_transaction():
    context.run_migrations()
"""

HOST_REVISION = '''
"""host revision that creates orders and pins pgqueue's schema"""
import sqlalchemy as sa
from alembic import op

revision = "host_0001"
down_revision = None
branch_labels = ("host",)
depends_on = None


def upgrade():
    op.create_table("orders", sa.Column("id", sa.Integer, primary_key=True))
    from pgqueue import migrations
    migrations.upgrade(op.get_bind(), "pgqueue_0001")


def downgrade():
    op.drop_table("orders")
'''


def _host_config(tmp_path: Path, connection: object, *, with_pgqueue_location: bool) -> Config:
    (tmp_path / "versions").mkdir(exist_ok=True)
    (tmp_path / "env.py").write_text(textwrap.dedent(HOST_ENV))
    config = Config()
    config.set_main_option("script_location", str(tmp_path))
    locations = [str(tmp_path / "versions")]
    if with_pgqueue_location:
        locations.append(migrations.VERSION_LOCATION)
    config.set_main_option("path_separator", "space")
    config.set_main_option("version_locations", " ".join(locations))
    config.attributes["connection"] = connection
    return config


def test_host_revision_calls_pgqueue_upgrade(empty_database_url: URL, tmp_path: Path) -> None:
    engine = create_engine(empty_database_url)
    with engine.begin() as connection:
        config = _host_config(tmp_path, connection, with_pgqueue_location=False)
        (tmp_path / "versions" / "host_0001.py").write_text(textwrap.dedent(HOST_REVISION))
        command.upgrade(config, "heads")
    with engine.connect() as connection:
        assert migrations.current(connection) == "pgqueue_0001"
        host_version = connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
        assert host_version == "host_0001"
    assert "pgqueue_jobs" in _pgqueue_tables(empty_database_url)
    engine.dispose()


def test_host_version_locations_include_pgqueue(empty_database_url: URL, tmp_path: Path) -> None:
    engine = create_engine(empty_database_url)
    with engine.begin() as connection:
        config = _host_config(tmp_path, connection, with_pgqueue_location=True)
        command.upgrade(config, "pgqueue@head")
    with engine.connect() as connection:
        recorded = connection.execute(text("SELECT version_num FROM alembic_version")).scalars()
        assert set(recorded) == {migrations.head()}
    assert "pgqueue_jobs" in _pgqueue_tables(empty_database_url)
    engine.dispose()


def test_a_lineage_the_host_records_is_left_to_the_host(
    empty_database_url: URL, tmp_path: Path
) -> None:
    engine = create_engine(empty_database_url)
    with engine.begin() as connection:
        config = _host_config(tmp_path, connection, with_pgqueue_location=True)
        command.upgrade(config, "pgqueue_0017")
    with engine.begin() as connection:
        assert migrations.recorded(connection) == migrations.Recorded(
            "pgqueue_0017", migrations.HOST_VERSION_TABLE
        )
        assert migrations.current(connection) == "pgqueue_0017"
        # Already applied by the host's Alembic: nothing to do, and no version table of ours.
        migrations.upgrade(connection, "pgqueue_0016")
        with pytest.raises(SchemaRecordedElsewhere, match=r"alembic upgrade pgqueue@head"):
            migrations.upgrade(connection)
        with pytest.raises(SchemaRecordedElsewhere, match=r"alembic downgrade pgqueue@base"):
            migrations.downgrade(connection, "base")
        assert not inspect(connection).has_table(migrations.VERSION_TABLE)
    done = run_pgqueue("migrate", url=empty_database_url)
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1, done.stderr
    assert "is at pgqueue_0017, recorded in alembic_version" in done.stderr
    engine.dispose()


def test_tables_without_a_recorded_revision_are_not_created_again(database_url: URL) -> None:
    engine = create_engine(database_url)
    with engine.begin() as connection:
        connection.execute(text(f"DELETE FROM {migrations.VERSION_TABLE}"))
    with engine.begin() as connection:
        assert migrations.current(connection) is None
        with pytest.raises(SchemaRecordedElsewhere, match="records their revision"):
            migrations.upgrade(connection)
    engine.dispose()


def test_0003_drops_the_ticket_foreign_key_and_trigger_and_downgrade_restores_them(
    empty_database_url: URL,
) -> None:
    """0003 leaves tickets without the foreign key and the NOTIFY trigger; its downgrade first
    deletes tickets whose job is gone (the constraint could not be added over them), then puts
    both back, cascade included."""

    def ticket_fk_and_trigger(connection: object) -> tuple[int, int]:
        fks = connection.execute(  # type: ignore[attr-defined]
            text(
                "SELECT count(*) FROM pg_constraint"
                " WHERE conrelid = 'pgqueue_message_queue'::regclass AND contype = 'f'"
            )
        ).scalar_one()
        triggers = connection.execute(  # type: ignore[attr-defined]
            text(
                "SELECT count(*) FROM pg_trigger"
                " WHERE tgrelid = 'pgqueue_message_queue'::regclass AND NOT tgisinternal"
            )
        ).scalar_one()
        return fks, triggers

    engine = create_engine(empty_database_url)
    with engine.begin() as connection:
        migrations.upgrade(connection, "pgqueue_0002")
        assert ticket_fk_and_trigger(connection) == (1, 1)
        migrations.upgrade(connection, "pgqueue_0003")
        assert ticket_fk_and_trigger(connection) == (0, 0)
        connection.execute(
            text(
                "INSERT INTO pgqueue_jobs (id, task_name, queue) VALUES (1, 't', 'q'), (2, 't', 'q');"
                " INSERT INTO pgqueue_message_queue (job_id, queue) VALUES (1, 'q'), (2, 'q');"
                " DELETE FROM pgqueue_jobs WHERE id = 2"
            )
        )
        migrations.downgrade(connection, "pgqueue_0002")
        assert ticket_fk_and_trigger(connection) == (1, 1)
        tickets = connection.execute(text("SELECT job_id FROM pgqueue_message_queue")).all()
        assert tickets == [(1,)]
        connection.execute(text("DELETE FROM pgqueue_jobs WHERE id = 1"))  # the cascade is back
        assert connection.execute(text("SELECT count(*) FROM pgqueue_message_queue")).scalar() == 0
        migrations.upgrade(connection)
        assert ticket_fk_and_trigger(connection) == (0, 0)
    engine.dispose()


def test_migrated_check_constraints_equal_the_models(
    database_url: URL, empty_database_url: URL
) -> None:
    """Autogenerate does not compare CHECK constraints: compare them here, by name and by
    PostgreSQL's own rendering, between the migrated schema and ``create_all`` of the models."""

    def checks(url: URL) -> dict[str, str]:
        engine = create_engine(url)
        try:
            with engine.connect() as connection:
                rows = connection.execute(
                    text(
                        "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
                        " WHERE contype = 'c' AND conrelid::regclass::text LIKE 'pgqueue%'"
                    )
                ).all()
        finally:
            engine.dispose()
        return dict(rows)  # type: ignore[arg-type]

    engine = create_engine(empty_database_url)
    with engine.begin() as connection:
        pgqueue_metadata.create_all(connection)
    engine.dispose()
    migrated = checks(database_url)
    assert "ck_pgqueue_jobs_state_valid" in migrated
    assert migrated == checks(empty_database_url)


def _id_array_storage(connection: Any) -> dict[tuple[str, str], str]:
    """``attstorage`` of the arrays of job ids, by (table, column), partitions of the history
    included."""
    rows = connection.execute(
        text(
            "SELECT c.relname, a.attname, a.attstorage FROM pg_attribute a"
            " JOIN pg_class c ON c.oid = a.attrelid"
            " WHERE c.relname LIKE 'pgqueue\\_%' AND c.relkind IN ('r', 'p')"
            " AND a.attname IN ('depends_on', 'dependents', 'final_job_ids')"
        )
    ).all()
    return {(table, column): storage for table, column, storage in rows}


def test_0024_stores_id_arrays_uncompressed_and_downgrade_compresses_them(
    empty_database_url: URL,
) -> None:
    engine = create_engine(empty_database_url)
    try:
        with engine.begin() as c:
            migrations.upgrade(c, "pgqueue_0023")
            c.execute(
                text(
                    "CREATE TABLE pgqueue_job_history_p20261126 PARTITION OF"
                    " pgqueue_job_history FOR VALUES FROM ('2026-11-26') TO ('2026-11-27')"
                )
            )
            before = _id_array_storage(c)
            migrations.upgrade(c)
            after = _id_array_storage(c)
            migrations.downgrade(c, "pgqueue_0023")
            down = _id_array_storage(c)
    finally:
        engine.dispose()
    # jobs (2), history, its default partition and a day's (2 each), workflows (1)
    assert len(after) == 9
    assert set(before.values()) == {"x"}
    assert set(after.values()) == {"e"}
    assert down == before


STATE_INDEXES = ("ix_pgqueue_jobs_queue_state_id", "ix_pgqueue_jobs_task_name_state_id")


def _state_indexes(connection: Any) -> dict[str, tuple[str | None, bool]]:
    """The predicate and validity of each index of ``pgqueue_jobs`` whose name starts like the
    dashboard's two state indexes (a leftover ``_swap`` build would show here)."""
    rows = connection.execute(
        text(
            "SELECT c.relname, pg_get_expr(i.indpred, i.indrelid), i.indisvalid"
            " FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid"
            " WHERE c.relname LIKE 'ix\\_pgqueue\\_jobs\\_%state\\_id%'"
        )
    ).all()
    return {name: (predicate, valid) for name, predicate, valid in rows}


def _insert_jobs_in_three_states(connection: Any) -> None:
    connection.execute(
        text(
            "INSERT INTO pgqueue_jobs (task_name, queue, state)"
            " SELECT 't', 'q', (ARRAY['queued', 'running', 'succeeded'])[i % 3 + 1]"
            " FROM generate_series(1, 3000) AS i"
        )
    )


def _succeeded_through_the_index(connection: Any) -> int:
    """The succeeded jobs of queue ``q``, counted with sequential scans off: read off the
    ``(queue, state, id)`` index whichever form it has."""
    connection.execute(text("SET LOCAL enable_seqscan = off"))
    return int(
        connection.execute(
            text(
                "SELECT count(*) FROM pgqueue_jobs"
                " WHERE queue = 'q' AND state = 'succeeded' AND state <> 'running'"
            )
        ).scalar_one()
    )


FULL = {name: (None, True) for name in STATE_INDEXES}
WITHOUT_RUNNING = {name: ("((state)::text <> 'running'::text)", True) for name in STATE_INDEXES}


def test_0025_leaves_running_jobs_out_of_the_state_indexes_and_downgrade_puts_them_back(
    empty_database_url: URL,
) -> None:
    engine = create_engine(empty_database_url)
    try:
        with engine.begin() as c:
            migrations.upgrade(c, "pgqueue_0024")
            _insert_jobs_in_three_states(c)
            assert _state_indexes(c) == FULL
            migrations.upgrade(c)
            assert _state_indexes(c) == WITHOUT_RUNNING
            assert _succeeded_through_the_index(c) == 1000
            migrations.downgrade(c, "pgqueue_0024")
            assert _state_indexes(c) == FULL
            assert _succeeded_through_the_index(c) == 1000
            migrations.upgrade(c)
            assert _state_indexes(c) == WITHOUT_RUNNING
    finally:
        engine.dispose()


def test_0025_swaps_the_state_indexes_concurrently_when_alembic_owns_the_transaction(
    empty_database_url: URL, tmp_path: Path
) -> None:
    engine = create_engine(empty_database_url)
    statements: list[str] = []
    try:
        with engine.connect() as connection:
            config = owned_transaction_config(tmp_path, connection)
            command.upgrade(config, "pgqueue@pgqueue_0024")
            _insert_jobs_in_three_states(connection)
            connection.commit()
            event.listen(
                engine, "before_cursor_execute", lambda *a: statements.append(a[2]), named=False
            )
            command.upgrade(config, "pgqueue@head")
            assert _state_indexes(connection) == WITHOUT_RUNNING
            connection.commit()
            built = [s for s in statements if s.startswith("CREATE INDEX CONCURRENTLY")]
            assert len(built) == 2 and all("WHERE state <> 'running'" in s for s in built)
            statements.clear()
            command.downgrade(config, "pgqueue@pgqueue_0024")
            assert _state_indexes(connection) == FULL
            built = [s for s in statements if s.startswith("CREATE INDEX CONCURRENTLY")]
            assert len(built) == 2 and not any("WHERE" in s for s in built)
            count = connection.execute(text("SELECT count(*) FROM pgqueue_jobs")).scalar_one()
            assert count == 3000
            connection.commit()
    finally:
        engine.dispose()
