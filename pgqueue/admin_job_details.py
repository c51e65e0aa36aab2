"""What a job's page shows beyond its row, read through ``pgq.admin``: the signals stored for
the job and, while it is suspended, what it waits for (``job_signals``). ``admin.Admin`` holds
this method with the rest of the admin API."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from pgqueue.admin_runner import AdminRunner, Work
from pgqueue.admin_values import check_job_id
from pgqueue.data import job_details as details_data
from pgqueue.db import Executor


@dataclass(frozen=True, slots=True)
class ReceivedSignal:
    """A signal stored for a job: its name, its payload (JSON) and when it was stored."""

    name: str
    payload: Any
    sent_at: dt.datetime


@dataclass(frozen=True, slots=True)
class JobSignals:
    """The signals of one job: ``received``, oldest first; and while the job is suspended,
    ``waiting_for`` (the signal its ``ctx.wait_for_signal`` waits for; None for a
    ``ctx.sleep``), ``wake_at`` (when it runs again by itself) and ``arrived`` (the signal
    waited for is stored: an idle worker resumes the job). ``suspended`` is False, and those
    None, when the job is not suspended."""

    received: tuple[ReceivedSignal, ...]
    suspended: bool = False
    waiting_for: str | None = None
    wake_at: dt.datetime | None = None
    arrived: bool = False


class JobDetails(AdminRunner):
    """The reads of a job's page beyond ``get_job`` (see the module)."""

    def job_signals(self, job_id: int) -> JobSignals:
        """The signals stored for job ``job_id`` and what it waits for while suspended; empty for a job that does not exist (or was moved to the history)."""
        return self._read(self._job_signals(job_id))

    async def ajob_signals(self, job_id: int) -> JobSignals:
        """``job_signals`` for asyncio."""
        return await self._aread(self._job_signals(job_id))

    def _job_signals(self, job_id: int) -> Work[JobSignals]:
        job_id = check_job_id(job_id)

        def read(ex: Executor) -> JobSignals:
            received = tuple(
                ReceivedSignal(name, payload, sent_at)
                for name, payload, sent_at in details_data.received(ex, job_id)
            )
            waiting = details_data.waiting(ex, job_id)
            if waiting is None:
                return JobSignals(received)
            signal, wake_at, arrived = waiting
            return JobSignals(received, True, signal, wake_at, bool(arrived))

        return read
