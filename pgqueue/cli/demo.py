"""``pgqueue demo``: migrate, enqueue a batch, run a worker on it and print a summary."""

from __future__ import annotations

import click

from pgqueue.cli.shared import console, database_option


@click.command()
@click.option("--jobs", "job_count", default=10_000, show_default=True, type=click.IntRange(1))
@click.option("--concurrency", default=16, show_default=True, type=click.IntRange(1))
@database_option
def demo(job_count: int, concurrency: int, database_url: str | None) -> None:
    """Migrate, enqueue JOBS jobs (some fail and retry), run a worker, print a summary."""
    from pgqueue.demo import run_demo

    run_demo(database_url, job_count=job_count, concurrency=concurrency, console=console())
