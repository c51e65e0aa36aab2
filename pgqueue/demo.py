"""``pgqueue demo``: a real run on a real PostgreSQL, with a progress bar and a summary.

It creates a fresh ``pgqueue_demo`` database (on the embedded server unless a URL is given),
migrates it, enqueues jobs of which every 20th fails its first attempt and every 1000th always
fails, runs a worker until every job is final, and prints what happened.

On a server named by a URL, a ``pgqueue_demo`` database that already exists is dropped only if
an earlier demo created it (it carries ``DEMO_MARK`` as its comment): a database of that name
made by anyone else is someone's data, and the demo refuses to run rather than destroy it. The
embedded server is the demo's own, so there it always starts afresh.
"""

from __future__ import annotations

import threading
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from sqlalchemy import create_engine

from pgqueue import backoff
from pgqueue.config import Settings
from pgqueue.core import PgQueue
from pgqueue.database_urls import normalize_database_url, redact_url
from pgqueue.embedded import shared_server
from pgqueue.errors import ConfigurationError
from pgqueue.sql.server import (
    comment_on_database,
    create_database,
    database_comment,
    drop_database,
)
from pgqueue.states import FINAL_STATES, JobState
from pgqueue.worker import Worker

DEMO_DATABASE = "pgqueue_demo"
# The comment the demo puts on the database it creates: the only sign that it may drop it.
DEMO_MARK = "created by pgqueue demo; pgqueue demo drops and recreates it"


def _fresh_database(base_url: str, *, own_server: bool) -> str:
    """A new, empty ``pgqueue_demo`` on the server of ``base_url``, marked as the demo's.

    An existing one is dropped first when ``own_server`` (the embedded server) or when it
    carries ``DEMO_MARK``; otherwise ``ConfigurationError``, with nothing dropped."""
    url = normalize_database_url(base_url)
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            found = connection.execute(database_comment(), {"name": DEMO_DATABASE}).all()
            if found and found[0][0] != DEMO_MARK and not own_server:
                where = url.render_as_string(hide_password=True)
                raise ConfigurationError(
                    f"database {DEMO_DATABASE} already exists on {where} and pgqueue demo did "
                    "not create it: refusing to drop it (drop or rename it yourself, or point "
                    "the demo at another server)"
                )
            connection.execute(drop_database(DEMO_DATABASE))
            connection.execute(create_database(DEMO_DATABASE))
            connection.execute(comment_on_database(DEMO_DATABASE, DEMO_MARK))
    finally:
        admin.dispose()
    return url.set(database=DEMO_DATABASE).render_as_string(hide_password=False)


def build_demo_queue(url: str) -> PgQueue:
    pgq = PgQueue(url, settings=Settings.from_env(poll_interval=0.5))

    @pgq.task(name="demo.resize_image", retry=backoff.constant(0.5), max_attempts=3)
    def resize_image(image_id: int, width: int) -> dict[str, int]:
        # Deterministic failures so the summary is reproducible.
        if image_id % 1000 == 0:
            raise RuntimeError(f"image {image_id} is corrupt")
        if image_id % 20 == 0 and not _seen(image_id):
            raise ConnectionError(f"storage timeout for image {image_id}")
        return {"image_id": image_id, "width": width, "height": width * 3 // 4}

    return pgq


_attempted: set[int] = set()
_attempted_lock = threading.Lock()


def _seen(image_id: int) -> bool:
    with _attempted_lock:
        if image_id in _attempted:
            return True
        _attempted.add(image_id)
        return False


def run_demo(
    database_url: str | None, *, job_count: int, concurrency: int, console: Console
) -> None:
    started = time.monotonic()
    if database_url is None:
        console.print("Starting the embedded PostgreSQL server ...")
        # Asked for by name here, so none of the library's fallback warning.
        settings = Settings.from_env()
        base_url = shared_server(settings.embedded_data_dir, bin_dir=settings.embedded_bin_dir)
    else:
        base_url = database_url
    url = _fresh_database(base_url, own_server=database_url is None)
    pgq = build_demo_queue(url)
    pgq.migrate()
    console.print(f"Database ready in {time.monotonic() - started:.1f}s: {redact_url(pgq.url)}")

    task = pgq.registry.get("demo.resize_image")
    enqueue_started = time.monotonic()
    ids = task.enqueue_many([{"image_id": i, "width": 640} for i in range(1, job_count + 1)])
    enqueue_seconds = time.monotonic() - enqueue_started
    console.print(
        f"Enqueued {job_count:,} job{'' if job_count == 1 else 's'} in {enqueue_seconds:.2f}s (one transaction, COPY)"
    )

    worker = Worker(pgq, concurrency=concurrency)
    thread = threading.Thread(target=worker.run, name="demo-worker", daemon=True)
    run_started = time.monotonic()
    thread.start()
    with Progress(
        TextColumn("[bold]jobs"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]:>8.0f} jobs/s"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        bar = progress.add_task("jobs", total=job_count, rate=0.0)
        while True:
            counts = pgq.counts().get("default", {})
            final = sum(n for state, n in counts.items() if state in FINAL_STATES)
            elapsed = time.monotonic() - run_started
            progress.update(bar, completed=final, rate=final / elapsed if elapsed else 0.0)
            if final >= job_count:
                break
            time.sleep(0.2)
    run_seconds = time.monotonic() - run_started
    worker.stop()
    thread.join()

    counts = pgq.counts().get("default", {})
    stats = worker.stats
    table = Table(title="pgqueue demo summary")
    table.add_column("what")
    table.add_column("count", justify="right")
    table.add_row("jobs enqueued", f"{job_count:,}")
    table.add_row("succeeded", f"{counts.get(JobState.SUCCEEDED, 0):,}")
    table.add_row(
        "  of which after a retry", f"{stats.retried - counts.get(JobState.FAILED, 0) * 2:,}"
    )
    table.add_row("attempts that failed and were retried", f"{stats.retried:,}")
    table.add_row("failed for good (after 3 attempts)", f"{counts.get(JobState.FAILED, 0):,}")
    table.add_row("attempts run", f"{stats.processed:,}")
    table.add_row("wall time", f"{run_seconds:.2f}s")
    table.add_row("throughput", f"{job_count / run_seconds:,.0f} jobs/s")
    console.print(table)
    console.print(_next_steps(url, ids, embedded=database_url is None))
    pgq.dispose()


def _next_steps(url: str, ids: list[int], *, embedded: bool) -> str:
    """What to run next to look at the demo's jobs, which stay in ``pgqueue_demo``: the
    embedded server starts again for each command (it stops when the demo exits)."""
    if embedded:
        prefix = f"PGQUEUE_EMBEDDED_DATABASE={DEMO_DATABASE} "
        where = "in database pgqueue_demo of the embedded server (it starts again for each)"
    else:
        prefix = "PGQUEUE_DATABASE_URL=... "
        where = f"in {redact_url(url)} (give that URL, with its password, as PGQUEUE_DATABASE_URL)"
    failing = [i for n, i in enumerate(ids, start=1) if n % 1000 == 0] or ids[:1]
    return "\n".join(
        [
            f"\nThe jobs stay {where}. Next:",
            f"  {prefix}pgqueue stats",
            f"  {prefix}pgqueue jobs --state failed",
            f"  {prefix}pgqueue show {failing[0]}",
            "Then your own app: the tutorial, docs/tutorial.md in pgqueue's source.",
        ]
    )
