"""Flow-control limits from the command line and the admin API, on real PostgreSQL.

``pgqueue key-limit`` and ``pgqueue rate-limit`` (and ``flask pgqueue ...``) set, show and
remove per-key limits and queue or per-key rate limits; bad input is one line, exit code 2,
and writes nothing. ``QueueSettings`` carries a queue's rate limit and ``key_overrides()``
reads the per-key overrides; the dashboard's Queues page shows both. The commands run
in-process as a fresh process runs them (``cli_invoke``).
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from flask import Flask
from sqlalchemy.engine import URL
from support.cli_invoke import invoke

from pgqueue import PgQueue
from pgqueue.admin import KeyOverride, QueueSettings
from pgqueue.contrib.flask import PgQueue as FlaskPgQueue
from pgqueue.contrib.flask.dashboard import init_dashboard


def _run(argv: list[str], url: URL, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PGQUEUE_", "FLASK_"))}
    rendered = url.render_as_string(hide_password=False)
    env.update(PGQUEUE_DATABASE_URL=rendered, SHOP_URL=rendered, COLUMNS="200")
    if cwd is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(cwd), env.get("PYTHONPATH")) if p)
    return invoke(argv, cwd=cwd, env=env)


def pgqueue(*args: str, url: URL) -> str:
    """Run ``pgqueue ARGS`` and return its output; it must succeed."""
    result = _run(["-m", "pgqueue", *args], url)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_key_limit_set_show_list_and_remove(pgq: PgQueue, database_url: URL) -> None:
    assert pgqueue("key-limit", "account:", "2", url=database_url).strip() == (
        "keys account:*: limit 2"
    )
    pgqueue("key-limit", "account:42", "5", url=database_url)
    assert pgq.key_overrides() == [
        KeyOverride("account:", 2, None, None),
        KeyOverride("account:42", 5, None, None),
    ]
    assert pgqueue("key-limit", "account:", url=database_url).strip() == "keys account:*: 2"
    table = pgqueue("key-limit", url=database_url)
    rows = [line.split("│") for line in table.splitlines() if "account:" in line]
    assert [[cell.strip() for cell in row[1:4]] for row in rows] == [
        ["account:", "2", "none"],
        ["account:42", "5", "none"],
    ]
    listed = json.loads(pgqueue("key-limit", "--json", url=database_url))
    assert listed == [
        {"prefix": "account:", "key_limit": 2, "rate_limit": None, "rate_per": None},
        {"prefix": "account:42", "key_limit": 5, "rate_limit": None, "rate_per": None},
    ]

    assert pgqueue("key-limit", "account:", "none", url=database_url).strip() == (
        "keys account:*: limit removed"
    )
    assert pgq.key_overrides() == [KeyOverride("account:42", 5, None, None)]
    shown = pgqueue("key-limit", "account:", url=database_url).strip()
    assert shown == "keys account:*: no limit override"
    # A mistyped prefix is not reported as removed.
    assert pgqueue("key-limit", "acount:", "none", url=database_url).strip() == (
        "keys acount:*: no limit override to remove (key-limit lists them)"
    )
    assert pgq.key_overrides() == [KeyOverride("account:42", 5, None, None)]


def test_queue_rate_limit_set_show_list_and_remove(pgq: PgQueue, database_url: URL) -> None:
    out = pgqueue("rate-limit", "reports", "50", "--per", "1.5", "--new", url=database_url)
    assert out.strip() == "queue reports: rate limit 50 per 1.5s"
    settings = pgq.admin.queue_settings()["reports"]
    assert (settings.rate_limit, settings.rate_per) == (50, 1.5)
    assert pgqueue("rate-limit", "reports", url=database_url).strip() == (
        "queue reports: 50 per 1.5s"
    )
    assert pgqueue("rate-limit", "mail", url=database_url).strip() == "queue mail: no rate limit"
    table = pgqueue("rate-limit", url=database_url)
    assert [line.split("│")[1:4] for line in table.splitlines() if "reports" in line] == [
        [" queue reports ", "    50 ", " 1.5s "]
    ]
    assert json.loads(pgqueue("rate-limit", "reports", "--json", url=database_url)) == {
        "queue": "reports",
        "rate_limit": 50,
        "rate_per": 1.5,
    }

    out = pgqueue("rate-limit", "reports", "none", url=database_url)
    assert out.strip() == "queue reports: rate limit removed"
    settings = pgq.admin.queue_settings()["reports"]
    assert (settings.rate_limit, settings.rate_per) == (None, None)


def test_key_rate_limit_set_show_list_and_remove(pgq: PgQueue, database_url: URL) -> None:
    pgq.set_key_limit("tenant:", 3)
    out = pgqueue("rate-limit", "--key", "tenant:", "5", "--per", "60", url=database_url)
    assert out.strip() == "keys tenant:*: rate limit 5 per 60s"
    assert pgq.key_overrides() == [KeyOverride("tenant:", 3, 5, 60.0)]
    shown = pgqueue("rate-limit", "--key", "tenant:", url=database_url).strip()
    assert shown == "keys tenant:*: 5 per 60s"
    pgq.set_rate_limit("reports", 10, per=2)
    assert json.loads(pgqueue("rate-limit", "--json", url=database_url)) == {
        "queues": {"reports": {"rate_limit": 10, "rate_per": 2.0}},
        "keys": {"tenant:": {"rate_limit": 5, "rate_per": 60.0}},
    }

    pgqueue("rate-limit", "--key", "tenant:", "none", url=database_url)
    # The key limit set beside the rate stays; only the rate went.
    assert pgq.key_overrides() == [KeyOverride("tenant:", 3, None, None)]
    pgqueue("key-limit", "tenant:", "none", url=database_url)
    assert pgq.key_overrides() == []


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["key-limit", "account:", "-3"], "key limit must be a whole number of at least 1, got -3"),
        (["key-limit", "account:", "0"], "key limit must be a whole number of at least 1, got 0"),
        (["key-limit", "account:", "lots"], "'lots' is not a whole number or 'none'"),
        (["key-limit", "", "3"], "KEY_OR_PREFIX must be a non-empty string"),
        (["key-limit", "account:", "3", "--json"], "--json shows the settings"),
        (["rate-limit", "reports", "5", "--per", "0"], "per must be a positive number of seconds"),
        (["rate-limit", "reports", "5", "--per", "-1"], "per must be a positive number of seconds"),
        (["rate-limit", "reports", "5", "--per", "soon"], "--per 'soon' is not a number"),
        (["rate-limit", "reports", "-5", "--per", "1"], "rate limit must be a whole number of at"),
        (["rate-limit", "reports", "5"], "a rate limit needs --per SECONDS"),
        (["rate-limit", "reports", "none", "--per", "1"], "'none' alone removes the rate limit"),
        (["rate-limit", "reports", "5", "--per", "1", "more"], "unexpected argument 'more'"),
        (["rate-limit", "--key", "", "5", "--per", "1"], "--key must be a non-empty string"),
        (["rate-limit", "--key", "t:", "reports", "5", "--per", "1"], "unexpected argument '5'"),
        (["rate-limit", "", "5", "--per", "1"], "queue"),
        (["rate-limit", "--per", "1"], "--per goes with a QUEUE"),
        (["key-limit", "--jsn"], "no such option: --jsn"),
        (["key-limit", "account:", "--limit=3"], "no such option: --limit=3"),
        (["rate-limit", "reports", "5", "--pr", "1"], "no such option: --pr"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    pgq: PgQueue, database_url: URL, args: list[str], problem: str
) -> None:
    result = _run(["-m", "pgqueue", *args], database_url)
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and problem in lines[0], lines[0]
    assert result.stdout == ""
    assert pgq.key_overrides() == []
    assert pgq.admin.queue_settings() == {}


FLASK_SHOP = """
import os

from flask import Flask

from pgqueue.contrib.flask import PgQueue

app = Flask("shop")
app.config["PGQUEUE_DATABASE_URL"] = os.environ["SHOP_URL"]
PgQueue().init_app(app)
"""


def test_flask_cli_sets_and_shows_the_same_limits(
    pgq: PgQueue, database_url: URL, tmp_path: Path
) -> None:
    (tmp_path / "flask_shop.py").write_text(textwrap.dedent(FLASK_SHOP))

    def flask(*args: str) -> str:
        result = _run(
            ["-m", "flask", "--app", "flask_shop:app", "pgqueue", *args], database_url, tmp_path
        )
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stdout.strip()

    assert flask("key-limit", "account:", "4") == "keys account:*: limit 4"
    assert flask("rate-limit", "mail", "20", "--per", "1", "--new") == (
        "queue mail: rate limit 20 per 1s"
    )
    assert pgq.key_overrides() == [KeyOverride("account:", 4, None, None)]
    assert flask("rate-limit", "mail") == "queue mail: 20 per 1s"
    assert flask("key-limit", "account:") == "keys account:*: 4"


def test_queue_settings_carry_the_rate_limit(pgq: PgQueue) -> None:
    pgq.set_rate_limit("reports", 50, per=1)
    pgq.set_queue_limit("mail", 3)
    settings = pgq.admin.queue_settings()
    assert settings["reports"] == QueueSettings("reports", False, None, 0, None, 50, 1.0)
    assert (settings["mail"].rate_limit, settings["mail"].rate_per) == (None, None)
    # Constructors from before the rate fields keep working.
    assert QueueSettings("q", False, None, 0).rate_limit is None


def test_the_queues_page_shows_queue_rates_and_key_limits(database_url: URL) -> None:
    flask_pgq = FlaskPgQueue()
    app = Flask("limits")
    app.config.update(
        PGQUEUE_DATABASE_URL=database_url.render_as_string(hide_password=False),
        SECRET_KEY="test-secret",
    )
    flask_pgq.init_app(app)
    init_dashboard(app, public=True)
    queue = flask_pgq.state(app).queue
    try:
        queue.set_rate_limit("reports", 1200, per=0.5)
        queue.set_queue_limit("mail", 2)
        queue.set_key_limit("account:", 2)
        queue.set_rate_limit(key="tenant:", limit=5, per=60)
        page = app.test_client().get("/pgqueue/queues").text
        assert '<td class="num rate-limit">1,200 per 0.5s</td>' in page
        assert '<tr data-prefix="account:">' in page
        assert '<td class="num key-limit">2</td>' in page
        assert '<td class="num rate-limit">5 per 60s</td>' in page
    finally:
        queue.dispose()
