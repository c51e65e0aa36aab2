"""The schedule controls of ``pgq.admin``: list the periodic schedules (the code's, and the
names only the database still knows), pause and resume one by name, and run one now.

A pause is persisted (``pgqueue_schedules``) and seen by every scheduler at its next pass: a
paused schedule enqueues nothing, and the ticks that fall while it is paused are dropped, not
caught up on resume (``pgqueue.scheduler``). Each action and its audit record commit in one
transaction (``admin_runner``); arguments are checked before any SQL runs. ``admin.Admin``
holds these methods with the rest of the admin API.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy.orm import Session

from pgqueue.admin_edits import audited
from pgqueue.admin_records import ScheduleInfo, checked_actor, schedule_name
from pgqueue.admin_runner import AdminRunner, SessionWork, Work
from pgqueue.data import control as control_data
from pgqueue.data import schedules as schedules_data
from pgqueue.db import Executor
from pgqueue.errors import ScheduleNotFound
from pgqueue.scheduler import UTC, Schedule


class ScheduleControls(AdminRunner):
    """The schedule switches and listing of ``pgq.admin`` (see the module)."""

    def schedules(self) -> list[ScheduleInfo]:
        """Every schedule, by name: those the code defines (``@pgq.periodic``), and the names
        the database knows (recorded ticks, a pause) that no schedule of the code has any more
        (``defined`` false). Next ticks count from the database's clock."""
        return self._read(self._listing())

    async def aschedules(self) -> list[ScheduleInfo]:
        """``schedules`` for asyncio."""
        return await self._aread(self._listing())

    def _listing(self) -> Work[list[ScheduleInfo]]:
        defined = dict(self._schedules())

        def read(ex: Executor) -> list[ScheduleInfo]:
            now = control_data.database_now(ex).astimezone(UTC)
            switches = schedules_data.switches(ex)
            ticks = schedules_data.last_ticks(ex)
            names = sorted(set(defined) | set(switches) | set(ticks))
            return [_info(name, defined.get(name), switches, ticks, now) for name in names]

        return read

    def pause_schedule(self, name: str, *, actor: str | None = None, source: str = "api") -> bool:
        """Pause schedule ``name``: no scheduler enqueues its ticks until ``resume_schedule``,
        and those that fall meanwhile are dropped, not caught up. Audited (``actor``, default
        ``default_actor()``; ``source``: ``api``, ``cli`` or ``dashboard``). False, and no
        audit record, when it was paused already. ScheduleNotFound when neither the code nor
        the database knows the name."""
        return self._write_session(None, self._switch(name, True, actor, source))

    async def apause_schedule(
        self, name: str, *, actor: str | None = None, source: str = "api"
    ) -> bool:
        """``pause_schedule`` for asyncio."""
        return await self._awrite_session(None, self._switch(name, True, actor, source))

    def resume_schedule(self, name: str, *, actor: str | None = None, source: str = "api") -> bool:
        """Let schedule ``name`` enqueue again, from its first tick after now; audited as
        ``pause_schedule``. False, and no audit record, when it was not paused."""
        return self._write_session(None, self._switch(name, False, actor, source))

    async def aresume_schedule(
        self, name: str, *, actor: str | None = None, source: str = "api"
    ) -> bool:
        """``resume_schedule`` for asyncio."""
        return await self._awrite_session(None, self._switch(name, False, actor, source))

    def _switch(self, name: str, paused: bool, actor: str | None, source: str) -> SessionWork[bool]:
        name = schedule_name(name)
        who, where = checked_actor(actor, source)
        in_code = name in self._schedules()

        def switch(_: Session, ex: Executor) -> bool:
            known = in_code or name in schedules_data.switches(ex)
            if not known and name not in schedules_data.last_ticks(ex):
                raise ScheduleNotFound(_unknown(name, self._schedules(), in_database=True))
            return schedules_data.set_paused(ex, name, paused)

        return audited(
            switch,
            actor=who,
            source=where,
            action="pause_schedule" if paused else "resume_schedule",
            target=lambda changed: {"schedule": name} if changed else None,
        )

    def run_schedule_now(self, name: str, *, actor: str | None = None, source: str = "api") -> int:
        """Enqueue schedule ``name``'s task with its arguments now, once, as its own job
        (not a tick: its ticks go on as before, paused or not); audited as
        ``pause_schedule``. Returns the job's id. ScheduleNotFound unless this code defines
        the schedule (its task and arguments are the code's)."""
        return self._write_session(None, self._run_now(name, actor, source))

    async def arun_schedule_now(
        self, name: str, *, actor: str | None = None, source: str = "api"
    ) -> int:
        """``run_schedule_now`` for asyncio."""
        return await self._awrite_session(None, self._run_now(name, actor, source))

    def _run_now(self, name: str, actor: str | None, source: str) -> SessionWork[int]:
        name = schedule_name(name)
        who, where = checked_actor(actor, source)
        schedule = self._schedules().get(name)
        if schedule is None:
            raise ScheduleNotFound(_unknown(name, self._schedules(), in_database=False))

        def enqueue(session: Session, _: Executor) -> int:
            job = schedule.task.configure(session=session)
            job_id: int = job.enqueue(*schedule.args, **schedule.kwargs)
            return job_id

        return audited(
            enqueue,
            actor=who,
            source=where,
            action="run_schedule",
            target=lambda job_id: {"schedule": name, "job_id": job_id},
        )


def _unknown(name: str, defined: Any, *, in_database: bool) -> str:
    known = ", ".join(sorted(defined)) or "none"
    where = ", nor a tick or a pause of it in the database" if in_database else ""
    return f"no schedule named {name!r} in the code (its schedules: {known}){where}"


def _info(
    name: str,
    schedule: Schedule | None,
    switches: dict[str, schedules_data.Switch],
    ticks: dict[str, schedules_data.LastTick],
    now: dt.datetime,
) -> ScheduleInfo:
    switch = switches.get(name)
    tick = ticks.get(name)
    return ScheduleInfo(
        name=name,
        defined=schedule is not None,
        cron=None if schedule is None else schedule.cron,
        zone=None if schedule is None else schedule.tz.key,
        task=None if schedule is None else schedule.task.name,
        missed=None if schedule is None else schedule.missed,
        next_tick=None if schedule is None else schedule.next_after(now),
        last_tick=None if tick is None else tick.at.astimezone(UTC),
        last_job_id=None if tick is None else tick.job_id,
        paused=switch is not None and switch.paused,
    )
