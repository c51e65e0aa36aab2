"""``pgqueue worker`` and ``pgqueue workers``: run worker processes (one, or a supervised group
with one metrics endpoint) after checking the schema, and list the worker registry.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import math
import sys
import time
from typing import TYPE_CHECKING, Any

import click

from pgqueue.cli.shared import (
    checked_name,
    console,
    database_option,
    did_you_mean,
    in_this_cli,
    json_option,
    known_queues,
    load_app,
    new_table,
    plural,
    print_json,
    problem_line,
    queue_for,
)
from pgqueue.config import ENV_PREFIX, MAX_CONCURRENCY, MAX_PROCESSES, Settings
from pgqueue.errors import pgqueue_logger
from pgqueue.sqlstates import is_bad_credentials, is_connection_error

if TYPE_CHECKING:
    from pgqueue.core import PgQueue

log = pgqueue_logger("pgqueue.worker")


# The settings ``pgqueue worker`` takes as flags (``--no-listen`` aside): each flag's type and
# help line. A flag given overrides the app's setting of the same name
# (``Settings.overridden``); its help names that setting's variable and default.
SETTING_FLAGS: dict[str, tuple[click.ParamType[Any, Any], str]] = {
    "concurrency": (click.IntRange(1, MAX_CONCURRENCY), "Jobs this process runs at once"),
    "poll_interval": (
        click.FloatRange(min=0.01),
        "Seconds between an idle worker's looks for work when no notification arrives",
    ),
    "lease_seconds": (
        click.FloatRange(min=0.1),
        "Seconds a claimed job's lease lasts without a heartbeat, sent every third of it",
    ),
    "shutdown_timeout": (
        click.FloatRange(min=0),
        "Seconds a stopping worker waits for running jobs before releasing them",
    ),
    "pool": (
        click.Choice(["thread", "process"]),
        "Where sync handlers run: the slots' threads, or a child process per slot (hard "
        "timeouts, crashes contained, children recycled)",
    ),
    "max_tasks_per_child": (
        click.IntRange(min=1),
        "With --pool process: replace a child after this many jobs",
    ),
    "max_memory_per_child": (
        click.IntRange(min=1),
        "With --pool process: replace a child after the job that brought it to this many MB",
    ),
    "metrics_port": (click.IntRange(1, 65535), "Serve Prometheus /metrics on this port"),
    "metrics_address": (
        click.STRING,
        "Address /metrics listens on: an IP address (0.0.0.0 or :: for every interface) or a "
        "host name",
    ),
}
# The settings a supervisor's children are not given: the supervisor serves the group's metrics.
SUPERVISOR_ONLY = frozenset({"metrics_port", "metrics_address"})


def _setting_default(name: str) -> str:
    """``$PGQUEUE_<NAME>, else <default>``: where a flag not given takes its value from."""
    default = {f.name: f.default for f in dataclasses.fields(Settings)}[name]
    variable = f"${ENV_PREFIX}{name.upper()}"
    if default is None:
        return variable
    shown = f"{default:g}" if isinstance(default, float) else str(default)
    return f"{variable}, else {shown}"


def setting_option(name: str, *short: str, metavar: str | None = None) -> Any:
    """The ``--name`` flag of setting ``name`` (``SETTING_FLAGS``): None when not given."""
    kind, text = SETTING_FLAGS[name]
    return click.option(
        f"--{name.replace('_', '-')}",
        *short,
        name,
        type=kind,
        default=None,
        metavar=metavar,
        help=f"{text} (default: {_setting_default(name)}).",
    )


def worker_options(function: Any) -> Any:
    """The options of ``pgqueue worker`` (shared with ``flask pgqueue worker``)."""
    options = [
        click.option(
            "--queues",
            "-q",
            default=None,
            callback=checked_name,
            help="Comma-separated queues (default: all).",
        ),
        setting_option("concurrency", "-c"),
        click.option(
            "--processes", "-p", default=1, show_default=True, type=click.IntRange(1, MAX_PROCESSES)
        ),
        click.option(
            "--no-listen",
            is_flag=True,
            help=f"Poll only, never LISTEN (as {ENV_PREFIX}LISTEN=false does).",
        ),
        setting_option("poll_interval"),
        setting_option("lease_seconds"),
        setting_option("shutdown_timeout"),
        setting_option("pool"),
        setting_option("max_tasks_per_child", metavar="N"),
        setting_option("max_memory_per_child", metavar="MB"),
        click.option("--drain", is_flag=True, help="Exit when no job is ready."),
        click.option(
            "--wait-for-database",
            type=click.FloatRange(min=0),
            is_flag=False,
            flag_value=math.inf,
            default=None,
            envvar="PGQUEUE_WAIT_FOR_DATABASE",
            metavar="[SECONDS]",
            help="If the database cannot be reached at start, wait for it (for SECONDS, or "
            "without a value for ever) instead of exiting with code 2 "
            "(default: $PGQUEUE_WAIT_FOR_DATABASE).",
        ),
        setting_option("metrics_port"),
        setting_option("metrics_address", metavar="ADDRESS"),
        # Given by the supervisor to its children: they stop when it is gone.
        click.option("--supervisor-pid", type=int, default=None, hidden=True),
    ]
    for option in reversed(options):
        function = option(function)
    return function


@click.command()
@click.argument("app")
@worker_options
def worker(app: str, **options: Any) -> None:
    """Run workers for the PgQueue at APP (module:attribute)."""
    pgq = load_app(app)
    run_worker_command(pgq, app_argv=[app], **options)


def setting_overrides(flags: dict[str, Any]) -> dict[str, Any]:
    """The settings the setting flags among ``flags`` (click's values) override: those given."""
    overrides = {name: flags[name] for name in SETTING_FLAGS if flags.get(name) is not None}
    if flags.get("no_listen"):
        overrides["listen"] = False
    return overrides


def setting_argv(overrides: dict[str, Any]) -> list[str]:
    """The flags that give a supervisor's child the ``overrides`` the supervisor was given."""
    argv: list[str] = []
    for name, value in overrides.items():
        if name == "listen":
            argv.append("--no-listen")
        elif name not in SUPERVISOR_ONLY:
            argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv


def run_worker_command(
    pgq: PgQueue,
    *,
    app_argv: list[str],
    queues: str | None,
    processes: int,
    drain: bool,
    wait_for_database: float | None = None,
    command_prefix: list[str] | None = None,
    supervisor_pid: int | None = None,
    **flags: Any,
) -> None:
    """Shared by ``pgqueue worker`` and ``flask pgqueue worker``; ``flags``: the setting flags
    (``SETTING_FLAGS``, ``no_listen``), None (or False) when not given."""
    overrides = setting_overrides(flags)
    settings = pgq.settings.overridden(**overrides)
    check_schema(pgq, wait_for_database=wait_for_database)
    names = [q.strip() for q in queues.split(",") if q.strip()] if queues else None
    if processes > 1:
        warn_of_unknown_queues(pgq, names or [])  # once, not by each of its processes
        from pgqueue import metrics
        from pgqueue.worker.supervisor import Supervisor

        argv = [
            *setting_argv(overrides),
            *(["--queues", queues] if queues else []),
            *(["--drain"] if drain else []),
            # Restarted while the server is down, a child waits for it: the group already
            # started, and rides out an outage as a running worker does.
            "--wait-for-database",
        ]
        pgq.url  # noqa: B018 - start the embedded server here so children share it
        # The supervisor runs no statement after the schema check: close that check's pooled
        # connection, so a host holds its worker processes' connections and not one more.
        pgq.dispose()
        prefix = command_prefix or [sys.executable, "-m", "pgqueue", "worker"]
        command = [*prefix, *app_argv, *argv]
        if not settings.metrics_port:
            sys.exit(Supervisor(command, processes).run())
        # One endpoint for the group: the children write to a shared directory it serves.
        with metrics.serve_group(settings.metrics_port, settings.metrics_address) as child_exited:
            code = Supervisor(command, processes, on_exit=child_exited).run()
        sys.exit(code)
    from pgqueue.worker import Worker

    logging.getLogger("pgqueue").setLevel(min(logging.getLogger().level, logging.INFO))
    if supervisor_pid is None:
        warn_of_unknown_queues(pgq, names or [])
    else:
        overrides["metrics_port"] = _child_metrics()
    w = Worker(pgq, queues=names, install_signal_handlers=True, **overrides)
    if supervisor_pid is not None:
        from pgqueue.worker.supervisor import watch_supervisor

        watch_supervisor(supervisor_pid, w.stop)
    freeze_startup_heap()
    w.run(drain=drain)
    if drain:
        report_left_waiting(pgq, names)


def warn_of_unknown_queues(pgq: PgQueue, queues: list[str]) -> None:
    """One line per queue of ``--queues`` that no task of the app is declared in and that has
    no jobs and no settings: a WARNING when its name is close to a known queue's (a typo would
    leave the worker idle while the jobs it was meant for wait), else an INFO line. Not
    refused: a queue chosen at enqueue time (``configure(queue=...)``) may get its first job
    after the worker starts."""
    if not queues:
        return
    declared = {task.queue for task in pgq.registry}
    known = sorted(declared | set(known_queues(pgq)))
    for queue in queues:
        if queue in known:
            continue
        meant = did_you_mean(queue, known)
        log.log(
            logging.WARNING if meant else logging.INFO,
            "queue %r of --queues has no task declared in it, no jobs and no settings%s",
            queue,
            f": check its name ({meant})" if meant else " yet",
        )


def freeze_startup_heap() -> None:
    """Keep the objects alive now (modules, the app and its tasks, SQLAlchemy's and pgqueue's
    own state) out of every later scan of the garbage collector, after collecting what is
    already garbage.

    A worker allocates a few container objects per job (the claimed job, its arguments, its
    outcome), so the collector's oldest generation is scanned often; frozen, the startup heap
    is no longer walked by each of those scans. Objects made after this are collected as
    usual. Only in a worker process of this command: in a host's own process the host
    decides (``gc.freeze()`` once its app is loaded does the same for ``pgq.run_worker()``).
    """
    gc.collect()
    gc.freeze()


def report_left_waiting(pgq: PgQueue, queues: list[str] | None) -> None:
    """After a drain, one line for the jobs it left waiting in its queues (retries and
    scheduled jobs not due yet, or ready ones it could not claim): how many, and when the
    next is due; nothing when none is left. A drain otherwise looks like an empty queue."""
    from pgqueue.states import JobState

    counts = {
        queue: by_state
        for queue, by_state in pgq.admin.capped_counts().items()
        if queues is None or queue in queues
    }
    retrying = sum(by_state.get(JobState.RETRYING, 0) for by_state in counts.values())
    queued = sum(by_state.get(JobState.QUEUED, 0) for by_state in counts.values())
    if not retrying + queued:
        return
    firsts = [
        first
        for queue, first in pgq.admin.oldest_waiting().items()
        if queues is None or queue in queues
    ]
    next_one = min(firsts, key=lambda first: first.run_at, default=None)
    if next_one is None:
        due = ""
    elif next_one.seconds_waiting < 0:
        due = (
            f"; the next, job {next_one.job_id}, is due in {-next_one.seconds_waiting:.0f} s "
            f"({next_one.run_at:%Y-%m-%d %H:%M:%S %Z})"
        )
    else:
        due = (
            f"; job {next_one.job_id} is due but was not claimed "
            f"(`pgqueue explain {next_one.job_id}` says why)"
        )
    log.info(
        "drained, leaving %s waiting (%d retrying, %d queued)%s",
        plural(retrying + queued, "job"),
        retrying,
        queued,
        in_this_cli(due),
    )


def _child_metrics() -> int:
    """A supervisor's child records metrics into the group's directory (when the supervisor
    serves one) and never serves a port itself: 0."""
    from pgqueue import metrics

    if metrics.multiprocess_dir() is not None:
        metrics.enable()
    return 0


# A worker waiting for its database tries again after this long, doubling up to the longest
# wait: a quick start when the server is nearly up, a line every few seconds at most otherwise.
FIRST_DATABASE_WAIT = 0.5
LONGEST_DATABASE_WAIT = 5.0


def check_schema(pgq: PgQueue, *, wait_for_database: float | None = None) -> None:
    """Refuse to go on unless pgqueue's schema is at this pgqueue's head (``SchemaNotCurrent``).

    A database that cannot be reached (server down, login refused, TLS refused) ends the
    command with its one-line error, so that a process manager restarts the worker. With
    ``wait_for_database`` (seconds, ``math.inf`` for ever) such failures are logged one line
    each, at most one every ``LONGEST_DATABASE_WAIT`` seconds, until the database answers and
    the schema is checked, or the time is up and the last failure ends the command.
    """
    from sqlalchemy.exc import DBAPIError

    from pgqueue import migrations
    from pgqueue.worker.patience import Pauses

    deadline = None if wait_for_database is None else time.monotonic() + wait_for_database
    pauses = Pauses(first=FIRST_DATABASE_WAIT, longest=LONGEST_DATABASE_WAIT)
    while True:
        try:
            with pgq.engine.connect() as connection:
                migrations.check_schema(connection)
            return
        except DBAPIError as exc:
            if deadline is None or not (is_connection_error(exc) or is_bad_credentials(exc)):
                raise
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            pause = min(pauses.next(), left)
            problem = problem_line(exc, lambda: pgq.engine.url.database) or str(exc)
            log.warning("waiting for the database: %s; next try in %.1fs", problem, pause)
            time.sleep(pause)


@click.command()
@click.option(
    "--all",
    "include_stale",
    is_flag=True,
    help="Also list workers gone stale (killed or cut off) whose rows are not deleted yet.",
)
@json_option
@database_option
def workers(include_stale: bool, as_json: bool, database_url: str | None) -> None:
    """List the running worker processes (the worker registry)."""
    import datetime as dt

    pgq = queue_for(database_url)
    found = pgq.admin.list_workers(include_stale=include_stale)
    if as_json:
        print_json(
            [
                {
                    "id": w.id,
                    "host": w.host,
                    "pid": w.pid,
                    "queues": list(w.queues),
                    "concurrency": w.concurrency,
                    "version": w.version,
                    "started_at": w.started_at.isoformat(),
                    "last_seen_at": w.last_seen_at.isoformat(),
                    "seconds_since_seen": round(w.seconds_since_seen, 3),
                    "live": w.live,
                    "running": w.running,
                    "healthy": w.healthy,
                    "claim_error": w.claim_error,
                    "seconds_failing": (
                        None if w.seconds_failing is None else round(w.seconds_failing, 3)
                    ),
                    "tasks": None if w.tasks is None else list(w.tasks),
                    "pool": w.pool,
                }
                for w in found
            ]
        )
        return
    table = new_table(f"pgqueue workers ({pgq.settings.worker_stale_seconds:g}s to stale)")
    columns = ("id", "host", "pid", "queues", "concurrency", "pool", "running", "version")
    for column in (*columns, "started", "last seen", "health"):
        table.add_column(column, justify="right" if column in ("pid", "running") else "left")
    for w in found:
        health = (
            "ok"
            if w.claim_error is None
            else f"claims failing for {w.seconds_failing or 0:.0f}s: {w.claim_error}"
        )
        table.add_row(
            w.id,
            w.host,
            str(w.pid),
            ",".join(w.queues) or "*",
            str(w.concurrency),
            w.pool or "?",
            str(w.running),
            w.version,
            f"{w.started_at.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S}",
            f"{w.seconds_since_seen:.0f}s ago" + ("" if w.live else " (stale)"),
            health,
        )
    console().print(table)
