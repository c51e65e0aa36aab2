"""``flask pgqueue`` offers each ``pgqueue`` command with the same parameters, less those that
find a queue (APP, ``--database-url``): the app gives the queue. The demo and the dashboard are
left out: a Flask app serves its dashboard itself (``init_dashboard``)."""

from __future__ import annotations

import click

from pgqueue.cli import main
from pgqueue.contrib.flask.cli import pgqueue_group

QUEUE_PARAMETERS = {"app", "database_url"}


def _parameters(command: click.Command) -> dict[str, list[str]]:
    """Each command's parameter names, down through groups, keyed by command path."""
    found = {command.name or "": [p.name or "" for p in command.params]}
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            found.update({f"{command.name} {k}": v for k, v in _parameters(sub).items()})
    return found


def test_every_pgqueue_command_but_the_demo_and_the_dashboard_is_a_flask_command() -> None:
    assert set(pgqueue_group.commands) == set(main.commands) - {"demo", "dashboard"}


def test_flask_commands_take_the_same_parameters_less_those_finding_a_queue() -> None:
    for name, flask_command in pgqueue_group.commands.items():
        core = {
            path: [p for p in params if p not in QUEUE_PARAMETERS]
            for path, params in _parameters(main.commands[name]).items()
        }
        assert _parameters(flask_command) == core, name
