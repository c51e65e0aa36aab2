"""The one place that classifies database errors by SQLSTATE (never by message text), so the
unit of work and the worker decide in one place what is retryable: transient conflicts,
timeouts, lost connections and sessions, refused credentials and privileges.
"""

from __future__ import annotations

from typing import Final

SERIALIZATION_FAILURE: Final = "40001"
DEADLOCK_DETECTED: Final = "40P01"
LOCK_NOT_AVAILABLE: Final = "55P03"
QUERY_CANCELED: Final = "57014"  # statement_timeout lands here too
ADMIN_SHUTDOWN: Final = "57P01"  # pg_terminate_backend, server shutdown
CRASH_SHUTDOWN: Final = "57P02"
CANNOT_CONNECT_NOW: Final = "57P03"
IDLE_SESSION_TIMEOUT: Final = "57P05"
INSUFFICIENT_PRIVILEGE: Final = "42501"  # "permission denied for ..."
UNDEFINED_TABLE: Final = "42P01"
LOGIN_REFUSED: Final = "28P01"  # wrong password
INVALID_AUTHORIZATION: Final = "28000"  # no such role, or pg_hba.conf refused it
INVALID_STATEMENT_NAME: Final = "26000"  # "prepared statement ... does not exist"
INVALID_SAVEPOINT: Final = "3B001"  # "savepoint ... does not exist"
DUPLICATE_PREPARED_STATEMENT: Final = "42P05"
UNIQUE_VIOLATION: Final = "23505"

_TRANSIENT_CONFLICTS: Final = frozenset({SERIALIZATION_FAILURE, DEADLOCK_DETECTED})
_CONNECTION_STATES: Final = frozenset(
    {ADMIN_SHUTDOWN, CRASH_SHUTDOWN, CANNOT_CONNECT_NOW, IDLE_SESSION_TIMEOUT}
)


def sqlstate_of(exc: BaseException) -> str | None:
    """The SQLSTATE carried by a psycopg error (psycopg 3's ``sqlstate``, or psycopg2's
    ``pgcode``: an app's own session may use psycopg2), possibly wrapped by SQLAlchemy."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        state = getattr(current, "sqlstate", None) or getattr(current, "pgcode", None)
        if isinstance(state, str):
            return state
        orig = getattr(current, "orig", None)
        current = orig if isinstance(orig, BaseException) else current.__cause__
    return None


def is_transient_conflict(exc: BaseException) -> bool:
    """True for deadlock or serialization failure: the whole transaction may be retried."""
    return sqlstate_of(exc) in _TRANSIENT_CONFLICTS


_TIMEOUTS: Final = frozenset({QUERY_CANCELED, LOCK_NOT_AVAILABLE})


def is_timeout(exc: BaseException) -> bool:
    """True when a statement was cancelled (``statement_timeout``, an operator's cancel) or gave
    up waiting for a lock (``lock_timeout``, ``NOWAIT``): nothing about the work itself was
    refused, so it may be tried again once the blocker is gone."""
    return sqlstate_of(exc) in _TIMEOUTS


# The server ended the session before (or instead of) running the statement: an administrator's
# terminate or a shutdown (57P01) aborts the transaction in progress (a commit under way runs
# to its end before the session checks for the signal, and its answer is sent first); an idle
# session timeout (57P05) fires only between statements; 57P03 refuses the connection itself.
# A server crash (57P02) is not here: it can come after a commit reached the WAL.
_ENDED_BEFORE_COMMIT: Final = frozenset({ADMIN_SHUTDOWN, CANNOT_CONNECT_NOW, IDLE_SESSION_TIMEOUT})


def ended_before_commit(exc: BaseException) -> bool:
    """True when the server ended the session without committing the work it was given, so
    running that work again on a new connection cannot do it twice."""
    return sqlstate_of(exc) in _ENDED_BEFORE_COMMIT


def is_insufficient_privilege(exc: BaseException) -> bool:
    """True when the role lacks a right (e.g. ``pgqueue migrate`` run with DML rights only)."""
    return sqlstate_of(exc) == INSUFFICIENT_PRIVILEGE


def is_lock_timeout(exc: BaseException) -> bool:
    """True when a statement gave up waiting for a lock (``lock_timeout``, or ``NOWAIT``)."""
    return sqlstate_of(exc) == LOCK_NOT_AVAILABLE


def is_undefined_table(exc: BaseException) -> bool:
    """True when a statement named a table that does not exist (for pgqueue's own statements:
    the schema was never migrated)."""
    return sqlstate_of(exc) == UNDEFINED_TABLE


def is_unique_violation(exc: BaseException) -> bool:
    """True when a statement would have written a second row under a unique index (for
    pgqueue's statements: a second job holding one ``unique_key``)."""
    return sqlstate_of(exc) == UNIQUE_VIOLATION


def is_bad_credentials(exc: BaseException) -> bool:
    """True when the server refused the login: wrong password, unknown role, or no
    ``pg_hba.conf`` entry lets it in."""
    return sqlstate_of(exc) in {LOGIN_REFUSED, INVALID_AUTHORIZATION}


# The session's prepared statements are not the ones the driver believes it made (something
# dropped or made them behind its back): the driver would send the same wrong name on every
# later use of the connection. The statement failed before it ran, so it can be sent again on
# another connection; this one is dropped.
_LOST_SESSION_STATES: Final = frozenset({INVALID_STATEMENT_NAME, DUPLICATE_PREPARED_STATEMENT})


def is_transaction_ended(exc: BaseException) -> bool:
    """True when a savepoint pgqueue made is gone: the transaction it was made in has ended
    (something sent ROLLBACK or COMMIT), and the statements since ran outside it."""
    return sqlstate_of(exc) == INVALID_SAVEPOINT


def is_lost_session_state(exc: BaseException) -> bool:
    """True when the session's prepared statements disagree with the driver's: the connection
    must not be used again."""
    return sqlstate_of(exc) in _LOST_SESSION_STATES


def is_connection_error(exc: BaseException) -> bool:
    """True when the connection itself is gone (terminated backend, restart, network) or can no
    longer be used (``is_lost_session_state``): the work may be tried on another connection."""
    state = sqlstate_of(exc)
    if state is not None:
        return (
            state in _CONNECTION_STATES or state in _LOST_SESSION_STATES or state.startswith("08")
        )
    # psycopg raises OperationalError without SQLSTATE for a closed socket; SQLAlchemy marks it.
    return bool(getattr(exc, "connection_invalidated", False)) or _is_psycopg_operational(exc)


def _is_psycopg_operational(exc: BaseException) -> bool:
    import psycopg

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if (
            isinstance(current, psycopg.OperationalError)
            and getattr(current, "sqlstate", None) is None
        ):
            return True
        orig = getattr(current, "orig", None)
        current = orig if isinstance(orig, BaseException) else current.__cause__
    return False
