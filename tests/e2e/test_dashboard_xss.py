"""Script payloads in everything the dashboard shows, in real headless Chromium: nothing runs.

Job arguments, keyword arguments, results, errors (``last_error`` and ``errors``), unique keys,
task names and queue names all carry markup built to run script in element, attribute and URL
contexts. Task and queue names with such characters cannot be enqueued through pgqueue (they
are validated), so those rows are written by hand, as another client could. Every page
(overview, job lists filtered by those names, each job's page, the queue controls) must show
the payloads as text, hold no element they would create, and leave the page's marker variable
unset.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import urlencode

import pytest
from flask import Flask
from sqlalchemy import Engine, text
from sqlalchemy.engine import URL
from support.dashboard import chromium_page, served_dashboard

from pgqueue.contrib.flask import PgQueue

MARK = "window.__pgqueue_xss = (window.__pgqueue_xss || 0) + 1"
PAYLOADS = [
    f"<script>{MARK}</script>",
    f'"><img src=x onerror="{MARK}">',
    f"'><svg onload='{MARK}'>",
    f"</pre></dd></td><script>{MARK}</script>",
    f"javascript:{MARK}",
]
# Elements a payload would add to the DOM if it were not escaped.
INJECTED = "script, img, svg[onload], iframe, [onerror], [onload]"

pgq = PgQueue()


@pytest.fixture
def served(database_url: URL) -> Iterator[tuple[Flask, str]]:
    with served_dashboard(pgq, database_url, "dashboard_xss", public=True) as app_and_base:
        yield app_and_base


def _insert_hostile_jobs(engine: Engine) -> list[int]:
    errors = [{"attempt": 1, "at": p, "error": p} for p in PAYLOADS]
    rows = [
        # Payloads in names (as another client could write them) and in every value shown.
        {"task": PAYLOADS[0], "queue": PAYLOADS[1], "state": "failed"},
        {"task": PAYLOADS[2], "queue": PAYLOADS[3], "state": "queued"},
        {"task": "xss.task", "queue": PAYLOADS[4], "state": "succeeded"},
        {"task": PAYLOADS[4], "queue": "xss", "state": "cancelled"},
    ]
    ids = []
    with engine.begin() as connection:
        for row in rows:
            ids.append(
                connection.execute(
                    text(
                        """INSERT INTO pgqueue_jobs (task_name, queue, state, args, kwargs,
                               result, last_error, errors, unique_key, finished_at)
                           VALUES (:task, :queue, CAST(:state AS text), CAST(:args AS json),
                                   CAST(:kwargs AS json), CAST(:result AS json), :error,
                                   CAST(:errors AS jsonb), :key,
                                   CASE WHEN CAST(:state AS text) IN ('failed', 'succeeded', 'cancelled')
                                        THEN now() END)
                           RETURNING id"""
                    ),
                    {
                        **row,
                        "args": json.dumps(PAYLOADS),
                        "kwargs": json.dumps({p: p for p in PAYLOADS}),
                        "result": json.dumps({"html": PAYLOADS}),
                        "error": "\n".join(PAYLOADS),
                        "errors": json.dumps(errors if row["state"] == "failed" else []),
                        "key": PAYLOADS[0] if row["state"] == "queued" else None,
                    },
                ).scalar_one()
            )
        # A ticket, so the overview shows the queued one as its queue's oldest waiting job.
        connection.execute(
            text("INSERT INTO pgqueue_message_queue (job_id, queue) VALUES (:id, :queue)"),
            {"id": ids[1], "queue": PAYLOADS[3]},
        )
    return ids


def test_script_payloads_in_jobs_never_run(served: tuple[Flask, str], engine: Engine) -> None:
    _app, base = served
    ids = _insert_hostile_jobs(engine)
    pages = [base + "/", base + "/jobs"]
    pages += [base + "/jobs?" + urlencode({"queue": p}) for p in PAYLOADS]
    pages += [base + "/jobs?" + urlencode({"task": p}) for p in PAYLOADS]
    pages += [f"{base}/jobs/{i}" for i in ids]
    pages.append(base + "/queues")

    with chromium_page() as page:
        dialogs: list[str] = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        # The policy must not block the dashboard's own resources either (its stylesheet).
        console: list[str] = []
        page.on("console", lambda message: console.append(message.text))
        seen: dict[str, str] = {}
        for url in pages:
            response = page.goto(url)
            assert response is not None and response.status == 200, url
            assert page.evaluate("window.__pgqueue_xss") is None, url
            assert page.locator(INJECTED).count() == 0, url
            seen[url] = page.locator("main").inner_text()
            # Styled by its stylesheet: the header is laid out as a flex row.
            assert page.locator("header").evaluate("e => getComputedStyle(e).display") == (
                "flex"
            ), url
            # Links built from names stay on the dashboard (no javascript: targets).
            hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")
            assert all(h.startswith(base) for h in hrefs), (url, hrefs)
        # Hovering and clicking what the payloads' handlers would hang on runs nothing.
        page.goto(f"{base}/jobs/{ids[0]}")
        page.locator("pre").first.hover()
        page.goto(base + "/")
        page.locator("main a").first.click()
        assert page.evaluate("window.__pgqueue_xss") is None

    assert dialogs == []
    assert [m for m in console if "Content Security Policy" in m] == []
    # The payloads were on the pages, as text: in the overview (queue names), the job lists
    # (task names) and on each job's page (arguments, result, errors, names, unique key).
    assert PAYLOADS[1] in seen[base + "/"] and PAYLOADS[3] in seen[base + "/"]
    assert PAYLOADS[0] in seen[base + "/jobs"] and PAYLOADS[2] in seen[base + "/jobs"]
    assert PAYLOADS[1] in seen[base + "/queues"] and PAYLOADS[3] in seen[base + "/queues"]
    failed_page = seen[f"{base}/jobs/{ids[0]}"]
    succeeded_page = seen[f"{base}/jobs/{ids[2]}"]
    queued_page = seen[f"{base}/jobs/{ids[1]}"]
    for payload in PAYLOADS:
        assert payload in failed_page  # arguments and per-attempt errors
        assert json.dumps(payload)[1:-1] in succeeded_page  # inside the result's JSON
    assert PAYLOADS[0] in queued_page  # task name and unique key
    for payload in (PAYLOADS[1], PAYLOADS[3], PAYLOADS[4]):  # the queues written above
        filtered = seen[base + "/jobs?" + urlencode({"queue": payload})]
        assert "No jobs match." not in filtered, payload  # the filter found its job
