"""``flask pgqueue ...``: the ``pgqueue`` commands run against the Flask app's queue.

Registered through the ``flask.commands`` entry point, so any app with the extension gets them.
They are ``pgqueue``'s own commands (``pgqueue.cli.APP_COMMANDS``) without their APP argument
and ``--database-url`` option: the app (``--app`` / ``FLASK_APP``) provides the tasks and the
database, through ``pgqueue.cli.shared.host_queue``. Only ``worker`` is its own command here,
since its child processes must be started through ``flask`` again.
"""

from __future__ import annotations

import copy
import functools
import sys
from typing import Any

import click
from flask import current_app
from flask.cli import AppGroup, ScriptInfo, with_appcontext

from pgqueue.cli import APP_COMMANDS, shared
from pgqueue.cli import workers as worker_commands
from pgqueue.contrib.flask import get_state
from pgqueue.core import PgQueue as CoreQueue

# The parameters by which a ``pgqueue`` command finds its queue; here the app is the queue's.
_QUEUE_PARAMETERS = frozenset({"app", "database_url"})


class FlaskCommandGroup(shared.OneLineErrors, AppGroup):
    """Flask's app-context command group, with the core CLI's one-line errors."""

    cli_name = "flask pgqueue"


@click.group("pgqueue", cls=FlaskCommandGroup)
@shared.verbose_option
@shared.debug_option
def pgqueue_group(verbose: int, debug: bool) -> None:
    """pgqueue job queue commands for this app."""
    shared.configure_logging(verbose)
    click.get_current_context().meta[shared.HOST_QUEUE_KEY] = _app_queue


def _app_queue() -> CoreQueue:
    """The app's queue: the one its pgqueue extension made in ``init_app``."""
    try:
        return get_state().queue
    except RuntimeError:
        raise shared.CommandError(
            f"the app {current_app.name!r} has no pgqueue extension: call pgq.init_app(app)"
        ) from None


def for_this_app(command: click.Command) -> click.Command:
    """``command`` (a group: each of its commands) as ``flask pgqueue`` runs it: in the app's
    context, without the parameters that name a queue, which its body then receives as None."""
    adapted = copy.copy(command)
    dropped = {p.name for p in command.params if p.name in _QUEUE_PARAMETERS}
    adapted.params = [p for p in command.params if p.name not in dropped]
    if command.callback is not None:
        adapted.callback = with_appcontext(
            functools.partial(command.callback, **dict.fromkeys(dropped))
        )
    if isinstance(command, click.Group) and isinstance(adapted, click.Group):
        adapted.commands = {name: for_this_app(sub) for name, sub in command.commands.items()}
    if adapted.help:
        adapted.help = adapted.help.replace("the PgQueue at APP", "this app's queue")
    return adapted


for _command in APP_COMMANDS:
    if _command.name != "worker":
        pgqueue_group.add_command(for_this_app(_command))


@pgqueue_group.command()
@worker_commands.worker_options
def worker(**options: Any) -> None:
    """Run workers for this app's tasks (each job runs in an app context)."""
    info = click.get_current_context().find_object(ScriptInfo)
    app_path = info.app_import_path if info is not None else None
    # Child processes (--processes N) re-run this very command for the same app.
    prefix = [sys.executable, "-m", "flask", *(["--app", app_path] if app_path else [])]
    worker_commands.run_worker_command(
        shared.remember_queue(_app_queue()),
        app_argv=[],
        command_prefix=[*prefix, "pgqueue", "worker"],
        **options,
    )
