"""pgqueue on a server that accepts TLS only, verified in full (``sslmode=verify-full``).

The server is Debian's packaged PostgreSQL (``apt-get install postgresql``) with ``ssl = on``,
a certificate signed by a CA made for the test, and ``hostssl`` lines only. Every connection
pgqueue opens (its engine, the worker's claim connection and its LISTEN connection) must use
the TLS parameters of the URL; with the wrong CA the error says which of pgqueue's connections
failed, to which server, and why.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from debian_postgres import as_postgres, bin_dir
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, make_url
from support.network import free_port
from support.polling import wait_until
from support.processes import pgqueue_command, pgqueue_env

from pgqueue import JobState, PgQueue, Settings
from pgqueue.testing import wait_for_states
from pgqueue.worker.notifier import Notifier

APP = """
import os
from pgqueue import PgQueue, Settings

pgq = PgQueue(os.environ["DB_URL"], settings=Settings.from_env())


@pgq.task(name="noop")
def noop(i=0):
    return i
"""


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def tls_server() -> Iterator[tuple[URL, Path, Path]]:
    """(URL without TLS parameters, the right CA file, a wrong CA file)."""
    root = Path(tempfile.mkdtemp(prefix="pgqueue-tls-"))
    root.chmod(0o755)
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=pgqueue-test-ca",
        cwd=root,
    )
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "wrong.key",
        "-out",
        "wrong.pem",
        "-days",
        "2",
        "-subj",
        "/CN=another-ca",
        cwd=root,
    )
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
        cwd=root,
    )
    (root / "ext.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
        cwd=root,
    )
    (root / "pw").write_text("tls-test-password\n")
    user = as_postgres(root)
    (root / "server.key").chmod(0o600)
    server_bin = bin_dir()
    data = root / "data"
    subprocess.run(
        [
            server_bin / "initdb",
            "-D",
            data,
            "-U",
            "postgres",
            "-A",
            "scram-sha-256",
            "--pwfile",
            root / "pw",
        ],
        check=True,
        capture_output=True,
        **user,  # type: ignore[arg-type]
    )
    with (data / "postgresql.conf").open("a") as conf:
        conf.write(
            f"ssl = on\nssl_cert_file = '{root}/server.crt'\nssl_key_file = '{root}/server.key'\n"
        )
    (data / "pg_hba.conf").write_text("hostssl all all 127.0.0.1/32 scram-sha-256\n")
    port = free_port()
    subprocess.run(
        [
            server_bin / "pg_ctl",
            "-D",
            data,
            "-w",
            "-l",
            root / "log",
            "-o",
            f"-p {port} -k {root} -c listen_addresses=127.0.0.1",
            "start",
        ],
        check=True,
        capture_output=True,
        **user,  # type: ignore[arg-type]
    )
    try:
        url = make_url(f"postgresql+psycopg://postgres:tls-test-password@localhost:{port}/postgres")
        yield url, root / "ca.pem", root / "wrong.pem"
    finally:
        subprocess.run(
            [server_bin / "pg_ctl", "-D", data, "-m", "fast", "stop"],
            capture_output=True,
            **user,  # type: ignore[arg-type]
        )
        shutil.rmtree(root, ignore_errors=True)


def _verified(url: URL, ca: Path, database: str) -> URL:
    return url.set(database=database).update_query_dict(
        {"sslmode": "verify-full", "sslrootcert": str(ca)}
    )


def _new_database(url: URL, ca: Path, name: str) -> URL:
    """A new, empty database ``name`` on the TLS server; its verified URL."""
    admin = create_engine(_verified(url, ca, "postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return _verified(url, ca, name)


def test_a_plain_connection_is_refused(tls_server: tuple[URL, Path, Path]) -> None:
    url, _, _ = tls_server
    engine = create_engine(url.update_query_dict({"sslmode": "disable"}))
    with pytest.raises(Exception, match="no encryption"), engine.connect():
        pass
    engine.dispose()


def test_migrate_enqueue_and_a_listening_worker_over_verified_tls(
    tls_server: tuple[URL, Path, Path], tmp_path: Path
) -> None:
    url, ca, _ = tls_server
    app_url = _new_database(url, ca, "tls_app")
    admin = create_engine(_verified(url, ca, "postgres"), isolation_level="AUTOCOMMIT")
    (tmp_path / "tlsapp.py").write_text(APP)
    env = pgqueue_env()
    env["DB_URL"] = app_url.render_as_string(hide_password=False)
    pgq = PgQueue(app_url, settings=Settings())
    pgq.migrate()

    @pgq.task(name="noop")
    def noop(i: int = 0) -> int:
        return i

    worker = subprocess.Popen(
        pgqueue_command("worker", "tlsapp:pgq", "--poll-interval", "30"),
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        listening = text(
            "SELECT s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) "
            "WHERE a.datname = 'tls_app' AND a.application_name = 'pgqueue-listener' "
            "AND a.query ILIKE 'LISTEN%'"
        )
        with admin.connect() as watcher:
            rows = wait_until(
                lambda: watcher.execute(listening).all(), 30, "the worker to listen", 0.1
            )
        assert rows == [(True,)]
        ids = [noop.enqueue(i) for i in range(20)]
        # A poll interval of 30 s: only LISTEN over TLS can wake the worker this soon.
        wait_for_states(pgq, ids, {JobState.SUCCEEDED}, timeout=10)
        with pgq.engine.connect() as connection:
            unencrypted = connection.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) "
                    "WHERE a.datname = 'tls_app' AND NOT s.ssl"
                )
            ).scalar_one()
        assert unencrypted == 0
    finally:
        worker.terminate()
        output = worker.communicate(timeout=30)[0].decode()
        pgq.dispose()
        admin.dispose()
    assert "WARNING" not in output and "ERROR" not in output, output


def test_a_wrong_ca_fails_naming_the_server(tls_server: tuple[URL, Path, Path]) -> None:
    url, _, wrong = tls_server
    pgq = PgQueue(_verified(url, wrong, "postgres"), settings=Settings())

    @pgq.task(name="noop")
    def noop() -> None:
        return None

    with pytest.raises(Exception) as failure:
        noop.enqueue()
    message = str(failure.value)
    assert "certificate verify failed" in message
    assert f"port {url.port}" in message
    assert f"pgqueue connection to localhost:{url.port}/postgres failed: " in message
    pgq.dispose()


def test_the_cli_with_a_wrong_ca_prints_one_line_naming_the_connection(
    tls_server: tuple[URL, Path, Path],
) -> None:
    url, _, wrong = tls_server
    env = pgqueue_env()
    env["PGQUEUE_DATABASE_URL"] = _verified(url, wrong, "postgres").render_as_string(
        hide_password=False
    )
    # migrate connects through the handlers' engine (no statement_timeout of pgqueue's on its
    # online index builds), stats through pgqueue's own: both say the same.
    for command in (["migrate"], ["stats"]):
        done = subprocess.run(pgqueue_command(*command), env=env, capture_output=True, timeout=60)
        assert done.returncode == 2, done
        assert done.stdout == b""
        [line] = done.stderr.decode().splitlines()
        target = f"localhost:{url.port}/postgres"
        assert line.startswith(f"error: pgqueue connection to {target}"), line
        assert line.endswith("certificate verify failed"), line


def test_a_listen_url_with_a_wrong_ca_is_logged_as_the_listeners_failure(
    tls_server: tuple[URL, Path, Path], tmp_path: Path
) -> None:
    # The engine's URL is right, the listen URL is not: the worker runs its jobs by polling and
    # says which of its connections cannot be opened.
    url, ca, wrong = tls_server
    app_url = _new_database(url, ca, "tls_listen")
    (tmp_path / "tlsapp.py").write_text(APP)
    env = pgqueue_env()
    env["DB_URL"] = app_url.render_as_string(hide_password=False)
    env["PGQUEUE_LISTEN_DATABASE_URL"] = _verified(url, wrong, "tls_listen").render_as_string(
        hide_password=False
    )
    pgq = PgQueue(app_url, settings=Settings())
    pgq.migrate()

    @pgq.task(name="noop")
    def noop(i: int = 0) -> int:
        return i

    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            pgqueue_command("worker", "tlsapp:pgq", "--poll-interval", "0.2"),
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        ids = [noop.enqueue(i) for i in range(5)]
        wait_for_states(pgq, ids, {JobState.SUCCEEDED}, timeout=30)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        pgq.dispose()
    failures = [
        line
        for line in log.read_text().splitlines()
        if f"pgqueue listener connection to localhost:{url.port}/tls_listen failed: " in line
    ]
    assert failures, log.read_text()
    assert all("certificate verify failed" in line for line in failures), failures
    assert "pgqueue connection" not in log.read_text()


def test_listen_connection_uses_the_given_engines_connect_args(
    tls_server: tuple[URL, Path, Path],
) -> None:
    # TLS given to the engine, not in the URL: a LISTEN connection made from the URL alone
    # would be refused (hostssl only) or unverified.
    url, ca, _ = tls_server
    engine = create_engine(url, connect_args={"sslmode": "verify-full", "sslrootcert": str(ca)})
    pgq = PgQueue(engine, settings=Settings())
    with pgq.listen_connection() as connection:
        connection.execute("LISTEN pgqueue")
        row = connection.execute(
            "SELECT ssl, current_setting('application_name') FROM pg_stat_ssl "
            "WHERE pid = pg_backend_pid()"
        ).fetchone()
    assert row == (True, "pgqueue-listener")
    engine.dispose()


def test_a_worker_with_a_wrong_ca_names_its_engine_and_its_listener(
    tls_server: tuple[URL, Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # By default a worker that cannot open its engine's connection as it starts exits with one
    # line naming it; told to wait, it logs that line for each try. Its listener's connection
    # is opened by the engine, yet its failure is the listener's.
    url, _, wrong = tls_server
    (tmp_path / "tlsapp.py").write_text(APP)
    env = pgqueue_env()
    env["DB_URL"] = _verified(url, wrong, "postgres").render_as_string(hide_password=False)
    engine = f"pgqueue connection to localhost:{url.port}/postgres failed: "
    command = pgqueue_command("worker", "tlsapp:pgq", "--poll-interval", "0.2")
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, timeout=60)
    assert done.returncode == 2, done
    [line] = done.stderr.decode().splitlines()
    assert line.startswith(f"error: {engine}") and "certificate verify failed" in line, line

    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [*command, "--wait-for-database"],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(
            lambda: len([e for e in log.read_text().splitlines() if engine in e]) >= 2,
            30,
            "two lines naming the engine's connection in the worker's log",
            0.1,
        )
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    lines = log.read_text().splitlines()
    engines = [line for line in lines if ": waiting for the database: " in line and engine in line]
    assert len(engines) >= 2, lines
    assert all("certificate verify failed" in line for line in engines)

    # The listener of a worker whose engine does connect (the engine's connection never does
    # here: the worker would not start), run in this process.
    pgq = PgQueue(_verified(url, wrong, "postgres"), settings=Settings())
    stopping = threading.Event()
    listener = f"pgqueue listener connection to localhost:{url.port}/postgres failed: "
    with caplog.at_level(logging.WARNING, logger="pgqueue.worker"):
        notifier = Notifier(pgq.listen_connection, None, lambda _: None, stopping)
        notifier.start()
        try:
            listens = wait_until(
                lambda: [r.getMessage() for r in caplog.records], 30, "the listener's warning", 0.1
            )
        finally:
            stopping.set()
            notifier.join(timeout=10)
    assert all(listener in line for line in listens), listens
    assert all("certificate verify failed" in line for line in listens), listens
    assert not any("pgqueue connection" in line for line in listens), listens
    pgq.dispose()
