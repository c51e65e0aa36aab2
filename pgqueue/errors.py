"""The pgqueue exception tree, and how errors are written down: one line, a stored text with
row values hidden, the log records of pgqueue's loggers.

Everything pgqueue raises on purpose derives from :class:`PgQueueError`. Input problems are
:class:`ValidationError` subclasses and are always raised before any SQL is sent. Database
errors are classified by SQLSTATE in ``pgqueue.sqlstates``.
"""

from __future__ import annotations

import logging
import os
import re
import traceback
from pathlib import Path
from typing import Final


class PgQueueError(Exception):
    """Base class of every error pgqueue raises on purpose."""


class ConfigurationError(PgQueueError):
    """A setting (database URL, interval, limit...) is missing or malformed."""


class EmbeddedPostgresError(PgQueueError):
    """The embedded PostgreSQL server could not be found, initialised or started."""


class ValidationError(PgQueueError, ValueError):
    """Input refused before any SQL ran: bad queue name, bad delay, bad priority..."""


class SerializationError(ValidationError, TypeError):
    """Task arguments (or a result) cannot be stored as JSON."""


class PayloadTooLarge(ValidationError):
    """Encoded task arguments exceed the configured size limit."""


class UnknownTask(PgQueueError, LookupError):
    """A task name that no registry knows."""


class JobNotFound(PgQueueError, LookupError):
    """No job with the given id."""


class WorkflowNotFound(PgQueueError, LookupError):
    """No workflow with the given id."""


class ScheduleNotFound(PgQueueError, LookupError):
    """No periodic schedule of that name, in the code or in the database."""


class JobWaitTimeout(PgQueueError, TimeoutError):
    """A job did not finish within the time ``PgQueue.wait_for`` or ``await_job`` waited.

    ``job_id``, ``state`` (the job's state when the wait ended, a ``JobState`` value) and
    ``timeout`` (seconds) say which job, where it was, and how long was waited."""

    def __init__(self, job_id: int, state: str, timeout: float) -> None:
        super().__init__(f"job {job_id} did not finish within {timeout:g} s; it is still {state}")
        self.job_id = job_id
        self.state = state
        self.timeout = timeout


class SignalTimeout(PgQueueError, TimeoutError):
    """Raised by ``ctx.wait_for_signal(name, timeout=...)`` in the handler when no signal
    ``name`` reached the job within ``timeout`` seconds of the wait's start (database clock).

    ``job_id``, ``signal`` and ``timeout`` say which job waited, for what and how long. The
    handler may catch it; uncaught, it fails the attempt like any other exception."""

    def __init__(self, job_id: int, signal: str, timeout: float) -> None:
        super().__init__(f"job {job_id} waited {timeout:g} s for signal {signal!r}")
        self.job_id = job_id
        self.signal = signal
        self.timeout = timeout


class QueueFull(PgQueueError):
    """An enqueue would take a bounded queue above its ``max_depth`` waiting jobs
    (``set_queue_max_depth``); nothing of that enqueue was written, and the caller's
    transaction is still usable.

    ``queue`` names the queue, ``max_depth`` is its bound, ``depth`` how many jobs were
    waiting in it (counted up to just above the bound), ``asked`` how many jobs the enqueue
    asked to add to it."""

    def __init__(self, queue: str, max_depth: int, depth: int, asked: int) -> None:
        waiting = f"more than {max_depth}" if depth > max_depth else str(depth)
        super().__init__(
            f"queue {queue!r} is full: {waiting} of at most {max_depth} waiting jobs, "
            f"{asked} more asked for"
        )
        self.queue = queue
        self.max_depth = max_depth
        self.depth = depth
        self.asked = asked


class UniqueKeyHeld(PgQueueError):
    """A workflow was not enqueued because the ``unique_key`` of one of its members is held by
    a job that has not ended, or a job was not retried because its own is (``refused`` says
    which job); nothing was written, and the caller's transaction is still usable.

    ``key`` is the key, ``job_id`` the holder's id and ``workflow_id`` the holder's workflow
    (None when it is not a workflow member), so the caller can use the holder instead."""

    def __init__(
        self, key: str, job_id: int, workflow_id: int | None, *, refused: str | None = None
    ) -> None:
        holder = f"job {job_id}" + ("" if workflow_id is None else f" of workflow {workflow_id}")
        super().__init__(
            f"workflow not enqueued: unique_key {key!r} of one of its members is held by {holder}"
            if refused is None
            else f"{refused}: its unique_key {key!r} is held by {holder}, which has not ended; "
            "retry it once that job has ended"
        )
        self.key = key
        self.job_id = job_id
        self.workflow_id = workflow_id


class InvalidStateTransition(PgQueueError):
    """A transition was asked for from a state the transition table does not allow."""


class LeaseLost(PgQueueError):
    """This worker no longer holds the job's lease (it expired and the job was rescued, or the
    job was deleted), so what it tried to record for the job was refused."""


class SchemaNotCurrent(PgQueueError):
    """pgqueue's tables are missing, or at another revision than this pgqueue's head."""


class SchemaRecordedElsewhere(PgQueueError):
    """pgqueue's revisions are recorded in a version table that a host application's own
    Alembic manages (or its tables exist with no revision recorded anywhere), so upgrading or
    downgrading them here could only fail or disagree with that history; nothing was changed."""


class UnknownRevision(ValidationError, LookupError):
    """A migration was asked for a revision that pgqueue's lineage does not have (or cannot
    reach from where the schema is); nothing was changed."""


class NotSchemaOwner(PgQueueError, PermissionError):
    """A schema change (a migration, a history partition) was refused because this database
    role does not own pgqueue's tables (SQLSTATE 42501)."""


class AtomicSessionMisuse(PgQueueError):
    """An atomic task's handler called ``commit()``, ``rollback()`` or ``close()`` on its
    session, whose transaction holds the job's claim: pgqueue commits it with the handler's
    writes when the handler returns, and rolls back the handler's writes when it raises."""


class AtomicTransactionLost(PgQueueError):
    """An atomic attempt's transaction ended before its outcome was recorded (a ROLLBACK or
    COMMIT sent through the handler's session, or the transaction failed): the handler's writes
    went with it, and the worker records the attempt, whose claim had committed, as failed."""


class DowngradeLosesData(PgQueueError):
    """A downgrade was refused because its steps would drop rows or values (see
    ``pgqueue.migrations.losses``); nothing was changed. ``losses`` names each one."""

    def __init__(self, message: str, losses: list[str]) -> None:
        super().__init__(message)
        self.losses = losses


class MigrationRefused(PgQueueError):
    """A revision refused to run because of rows the database holds (its message names them
    and says how to clear them); nothing of that revision was changed. Raised after an online
    step of the same run committed, it is the cause of a ``MigrationInterrupted``."""


class MigrationInterrupted(PgQueueError):
    """A migration failed after it had committed part of its work: a revision that builds
    indexes ``CONCURRENTLY`` commits the revisions before it. ``revision`` is the one now
    recorded (None: base, or it could not be read); the error it failed on is the
    ``__cause__``. Migrating again continues from there."""

    def __init__(self, message: str, revision: str | None) -> None:
        super().__init__(message)
        self.revision = revision


class BulkCountChanged(PgQueueError):
    """A bulk action matched a different number of jobs than the preview it was confirmed from;
    nothing was changed."""


# SQLSTATE classes, https://www.postgresql.org/docs/current/errcodes-appendix.html
# Lines SQLAlchemy appends after an error's message: the statement, its parameters and a link;
# and the server's DETAIL and HINT lines, which follow the message itself.
_DECORATION_PREFIXES = (
    "(Background on this error at",
    "[SQL:",
    "[parameters:",
    "[SQL parameters hidden",
    "[parameters hidden",
    "DETAIL:",
    "HINT:",
)

# The row PostgreSQL quotes in a constraint violation's DETAIL holds the row's values (for
# pgqueue_jobs: args, result, errors); SQLAlchemy's ``[parameters: ...]`` line holds the
# statement's bound values unless the engine hides them. Both are job data.
_FAILING_ROW: Final = "Failing row contains ("
_ROW_HIDDEN: Final = "Failing row contains (values hidden)."
_PARAMETERS: Final = re.compile(r"^\[parameters: .*$", re.MULTILINE)
_PARAMETERS_HIDDEN: Final = "[parameters hidden]"
# Where a quoted row ends when only the text is known: the next part of a SQLAlchemy error or
# of a chained traceback (each value in the row is cut to 64 bytes by the server, so a value
# can hold little of what follows).
_AFTER_ROW: Final = re.compile(
    r"\n(?=\[SQL: |\[parameters|\(Background on this error|\nThe above exception|\nDuring handling)"
)


def hide_row_values(text: str, exc: BaseException | None = None) -> str:
    """``text`` (an error's message or traceback) without the job data a database error puts in
    it: the row of ``DETAIL: Failing row contains (...)`` and SQLAlchemy's ``[parameters:
    ...]`` line. With ``exc`` (the error ``text`` was made from) the server's exact DETAIL
    texts are replaced; without it, a quoted row is cut up to what follows it."""
    for detail in _row_details(exc):
        text = text.replace(detail, _ROW_HIDDEN)
    start = text.find(_FAILING_ROW)
    while start != -1:
        end_match = _AFTER_ROW.search(text, start)
        end = len(text) if end_match is None else end_match.start()
        text = text[:start] + _ROW_HIDDEN + text[end:]
        start = text.find(_FAILING_ROW, start + len(_ROW_HIDDEN))
    return _PARAMETERS.sub(_PARAMETERS_HIDDEN, text)


def _row_details(exc: BaseException | None) -> list[str]:
    found: list[str] = []
    seen: set[int] = set()
    pending = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        detail = getattr(getattr(current, "diag", None), "message_detail", None)
        if isinstance(detail, str) and detail.startswith(_FAILING_ROW):
            found.append(detail)
        orig = getattr(current, "orig", None)
        pending += [
            orig if isinstance(orig, BaseException) else None,
            current.__cause__,
            current.__context__,
        ]
    return found


def error_text(exc: BaseException) -> str:
    """The traceback of ``exc`` (with its chain) as recorded and logged: row values and bound
    parameters hidden (``hide_row_values``)."""
    return hide_row_values("".join(traceback.format_exception(exc)), exc)


# pgqueue's own source files: the frames that lead from the worker to a handler.
_PACKAGE_DIRECTORY = str(Path(__file__).resolve().parent) + os.sep


def handler_error_text(exc: BaseException) -> str:
    """``error_text`` of an error a handler raised, as a job records it: the outermost
    traceback starts at the handler's first frame, without the frames of pgqueue that called it
    (the worker's executor, the Flask extension's app context), which every error would repeat.
    An error raised inside pgqueue itself (no frame of the application) keeps every frame."""
    summary = traceback.TracebackException.from_exception(exc)
    frames = list(summary.stack)
    first_own = next(
        (i for i, frame in enumerate(frames) if not frame.filename.startswith(_PACKAGE_DIRECTORY)),
        None,
    )
    if first_own:
        summary.stack = traceback.StackSummary.from_list(frames[first_own:])
    return hide_row_values("".join(summary.format()), exc)


# The header of a traceback, and of an exception group's (whose block is drawn in a margin of
# ``|``); the last one at the left edge starts the error the text records (its causes come
# before it).
_TRACEBACK_HEADER: Final = re.compile(
    r"(?:Traceback|  \+ Exception Group Traceback) \(most recent call last\):$"
)
_GROUP_MARGIN: Final = re.compile(r"^  \| ?")
# Lines that never name an error: a caret (PostgreSQL's under its ``LINE n:`` excerpt of the
# statement), SQLAlchemy's and the server's additions after the message, and a traceback's own
# headers and separators (its frames are told apart by their indent).
_NOT_A_NAME: Final = re.compile(
    r"[\^~]+$|LINE \d+: |Traceback \(most recent call last\)"
    r"|The above exception was|During handling of the above exception|\.\.\. \[traceback truncated"
    r"|" + "|".join(re.escape(prefix) for prefix in _DECORATION_PREFIXES)
)


def error_summary(recorded: str | None, limit: int = 200) -> str:
    """The line naming a recorded error (a job's ``last_error``, an ``errors`` entry): what the
    worker's log line, the CLI and the dashboard show of it, cut to ``limit`` characters.

    In a traceback that is the line after the frames of its last exception, the first of that
    exception's message: ``sqlalchemy.exc.ProgrammingError: (psycopg.errors.UndefinedTable)
    relation "nope" does not exist``, not the ``LINE 1:`` excerpt, caret, ``[SQL: ...]`` and
    documentation link that follow it. In any other text (a ``Retry`` reason, a timeout) it is
    the first line that names something.
    """
    if not recorded:
        return ""
    lines = hide_row_values(recorded).splitlines()
    start, in_traceback = 0, False
    for index, line in enumerate(lines):
        if _TRACEBACK_HEADER.match(line):
            start, in_traceback = index + 1, True
        elif line == _CUT_MARKER.strip():
            # A cut text resumes inside a line: the one after the marker is a fragment.
            start, in_traceback = index + 2, True
    candidates = lines[start:]
    if in_traceback:
        # A traceback's frames are indented; the exception's line is not.
        candidates = [_GROUP_MARGIN.sub("", line) for line in candidates]
        candidates = [line for line in candidates if not line[:1].isspace()]
    named = next((line.strip() for line in candidates if _names_an_error(line)), None)
    if named is None:  # a traceback cut where its last error was: the first one it has
        unindented = (line for line in lines if not line[:1].isspace())
        named = next((line.strip() for line in unindented if _names_an_error(line)), "")
    return named if len(named) <= limit else named[: limit - 1] + "…"


def _names_an_error(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and not _NOT_A_NAME.match(stripped)


class _HideRowValues(logging.Filter):
    """Formats a record's traceback with ``error_text``, so the handlers print that one (a
    formatter uses ``exc_text`` when it is set)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            record.exc_text = error_text(record.exc_info[1]).rstrip("\n")
        return True


_HIDE_ROW_VALUES: Final = _HideRowValues()


def pgqueue_logger(name: str) -> logging.Logger:
    """The logger ``name`` of pgqueue's, whose logged tracebacks hide row values and bound
    parameters (a filter applies to the records of its own logger only, so each gets it)."""
    logger = logging.getLogger(name)
    if _HIDE_ROW_VALUES not in logger.filters:
        logger.addFilter(_HIDE_ROW_VALUES)
    return logger


# Set on a driver error raised while one of pgqueue's connections was being opened: the
# failure's own text and the server it was for, kept apart from the rewritten message so that a
# caller who knows better (the listener, whose connection an engine opens) can rename it.
_CONNECT_FAILURE: Final = "pgqueue_connect_failure"


# PgBouncer's answer to the startup ``options`` pgqueue sends on a direct connection.
POOLER_REFUSAL = "unsupported startup parameter: options"
POOLER_HINT = (
    "a pooler (PgBouncer) refuses the startup options pgqueue sends to a server; "
    "set PGQUEUE_POOLER=transaction (Settings(pooler='transaction')) to connect through it"
)


def name_connection_failure(
    exc: BaseException, name: str | None, target: str | None = None
) -> None:
    """Rewrite, in place, the message of ``exc`` (raised while opening a connection) as one line
    naming the connection: ``pgqueue connection to <target> failed: <reason>``, or ``pgqueue
    <name> connection ...`` for one with a role of its own (the worker's ``listener``).

    In place, so its type, SQLSTATE and cause stay as they were and it is classified (and
    retried) exactly as before.
    """
    known = getattr(exc, _CONNECT_FAILURE, None)
    if known is None:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        reason = "; ".join(lines) or type(exc).__name__
        reason = reason.removeprefix("connection failed: ")  # psycopg's own, said again below
        if POOLER_REFUSAL in reason:
            reason += f"; {POOLER_HINT}"
        known = (reason, None)
    reason, known_target = known
    target = target or known_target
    setattr(exc, _CONNECT_FAILURE, (reason, target))
    where = f" to {target}" if target else ""
    label = f"pgqueue {name} connection" if name else "pgqueue connection"
    exc.args = (f"{label}{where} failed: {reason}",)


def connection_failure(exc: BaseException) -> str | None:
    """The one-line message of a named failure to open a connection (``name_connection_failure``)
    found in ``exc`` or what it wraps, else None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if getattr(current, _CONNECT_FAILURE, None) is not None:
            return str(current.args[0])
        orig = getattr(current, "orig", None)
        current = orig if isinstance(orig, BaseException) else current.__cause__
    return None


def error_line(exc: BaseException) -> str:
    """``Type: first line of the message``; for a database error, the driver's exception and
    the server's (or driver's) message, without SQLAlchemy's statement and parameters, which
    may carry job data."""
    error = getattr(exc, "orig", None) or exc
    lines = hide_row_values(str(error), exc).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


_REPR_LIMIT: Final = 60


def short_repr(value: object) -> str:
    """``repr`` of a value for an error message, cut to a few dozen characters."""
    text = repr(value)
    return text if len(text) <= _REPR_LIMIT else text[: _REPR_LIMIT - 5] + "...'" + text[-1:]


_CUT_MARKER = "\n... [traceback truncated] ...\n"


def storable_text(text: str, limit: int) -> str:
    """``text`` as PostgreSQL stores it in a ``text`` column and in a ``jsonb`` string, in at
    most ``limit`` UTF-8 bytes (``limit`` >= 256).

    Neither type holds a NUL character, which becomes the four characters ``\\x00``; a lone
    surrogate is not valid UTF-8 and becomes its ``\\udXXX`` escape. A text still too long
    keeps its head (where a traceback starts) and its tail (the error itself) around a marker.
    """
    encoded = text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace")
    if len(encoded) <= limit:
        return encoded.decode("utf-8")
    half = (limit - len(_CUT_MARKER)) // 2
    # A cut inside a multi-byte character drops that character's partial bytes.
    return (
        encoded[:half].decode("utf-8", "ignore")
        + _CUT_MARKER
        + encoded[-half:].decode("utf-8", "ignore")
    )
