"""The ``pgqueue`` command imports what the command it runs uses, and no more: its start
(``pgqueue --help``, a command's own ``--help``) loads none of SQLAlchemy, psycopg, Alembic,
Rich, croniter, Flask, prometheus-client or OpenTelemetry, nor pgqueue's core, models,
migrations or worker; a command that reads tables (``stats``) loads no Alembic (its schema check
reads the version table with a plain SELECT and the shipped revisions from their files), no
croniter, and no worker.

Each check runs in a fresh interpreter (``python -c``): this test process has imported most of
pgqueue already. No database: ``stats`` is pointed at a port nothing listens on, and fails at
its first connection, after its imports. The head read from the revision files is checked
against Alembic's, and a lineage the file reader cannot read is left to Alembic.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pgqueue
from pgqueue.migrations import shipped

# The interpreter runs in the directory that holds the package imported here, so that it
# imports the same pgqueue (``python -c`` puts the working directory first on its path).
SOURCE_ROOT = Path(pgqueue.__file__).resolve().parents[1]

# A port nothing listens on: the connection is refused at once.
REFUSED_URL = "postgresql+psycopg://postgres:x@127.0.0.1:1/x?connect_timeout=5"

# What the command line's start must not load (a package stands for its submodules too).
NOT_AT_START = (
    "alembic",
    "croniter",
    "flask",
    "opentelemetry",
    "pgqueue.core",
    "pgqueue.migrations",
    "pgqueue.models",
    "pgqueue.worker",
    "prometheus_client",
    "psycopg",
    "rich",
    "sqlalchemy",
)

# What a command that only reads tables must not load.
NOT_FOR_STATS = (
    "alembic",
    "croniter",
    "flask",
    "mako",
    "opentelemetry",
    "pgqueue.worker",
    "prometheus_client",
)

_HELP = """
import json, sys
from pgqueue.cli import main
for args in (["--help"], ["stats", "--help"], ["worker", "--help"], ["migrate", "--help"]):
    try:
        main(args, prog_name="pgqueue")
    except SystemExit as exc:
        assert exc.code == 0, (args, exc.code)
print(json.dumps(sorted(sys.modules)))
"""

_STATS = """
import json, sys
from pgqueue.cli import main
try:
    main(["stats"], prog_name="pgqueue")
except SystemExit as exc:
    print(json.dumps({"code": exc.code, "modules": sorted(sys.modules)}))
"""

_HEAD = """
import json, sys
from pgqueue import migrations
print(json.dumps({"head": migrations.head(), "modules": sorted(sys.modules)}))
"""


def _run(code: str, **env: str) -> tuple[Any, str]:
    """The JSON ``code`` prints last in a fresh interpreter, and what it wrote on stderr."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    environment.update(env)
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=SOURCE_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


def _loaded(modules: list[str], packages: tuple[str, ...]) -> list[str]:
    """The ``packages`` of which ``modules`` holds the package itself or a submodule."""
    return [p for p in packages if any(m == p or m.startswith(p + ".") for m in modules)]


def test_the_command_line_starts_without_the_libraries_of_its_commands() -> None:
    modules, _ = _run(_HELP)
    assert "pgqueue.cli" in modules
    assert _loaded(modules, NOT_AT_START) == []


def test_stats_loads_neither_alembic_nor_the_worker() -> None:
    found, stderr = _run(_STATS, PGQUEUE_DATABASE_URL=REFUSED_URL)
    assert found["code"] == 2, stderr
    assert "Connection refused" in stderr, stderr
    # It got as far as the schema check before connecting.
    assert "pgqueue.core" in found["modules"]
    assert "pgqueue.migrations" in found["modules"]
    assert _loaded(found["modules"], NOT_FOR_STATS) == []


def test_the_shipped_head_is_read_without_alembic_and_is_alembics() -> None:
    found, _ = _run(_HEAD)
    assert _loaded(found["modules"], ("alembic",)) == []
    # Alembic's answers, from the revisions it imports.

    from alembic.script import ScriptDirectory

    from pgqueue import migrations

    script = ScriptDirectory.from_config(migrations.alembic_config())
    assert [found["head"]] == list(script.get_heads())
    assert migrations.head() == found["head"]
    lineage = shipped.lineage()
    assert lineage is not None
    assert lineage.revisions == {revision.revision for revision in script.walk_revisions()}


def _revision(directory: Path, name: str, revision: str, down_revision: str) -> None:
    (directory / f"{name}.py").write_text(
        f'"""{name}\n\nRevision ID: {revision}\n"""\n\n'
        f'revision: str = "{revision}"\n'
        f"down_revision: str | Sequence[str] | None = {down_revision}\n",
        encoding="utf-8",
    )


def test_a_lineage_read_otherwise_than_as_written_is_left_to_alembic(tmp_path: Path) -> None:
    _revision(tmp_path, "a_0001", "a_0001", "None")
    _revision(tmp_path, "a_0002", "a_0002", '"a_0001"')
    assert shipped.lineage(tmp_path) == shipped.Lineage(frozenset({"a_0001", "a_0002"}), "a_0002")
    # Two heads, then a merge revision (a tuple): Alembic's to read, not the file reader's.
    _revision(tmp_path, "a_0003", "a_0003", '"a_0001"')
    assert shipped.lineage(tmp_path) is None
    _revision(tmp_path, "a_0004", "a_0004", '("a_0002", "a_0003")')
    assert shipped.lineage(tmp_path) is None
