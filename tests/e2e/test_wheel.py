"""The built wheel, installed in a fresh venv (not the checkout), migrates an empty database
with ``pgqueue migrate`` and reports the head with ``pgqueue migrate current``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect
from sqlalchemy.engine import URL

from pgqueue import migrations

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_in_fresh_venv_migrates(empty_database_url: URL, tmp_path: Path) -> None:
    # Build from a copy: setuptools writes build/ and *.egg-info into the source tree, which
    # would race with anything else using the checkout.
    source = tmp_path / "src"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git",
            ".ci-venv",
            ".venv",
            "build",
            "dist",
            "*.egg-info",
            "__pycache__",
            ".mypy_cache",
            ".ruff_cache",
            ".pytest_cache",
            ".hypothesis",
            "results",
        ),
    )
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(source)],
        check=True,
    )
    wheel = next(dist.glob("sqlalchemy_pgqueue-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("pgqueue/migrations/versions/pgqueue_0001") for n in names)
    assert "pgqueue/py.typed" in names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = venv / "bin" / "pip"
    subprocess.run([str(pip), "install", "-q", str(wheel)], check=True)

    url = empty_database_url.render_as_string(hide_password=False)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PGQUEUE_DATABASE_URL"] = url
    cli = str(venv / "bin" / "pgqueue")
    # Run from an empty directory so the checkout cannot be imported by accident.
    upgrade = subprocess.run(
        [cli, "migrate"], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    )
    assert migrations.head() in upgrade.stdout
    current = subprocess.run(
        [cli, "migrate", "current"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert current.stdout.strip() == f"{migrations.head()} (head)"
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import pgqueue; print(pgqueue.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert str(venv) in where.stdout

    engine = create_engine(empty_database_url)
    tables = set(inspect(engine).get_table_names())
    engine.dispose()
    assert {"pgqueue_jobs", "pgqueue_message_queue", migrations.VERSION_TABLE} <= tables
