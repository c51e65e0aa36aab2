"""Durable sleep and signals inside a handler: ``ctx.sleep(seconds)`` and
``ctx.wait_for_signal(name, timeout=...)``, built on durable steps (``pgqueue.steps``).

Each call is a durable step whose name pgqueue gives it: ``pgqueue:sleep:<n>`` for the n-th
sleep of a run of the handler, ``pgqueue:signal:<name>`` for a wait. Its first call saves the
wake time (database clock) and raises ``Suspend``, which the executor turns into the
``suspend`` outcome: the job goes back to QUEUED with a ticket at that time, holding no slot
and no lease, its attempt given back. A signal moves that ticket to now. The next run of the
handler starts from the top, its earlier steps replayed, and reaches the same call again, which
now finds its saved step: a sleep whose time has come returns; a wait returns the signal's
payload once one was stored by its deadline, raises ``SignalTimeout`` once the deadline passed
without one, and otherwise suspends again until the same deadline.

Leased jobs only: an atomic job runs inside the transaction that claimed it, which holds the
job's row until the handler returns and cannot stay open across a suspension.
"""

from __future__ import annotations

from typing import Any, Final

from pgqueue import codec
from pgqueue.admin_values import check_job_id
from pgqueue.config import Settings
from pgqueue.data import signals as signals_data
from pgqueue.errors import SignalTimeout, ValidationError
from pgqueue.steps import RESERVED_PREFIX, AttemptSteps, checked_name

SIGNAL_NAME_MAX: Final = 200


class Suspend(BaseException):
    """Raised by ``ctx.sleep`` and ``ctx.wait_for_signal`` to end this run of the handler and
    suspend the job until ``wake_at`` (epoch seconds, database clock), or until signal
    ``signal`` arrives.

    A ``BaseException``, like ``GeneratorExit``: a handler's ``except Exception`` must not
    swallow it, or the handler would carry on as if the sleep had ended. Handlers never raise or
    catch it themselves."""

    def __init__(self, wake_at: float, signal: str | None) -> None:
        super().__init__(
            "suspended until a signal or its deadline"
            if signal
            else "suspended until its wake time"
        )
        self.wake_at = wake_at
        self.signal = signal


def signal_name(value: object) -> str:
    """A signal name: a non-empty string of at most ``SIGNAL_NAME_MAX`` characters without
    control characters or lone surrogates."""
    return checked_name("signal", value, SIGNAL_NAME_MAX)


def checked_signal(
    job_id: object, name: object, payload: Any, settings: Settings
) -> tuple[int, str, str]:
    """A signal's job id, name and payload as JSON text (``pgq.signal``), checked before
    anything is written; ValidationError names what is wrong."""
    checked_id = check_job_id(job_id)
    checked_name = signal_name(name)
    encoded = codec.encode_result(
        payload,
        max_bytes=settings.max_payload_bytes,
        max_depth=settings.max_json_depth,
        what=f"payload of signal {checked_name!r}",
    )
    return checked_id, checked_name, encoded


def sleep(steps: AttemptSteps, ordinal: int, seconds: float) -> None:
    """``ctx.sleep``: the ``ordinal``-th sleep of this run of the handler, ``seconds`` long
    (already checked). Returns once its time has come; raises ``Suspend`` until then."""
    name = f"{RESERVED_PREFIX}sleep:{ordinal}"
    found, saved = steps.start(name, internal=True)
    if not found:
        try:
            now, _, _ = steps.read(lambda db: signals_data.waited(db, steps.job_id, None))
        except BaseException:
            steps.abandon()
            raise
        until = round(now + seconds, 6)
        steps.finish(name, {"until": until, "seconds": seconds})
        raise Suspend(until, None)
    until = _saved_time(saved, "until", steps.job_id, name)
    now, _, _ = steps.read(lambda db: signals_data.waited(db, steps.job_id, None))
    if now < until:
        raise Suspend(until, None)


def wait_for_signal(steps: AttemptSteps, name: str, timeout: float) -> Any:
    """``ctx.wait_for_signal``: the payload of signal ``name`` (checked) once stored; raises
    ``Suspend`` while the wait lasts and ``SignalTimeout`` once ``timeout`` seconds (checked)
    passed since the wait began without it."""
    job_id = steps.job_id
    step = f"{RESERVED_PREFIX}signal:{name}"
    found, saved = steps.start(step, internal=True)
    try:
        now, payload, sent_at = steps.read(lambda db: signals_data.waited(db, job_id, name))
    except BaseException:
        if not found:
            steps.abandon()
        raise
    if not found:
        if payload is not None:
            # Sent before the wait began: nothing to save, the signal itself is durable.
            steps.abandon()
            return codec.load_json(payload)
        deadline = round(now + timeout, 6)
        steps.finish(step, {"deadline": deadline, "timeout": timeout})
        raise Suspend(deadline, name)
    deadline = _saved_time(saved, "deadline", job_id, step)
    # A signal stored after the deadline does not count, so every later run of the handler
    # (a retry after a failure further on) decides as this one did.
    if payload is not None and sent_at is not None and sent_at <= deadline:
        return codec.load_json(payload)
    if now >= deadline:
        waited = saved.get("timeout") if isinstance(saved, dict) else None
        raise SignalTimeout(job_id, name, float(waited) if waited is not None else timeout)
    raise Suspend(deadline, name)


def _saved_time(saved: Any, key: str, job_id: int, step: str) -> float:
    """The epoch ``key`` of a saved suspension step; ValidationError if the row was edited
    into something else."""
    value = saved.get(key) if isinstance(saved, dict) else None
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ValidationError(f"step {step!r} of job {job_id} has no {key} time: {saved!r}")
    return float(value)
