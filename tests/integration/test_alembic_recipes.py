"""The recipes of docs/how-to/alembic.md for each kind of application, run with the real
command lines as the page writes them: its ``ini`` settings, its ``diff`` edits of the generated
``env.py`` and its ``console`` lines are read from the page, so page and test cannot drift
apart.

Each test starts on a fresh database from what the tool's own ``init`` wrote, follows its
section, then autogenerates once more (which must propose nothing, least of all on pgqueue's
tables) and checks that both pgqueue's head and the application's head are applied. The
recommended recipes are driven by the commands typed by habit (``alembic upgrade head``,
``flask db upgrade``): an upgrade brings pgqueue's tables to its head first (also after they
fell behind, as after installing a newer pgqueue), and no other command touches them.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import URL
from test_host_alembic_cli import MODELS

from pgqueue import migrations

REPOSITORY = Path(__file__).resolve().parents[2]
PAGE = REPOSITORY / "docs" / "how-to" / "alembic.md"
PGQUEUE_VERSIONS = Path(migrations.__file__).parent / "versions"
# The venv's console scripts (alembic, flask, pgqueue), found as a reader's shell finds them.
SCRIPTS = Path(sys.executable).parent


FLASK_APP = '''
"""A Flask-SQLAlchemy application with Flask-Migrate and pgqueue's extension."""
import os

from flask import Flask
from flask_migrate import Migrate
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from pgqueue.contrib.flask import PgQueue


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)
migrate = Migrate()
pgq = PgQueue(db=db)


class Order(db.Model):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    item: Mapped[str]


def create_app() -> Flask:
    app = Flask(__name__)
    app.config["SQLALCHEMY_DATABASE_URI"] = os.environ["PGQUEUE_DATABASE_URL"]
    db.init_app(app)
    migrate.init_app(app, db)
    pgq.init_app(app)
    return app
'''

REVISION_ID = re.compile(r"^revision(?::\s*str)?\s*=\s*['\"](\w+)['\"]", re.M)


def section(number: int) -> str:
    """The text of the page's section ``## {number}. ...`` (or ``###``)."""
    page = PAGE.read_text()
    found = re.search(rf"^###? {number}\. .*?(?=^##)", page, flags=re.S | re.M)
    assert found, f"no section {number} in {PAGE}"
    return found.group(0)


def blocks(text_: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text_, flags=re.S | re.M)


def commands(text_: str) -> list[list[str]]:
    (block,) = blocks(text_, "console")
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


def with_settings(ini: str, settings: str) -> str:
    """``ini`` with each ``key = value`` of ``settings`` set under ``[alembic]``, as the page
    says: a line already there is changed, a missing one added."""
    for line in settings.splitlines():
        key, value = (part.strip() for part in line.split(" = ", 1))
        ini, replaced = re.subn(
            rf"^{re.escape(key)} = .*$", lambda _m: f"{key} = {value}", ini, flags=re.M
        )
        if not replaced:
            ini = ini.replace("[alembic]\n", f"[alembic]\n{key} = {value}\n", 1)
    return ini


def patched(source: str, diff: str) -> str:
    """``source`` with one ``diff`` block of the page applied: its context and ``-`` lines must
    appear in ``source`` exactly once, as in the file the tool generated."""
    before, after = [], []
    for line in diff.splitlines():
        mark, rest = line[:1], line[1:]
        if mark in {" ", ""}:
            before.append(rest)
            after.append(rest)
        elif mark == "-":
            before.append(rest)
        else:
            assert mark == "+", line
            after.append(rest)
    old, new = "\n".join(before) + "\n", "\n".join(after) + "\n"
    assert source.count(old) == 1, f"the page's diff does not fit env.py:\n{old}"
    return source.replace(old, new)


class Project:
    """An application's directory, where the page's command lines run as a reader types them."""

    def __init__(self, root: Path, url: URL) -> None:
        self.root = root
        self.url = url.render_as_string(hide_password=False)
        self.env = {
            **os.environ,
            "PATH": os.pathsep.join([str(SCRIPTS), os.environ.get("PATH", "")]),
            "PYTHONPATH": os.pathsep.join([str(root), str(REPOSITORY)]),
            "PGQUEUE_DATABASE_URL": self.url,
            "FLASK_APP": "myapp:create_app",
        }
        (root / "myapp").mkdir()
        (root / "myapp" / "__init__.py").write_text("")

    def run(self, argv: list[str]) -> str:
        done = subprocess.run(
            argv, cwd=self.root, env=self.env, capture_output=True, text=True, timeout=180
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"{shlex.join(argv)}: exit {done.returncode}\n{output}"
        return output

    def fails(self, argv: list[str]) -> str:
        done = subprocess.run(
            argv, cwd=self.root, env=self.env, capture_output=True, text=True, timeout=180
        )
        assert done.returncode != 0, done.stdout + done.stderr
        return done.stdout + done.stderr

    def edit(self, relative: str, settings: str = "", diffs: Sequence[str] = ()) -> None:
        path = self.root / relative
        text_ = with_settings(path.read_text(), settings)
        for diff in diffs:
            text_ = patched(text_, diff)
        path.write_text(text_)

    def revisions(self) -> set[Path]:
        return set((self.root / "migrations" / "versions").glob("*.py"))

    def version_rows(self) -> set[str]:
        engine = create_engine(self.url)
        try:
            with engine.connect() as connection:
                rows = connection.execute(text("SELECT version_num FROM alembic_version"))
                return {row[0] for row in rows}
        finally:
            engine.dispose()

    def tables(self) -> set[str]:
        engine = create_engine(self.url)
        try:
            return set(inspect(engine).get_table_names())
        finally:
            engine.dispose()


@pytest.fixture
def pgqueue_versions_untouched() -> Iterator[None]:
    """Whatever a failing run wrote into pgqueue's own versions directory is removed again."""
    before = set(PGQUEUE_VERSIONS.glob("*.py"))
    yield
    stray = set(PGQUEUE_VERSIONS.glob("*.py")) - before
    for path in stray:
        if path.is_file():
            path.unlink()
    assert not stray, f"written into pgqueue's package: {sorted(p.name for p in stray)}"


def host_head_of(orders: Path) -> str:
    """The revision id of the application's autogenerated ``orders`` revision, checked to
    create the application's table and nothing of pgqueue's."""
    body = orders.read_text()
    assert re.search(r"create_table\(\s*['\"]orders['\"]", body), body
    assert "pgqueue_" not in body, body
    host_head = REVISION_ID.search(body)
    assert host_head, body
    return host_head.group(1)


def pgqueue_recorded(project: Project) -> migrations.Recorded | None:
    engine = create_engine(project.url)
    try:
        with engine.connect() as connection:
            return migrations.recorded(connection)
    finally:
        engine.dispose()


def pgqueue_downgraded(project: Project, revision: str) -> None:
    """pgqueue's tables taken back to ``revision``, as a database looks to a newer pgqueue."""
    engine = create_engine(project.url)
    try:
        with engine.begin() as connection:
            migrations.downgrade(connection, revision)
    finally:
        engine.dispose()


def assert_each_upgrade_takes_pgqueue_to_its_head(project: Project, host_head: str) -> None:
    """Both histories applied, each in its own version table."""
    assert project.version_rows() == {host_head}
    assert pgqueue_recorded(project) == migrations.Recorded(
        migrations.head(), migrations.VERSION_TABLE
    )
    assert {"orders", "pgqueue_jobs"} <= project.tables()


def followed_with_alembic_init(
    recipe: str, root: Path, url: URL
) -> tuple[Project, set[Path], Path]:
    """An application made by ``alembic init``, ``recipe``'s ini settings and env.py edits
    applied and its command lines run: the project, its revisions before them, and the one
    revision they wrote (the application's ``orders``)."""
    project = Project(root, url)
    (root / "myapp" / "models.py").write_text(MODELS)
    project.run(["alembic", "init", "migrations"])
    project.edit("alembic.ini", f"sqlalchemy.url = {project.url.replace('%', '%%')}")
    for settings in blocks(recipe, "ini"):
        project.edit("alembic.ini", settings)
    project.edit("migrations/env.py", diffs=blocks(recipe, "diff"))
    before = project.revisions()
    for argv in commands(recipe):
        project.run(argv)
    (orders,) = project.revisions() - before
    return project, before, orders


@pytest.mark.slow
def test_recipe_for_an_alembic_of_its_own(
    empty_database_url: URL, tmp_path: Path, pgqueue_versions_untouched: None
) -> None:
    recipe = section(1)
    assert not blocks(recipe, "ini")  # alembic.ini stays as alembic init wrote it
    project, before, orders = followed_with_alembic_init(recipe, tmp_path, empty_database_url)
    host_head = host_head_of(orders)
    assert_each_upgrade_takes_pgqueue_to_its_head(project, host_head)

    # pgqueue's tables a revision behind, as after installing a newer pgqueue: commands other
    # than upgrade leave them there, the next habitual upgrade takes them to the head.
    previous = f"pgqueue_{int(migrations.head().removeprefix('pgqueue_')) - 1:04d}"
    pgqueue_downgraded(project, previous)
    project.run(["alembic", "current"])
    project.run(["alembic", "downgrade", "-1"])
    assert "orders" not in project.tables()
    assert pgqueue_recorded(project) == migrations.Recorded(previous, migrations.VERSION_TABLE)
    project.run(["alembic", "upgrade", "head"])
    assert_each_upgrade_takes_pgqueue_to_its_head(project, host_head)

    # Autogenerate again: an empty revision, nothing of pgqueue's.
    project.run(["alembic", "revision", "--autogenerate", "-m", "check"])
    (check,) = project.revisions() - before - {orders}
    body = check.read_text()
    assert "pgqueue" not in body and "op." not in body, body


@pytest.mark.slow
def test_recipe_for_flask_migrate(
    empty_database_url: URL, tmp_path: Path, pgqueue_versions_untouched: None
) -> None:
    recipe = section(2)
    project = Project(tmp_path, empty_database_url)
    (tmp_path / "myapp" / "__init__.py").write_text(FLASK_APP)
    project.run(["flask", "db", "init"])
    assert not blocks(recipe, "ini")  # migrations/alembic.ini stays as flask db init wrote it
    project.edit("migrations/env.py", diffs=blocks(recipe, "diff"))

    before = project.revisions()
    for argv in commands(recipe):
        project.run(argv)
    (orders,) = project.revisions() - before
    host_head = host_head_of(orders)
    assert_each_upgrade_takes_pgqueue_to_its_head(project, host_head)

    previous = f"pgqueue_{int(migrations.head().removeprefix('pgqueue_')) - 1:04d}"
    pgqueue_downgraded(project, previous)
    project.run(["flask", "db", "upgrade"])
    assert_each_upgrade_takes_pgqueue_to_its_head(project, host_head)

    # Autogenerate again: Flask-Migrate's own hook drops the empty revision.
    output = project.run(["flask", "db", "migrate", "-m", "check"])
    assert "No changes in schema detected." in output, output
    assert project.revisions() == before | {orders}


@pytest.mark.slow
def test_branch_layout_for_an_alembic_of_its_own(
    empty_database_url: URL, tmp_path: Path, pgqueue_versions_untouched: None
) -> None:
    project, before, orders = followed_with_alembic_init(section(4), tmp_path, empty_database_url)
    host_head = host_head_of(orders)
    # Both lineages in the application's alembic_version.
    assert project.version_rows() == {migrations.head(), host_head}
    assert {"orders", "pgqueue_jobs"} <= project.tables()

    # `head` alone names two heads, as the page says; `heads` is this layout's.
    refused = project.fails(["alembic", "upgrade", "head"])
    assert "Multiple head revisions are present" in refused, refused
    assert "Multiple head revisions are present" in PAGE.read_text()

    project.run(["alembic", "revision", "--autogenerate", "-m", "check"])
    (check,) = project.revisions() - before - {orders}
    body = check.read_text()
    assert "pgqueue" not in body and "op." not in body, body


@pytest.mark.slow
def test_recipe_without_an_alembic_of_its_own(empty_database_url: URL, tmp_path: Path) -> None:
    project = Project(tmp_path, empty_database_url)
    outputs = [project.run(argv) for argv in commands(section(3))]
    assert outputs[-1].startswith(f"{migrations.head()} (head)"), outputs
    assert "pgqueue_jobs" in project.tables()
