"""``configure_args``, the arguments of a host's ``context.configure``: pgqueue's hooks chained
with the host's own, never passed twice; and an ``alembic.ini`` whose ``path_separator`` cuts
pgqueue's location, refused with a line saying which setting to change."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from alembic.config import Config
from alembic.util import CommandError
from sqlalchemy import Column, Integer, MetaData, Table

from alembic import command
from pgqueue.migrations import configure_args


def table(name: str) -> Table:
    return Table(name, MetaData(), Column("id", Integer, primary_key=True))


def test_host_include_object_runs_after_pgqueues() -> None:
    seen: list[str | None] = []

    def host_filter(obj: Any, name: str | None, type_: str, reflected: bool, other: Any) -> bool:
        seen.append(name)
        return name != "audit"

    include = configure_args(include_object=host_filter)["include_object"]
    assert include(table("orders"), "orders", "table", False, None)
    assert not include(table("audit"), "audit", "table", False, None)
    # pgqueue's filter decides first: the host's never sees pgqueue's tables.
    assert not include(table("pgqueue_jobs"), "pgqueue_jobs", "table", False, None)
    assert seen == ["orders", "audit"]


def test_host_revision_hook_runs_after_pgqueues_and_other_arguments_pass_through() -> None:
    calls: list[str] = []

    def host_hook(context: Any, revision: Any, directives: list[Any]) -> None:
        calls.append("host")
        directives[:] = []

    args = configure_args(
        include_object=None, process_revision_directives=host_hook, compare_type=True
    )
    assert set(args) == {"include_object", "process_revision_directives", "compare_type"}
    assert args["compare_type"] is True

    class Context:
        script = None  # outside `alembic revision`: pgqueue's hook places nothing

    directives: list[Any] = ["revision"]
    args["process_revision_directives"](Context(), None, directives)
    assert calls == ["host"] and directives == []
    # Without a host hook, pgqueue's alone runs.
    configure_args()["process_revision_directives"](Context(), None, ["revision"])


def test_path_separator_that_cuts_pgqueues_location_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = Config(str(tmp_path / "alembic.ini"))
    command.init(config, str(tmp_path / "migrations"))
    ini = tmp_path / "alembic.ini"
    text = ini.read_text()
    # Today's `alembic init` writes `path_separator = os`; left as it is, it splits at ":".
    assert re.search(r"^path_separator = os$", text, flags=re.M)
    text = re.sub(
        r"^sqlalchemy\.url = .*$", f"sqlalchemy.url = sqlite:///{tmp_path}/x.db", text, flags=re.M
    )
    text = text.replace(
        "[alembic]\n",
        "[alembic]\nversion_locations = %(here)s/migrations/versions pgqueue:migrations/versions\n"
        "revision_environment = true\n",
        1,
    )
    ini.write_text(text)
    env = tmp_path / "migrations" / "env.py"
    generated = env.read_text()
    # Run in this process: the ini's logging setup would replace the test process's own
    # (fileConfig disables every logger configured before it).
    assert "    fileConfig(config.config_file_name)\n" in generated
    env.write_text(
        generated.replace("    fileConfig(config.config_file_name)\n", "    pass\n").replace(
            "connection=connection, target_metadata=target_metadata\n",
            "connection=connection, target_metadata=target_metadata,"
            " **__import__('pgqueue.migrations').migrations.configure_args()\n",
        )
    )
    with pytest.raises(CommandError, match="set `path_separator = space`"):
        command.upgrade(Config(str(ini)), "heads")
