"""The dashboard's queue controls, job-list columns, folded error history and throughput chart,
in real headless Chromium against a real server, with real workers running the jobs.

- Pause, resume and limit set from the Queues page change ``pgqueue_queues`` and what the
  worker claims; bad limits get a 400 page naming the problem and change nothing.
- The job list shows each job's duration (or how long it has been running) and its last
  error's telling line, escaped, with the full text in the tooltip.
- A job failing the same way five times shows one error block marked with a times sign and 5.
- The chart: ten jobs over an hour read in jobs per hour; a burst of 20,000 jobs drained by a
  worker reads per second, whole hour or (with a small read cap) the most recent seconds.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from playwright.sync_api import Page, expect
from sqlalchemy import Engine, text
from sqlalchemy.engine import URL
from support.dashboard import chromium_page, served_dashboard
from support.polling import wait_until
from support.workers import in_thread

from pgqueue import JobState, backoff
from pgqueue.contrib.flask import PgQueue
from pgqueue.testing import run_until_final, wait_for_states
from pgqueue.worker import Worker

MILLISECONDS = re.compile(r"^\d+ ms$")

pgq = PgQueue()
kept: list[object] = []
release = threading.Event()


@pgq.task(name="controls.hold", queue="controlled")
def hold(n: int) -> int:
    release.wait(20)  # stays RUNNING until the test lets go
    return n


@pgq.task(name="controls.nap", queue="timed")
def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@pgq.task(name="controls.broken", queue="timed", max_attempts=1)
def broken(detail: str) -> None:
    raise ValueError(f"bad <b>{detail}</b> & more")


@pgq.task(name="controls.always_fails", queue="timed", max_attempts=5, retry=backoff.constant(0))
def always_fails(n: int) -> None:
    kept.append(object())  # kept alive, so each attempt's object has an address of its own
    raise ConnectionError(f"gateway refused {kept[-1]!r}")


@pgq.task(name="controls.noop", queue="burst")
def noop(n: int) -> None:
    return None


@pytest.fixture
def served(database_url: URL) -> Iterator[tuple[Flask, str]]:
    with served_dashboard(pgq, database_url, "dashboard_controls") as app_and_base:
        yield app_and_base


@pytest.fixture
def page() -> Iterator[Page]:
    with chromium_page(viewport={"width": 1400, "height": 900}) as opened:
        yield opened


def _worker(app: Flask, queues: list[str], concurrency: int) -> Worker:
    """A worker on ``queues`` of the app's queue, polling every 0.2 s."""
    return Worker(pgq.state(app).queue, queues=queues, concurrency=concurrency, poll_interval=0.2)


def _control(engine: Engine, queue: str) -> Any:
    with engine.connect() as connection:
        return connection.execute(
            text("SELECT paused, concurrency_limit FROM pgqueue_queues WHERE name = :q"),
            {"q": queue},
        ).one_or_none()


def _states(app: Flask, ids: list[int]) -> list[JobState]:
    queue = pgq.state(app).queue
    return [queue.get_job(i).state for i in ids]


def _submit(page: Page, row: Any, button: str) -> int:
    with page.expect_response(lambda r: r.request.method == "POST") as posted:
        row.locator(button).click()
    page.wait_for_load_state()
    return posted.value.status


def test_pause_resume_and_limit_from_the_queues_page(
    served: tuple[Flask, str], engine: Engine, page: Page
) -> None:
    app, base = served
    release.clear()
    with app.app_context():
        first = hold.enqueue(0)
    page.goto(base + "/queues")
    row = page.locator('tr[data-queue="controlled"]')
    expect(row.locator("td.status")).to_have_text("active")

    # Paused before any worker runs: the worker claims nothing from it.
    assert _submit(page, row, "button.pause") == 302
    expect(page.locator(".flash-ok")).to_contain_text("Queue controlled paused")
    expect(row.locator("td.status")).to_have_text("paused")
    assert tuple(_control(engine, "controlled")) == (True, None)
    with in_thread(_worker(app, ["controlled"], concurrency=3)):
        time.sleep(2)  # ten poll intervals
        assert _states(app, [first]) == [JobState.QUEUED]

        assert _submit(page, row, "button.resume") == 302
        expect(page.locator(".flash-ok")).to_contain_text("Queue controlled resumed")
        assert tuple(_control(engine, "controlled")) == (False, None)
        wait_for_states(pgq.state(app).queue, [first], {JobState.RUNNING}, timeout=10)

        # Limit 1 while one job runs: two more wait, however many slots the worker has.
        row.locator("input[name=limit]").fill("1")
        assert _submit(page, row, "button.set-limit") == 302
        expect(page.locator(".flash-ok")).to_contain_text("at most 1 of its jobs run at once")
        expect(row.locator("td.limit")).to_have_text("1")
        assert tuple(_control(engine, "controlled")) == (False, 1)
        with app.app_context():
            more = [hold.enqueue(n) for n in (1, 2)]
        time.sleep(2)
        assert _states(app, [first, *more]) == [JobState.RUNNING, JobState.QUEUED, JobState.QUEUED]
        page.goto(base + "/")
        expect(page.locator('tr[data-queue="controlled"] .badge.limited')).to_have_text("limit 1")

        # Cleared: the waiting jobs run beside the first.
        page.goto(base + "/queues")
        assert _submit(page, row, "button.clear-limit") == 302
        expect(page.locator(".flash-ok")).to_contain_text("limit removed")
        assert tuple(_control(engine, "controlled")) == (False, None)
        wait_for_states(pgq.state(app).queue, more, {JobState.RUNNING}, timeout=10)
        release.set()
        wait_for_states(pgq.state(app).queue, [first, *more], {JobState.SUCCEEDED}, timeout=10)


def test_bad_limits_are_refused_and_change_nothing(
    served: tuple[Flask, str], engine: Engine, page: Page
) -> None:
    app, base = served
    pgq.state(app).queue.admin.set_queue_limit("controlled", 3)
    expected = {
        "0": "limit must be at least 1, got 0",
        "-4": "limit must be at least 1, got -4",
        "many": "limit must be a whole number, got 'many'",
        "2.5": "limit must be a whole number, got '2.5'",
        "99999999999": "limit must be at most 2,147,483,647, got 99,999,999,999",
        "": "limit is empty",
    }
    for typed, problem in expected.items():
        page.goto(base + "/queues")
        row = page.locator('tr[data-queue="controlled"]')
        row.locator("input[name=limit]").fill(typed)
        assert _submit(page, row, "button.set-limit") == 400, typed
        expect(page.locator("#queue-error")).to_contain_text(f"Queue controlled: {problem}")
        assert tuple(_control(engine, "controlled")) == (False, 3), typed
    # A queue name no queue may have (posted by hand, with a valid token) is refused as well.
    page.goto(base + "/queues")
    token = page.locator("input[name=csrf_token]").first.get_attribute("value")
    response = page.request.post(
        f"{base}/queues/pause", form={"csrf_token": token or "", "queue": "no spaces allowed"}
    )
    assert response.status == 400
    assert "queue name" in response.text()
    assert _control(engine, "no spaces allowed") is None


def test_job_list_shows_durations_and_errors(served: tuple[Flask, str], page: Page) -> None:
    app, base = served
    release.clear()
    with app.app_context():
        napped = nap.enqueue(1.3)
        failed = broken.enqueue("input")
    run_until_final(pgq.state(app).queue, [napped, failed], concurrency=2, poll_interval=0.2)
    with app.app_context():
        running = hold.enqueue(9)
    with in_thread(_worker(app, ["controlled"], concurrency=1)):
        wait_for_states(pgq.state(app).queue, [running], {JobState.RUNNING}, timeout=10)
        time.sleep(2.2)
        page.goto(base + "/jobs")
        duration_text = page.locator(f'tr[data-job-id="{napped}"] td.duration').inner_text()
        assert duration_text.endswith(" s") and 1.3 <= float(duration_text[:-2]) < 2.5
        running_text = page.locator(f'tr[data-job-id="{running}"] td.duration').inner_text()
        assert running_text.startswith("running for ") and running_text.endswith(" s")
        assert 2.2 <= float(running_text.split()[2]) < 10
        expect(page.locator(f'tr[data-job-id="{running}"] td.error')).to_have_text("")
        error = page.locator(f'tr[data-job-id="{failed}"] td.error span')
        expect(error).to_have_text("ValueError: bad <b>input</b> & more")
        assert page.locator("td.error b").count() == 0  # shown as text, not markup
        title = error.get_attribute("title") or ""
        assert title.startswith("Traceback (most recent call last):")
        assert 'raise ValueError(f"bad <b>{detail}</b> & more")' in title
        expect(page.locator(f'tr[data-job-id="{failed}"] td.duration')).to_have_text(MILLISECONDS)
        release.set()


def test_repeated_failures_are_folded(served: tuple[Flask, str], page: Page) -> None:
    app, base = served
    with app.app_context():
        job_id = always_fails.enqueue(1)
    assert run_until_final(pgq.state(app).queue, [job_id], concurrency=1) == {
        job_id: JobState.FAILED
    }
    errors = pgq.state(app).queue.get_job(job_id).errors
    assert len(errors) == 5 and len({e["error"] for e in errors}) == 5  # the addresses differ
    page.goto(f"{base}/jobs/{job_id}")
    runs = page.locator("details.error-run")
    expect(runs).to_have_count(1)
    expect(runs.locator(".repeat")).to_have_text("\N{MULTIPLICATION SIGN}5")
    expect(runs.locator(".attempts")).to_have_text("(attempts 1-5)")
    expect(runs.locator(".headline")).to_contain_text("ConnectionError: gateway refused <object")
    expect(runs.locator("pre.traceback")).to_be_visible()  # the newest run is open


def _texts(page: Page, selector: str) -> list[str]:
    """The text of SVG elements (which have no innerText)."""
    texts: list[str] = page.locator(selector).evaluate_all(
        "els => els.map(e => e.textContent.trim())"
    )
    return texts


def _ticks(page: Page) -> list[str]:
    return _texts(page, "#throughput-chart text.tick")


def _per_second(label: str) -> float:
    """``"2.5k/s"`` -> 2500.0."""
    number = label.removesuffix("/s")
    if number.endswith("k"):
        return float(number[:-1]) * 1000
    return float(number)


def test_chart_of_ten_jobs_spread_over_an_hour(
    served: tuple[Flask, str], engine: Engine, page: Page
) -> None:
    app, base = served
    with app.app_context():
        ids = [nap.enqueue(0) for _ in range(10)]
    run_until_final(pgq.state(app).queue, ids, concurrency=2, poll_interval=0.2)
    # Real runs, finished six minutes apart over the last hour.
    with engine.begin() as connection:
        for index, job_id in enumerate(ids):
            connection.execute(
                text(
                    "UPDATE pgqueue_jobs SET started_at = now() - make_interval(secs => :s),"
                    " finished_at = now() - make_interval(secs => :s) WHERE id = :id"
                ),
                {"s": 180 + 360 * index, "id": job_id},
            )
    page.goto(base + "/")
    expect(page.locator("#throughput-summary")).to_have_text(
        "10 finished in the last hour · peak 12/h · 5 min bars"
    )
    assert _ticks(page) == ["0", "5/h", "10/h", "15/h"]
    axis = _texts(page, "#throughput-chart text.axis")
    assert axis == ["60 min ago", "30 min ago", "now"]
    assert page.locator("#throughput-chart rect.bar-ok").count() == 10
    assert page.locator("#throughput-chart rect.bar-zero").count() == 2
    assert page.locator("#throughput-chart").get_attribute("aria-label") == (
        "10 jobs finished in the last hour"
    )


def test_chart_of_a_burst_of_twenty_thousand_jobs(served: tuple[Flask, str], page: Page) -> None:
    app, base = served
    queue = pgq.state(app).queue
    with app.app_context():
        noop.enqueue_many([[n] for n in range(20_000)])
    with in_thread(_worker(app, ["burst"], concurrency=8)):
        wait_until(
            lambda: queue.admin.counts().get("burst", {}).get(JobState.SUCCEEDED, 0) >= 20_000,
            240,
            "the worker to drain the burst",
            interval=0.5,
        )
    page.goto(base + "/")
    summary = page.locator("#throughput-summary")
    expect(summary).to_contain_text("20,000 finished in the last hour")
    ticks = _ticks(page)
    assert ticks[0] == "0" and len(ticks) >= 3
    assert all(t.endswith("/s") for t in ticks[1:]), ticks  # hundreds a second, not 20,000/min
    step = _per_second(ticks[1])
    assert [_per_second(t) for t in ticks[1:]] == [step * n for n in range(1, len(ticks))]
    titles = _texts(page, "#throughput-chart g.bucket title")
    assert len(titles) == 60
    assert sum(int(t.split(": ")[1].split(" succeeded")[0].replace(",", "")) for t in titles) == (
        20_000
    )

    # Read at most 5,000 jobs: the window shrinks to the seconds holding the newest of them.
    app.config["PGQUEUE_DASHBOARD_THROUGHPUT_CAP"] = 5_000
    page.goto(base + "/")
    expect(summary).to_contain_text(" finished in the last ")
    text_now = summary.inner_text()
    assert "hour" not in text_now, text_now
    assert int(text_now.split(" finished")[0].replace(",", "")) <= 5_000
    assert all(t.endswith("/s") for t in _ticks(page)[1:])
    expect(page.locator(".throughput-panel .legend")).to_contain_text("most recent jobs only")
