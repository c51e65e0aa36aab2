"""``python -m pgqueue ARGS`` and ``python -m flask ARGS`` run inside the test process, as a fresh
process would run them: in the given directory (on ``sys.path``, as ``-m`` puts it there), with
exactly the given environment, logging not yet configured, and the app modules of that directory
not yet imported. What the command leaves behind in the
process is undone afterwards, as the end of a process would: the threads it started are waited
for (a worker's listener ends within a second of its stop), the queues and engines it opened are
disposed of, and the environment, ``sys.path``, modules, logging, signal handlers and the garbage
collector's frozen objects are as they were.

The answer is what ``subprocess.run(..., capture_output=True, text=True)`` gives: the exit code,
standard output and standard error, with an exception no command handled printed to standard
error as the interpreter prints it (``Traceback (most recent call last): ...``, exit code 1).

For what the process boundary does not change: a command's arguments, output, errors and exit
code. Process start-up and exit themselves need a real subprocess.
"""

from __future__ import annotations

import gc
import importlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from click.testing import CliRunner

# The signals a worker takes over (``install_signal_handlers``).
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# How long the threads a command started may take to end once it returned.
_THREADS_END_WITHIN = 10.0


def invoke(
    argv: list[str], *, env: Mapping[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``python ARGV`` (``-m pgqueue ...`` or ``-m flask ...``) run in this process in ``cwd``
    (default: the current directory) with ``env`` as its whole environment."""
    group = _group(argv)
    with _as_a_fresh_process(cwd, env):
        result = CliRunner().invoke(group, argv[2:], prog_name=f"python -m {argv[1]}")
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))
    return subprocess.CompletedProcess(
        [sys.executable, *argv], result.exit_code, result.stdout, stderr
    )


def _group(argv: list[str]) -> click.Command:
    match argv[:2]:
        case ["-m", "pgqueue"]:
            from pgqueue.cli import main

            return main
        case ["-m", "flask"]:
            from flask.cli import cli

            return cli
    raise ValueError(f"not a command this module runs in-process: {argv!r}")


@contextmanager
def _as_a_fresh_process(cwd: Path | None, env: Mapping[str, str]) -> Iterator[None]:
    from pgqueue.core import PgQueue

    directory = Path.cwd() if cwd is None else cwd
    environ = dict(os.environ)
    path = list(sys.path)
    working_directory = os.getcwd()
    root = logging.getLogger()
    root_handlers, root_level = root.handlers[:], root.level
    loggers = _loggers_as_they_are()
    handlers = {number: signal.getsignal(number) for number in _SIGNALS}
    frozen = gc.get_freeze_count()
    threads = set(threading.enumerate())
    made: list[PgQueue] = []
    init = PgQueue.__init__

    def tracked_init(self: PgQueue, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    if cwd is not None:
        _forget_app_modules(cwd)
    os.environ.clear()
    os.environ.update(env)
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[0:0] = [str(directory), *extra]
    importlib.invalidate_caches()
    os.chdir(directory)
    root.handlers.clear()
    root.setLevel(logging.WARNING)
    PgQueue.__init__ = tracked_init  # type: ignore[method-assign]
    try:
        yield
    finally:
        PgQueue.__init__ = init  # type: ignore[method-assign]
        try:
            _wait_for_threads(set(threading.enumerate()) - threads)
            for queue in reversed(made):
                queue.dispose()
        finally:
            for handler in root.handlers:
                if handler not in root_handlers:
                    handler.close()
            root.handlers[:] = root_handlers
            root.setLevel(root_level)
            _put_loggers_back(loggers)
            for number, handler in handlers.items():
                signal.signal(number, handler)
            if frozen == 0 and gc.get_freeze_count():
                gc.unfreeze()
            os.chdir(working_directory)
            sys.path[:] = path
            os.environ.clear()
            os.environ.update(environ)
            if cwd is not None:
                _forget_app_modules(cwd)


# A logger's state: disabled, level, propagate, handlers.
_LoggerState = tuple[bool, int, bool, list[logging.Handler]]


def _loggers_as_they_are() -> dict[str, _LoggerState]:
    """Every existing logger's state: a command may change any of them (Alembic's env.py runs
    ``logging.config.fileConfig``, which disables every logger that exists)."""
    return {
        name: (logger.disabled, logger.level, logger.propagate, logger.handlers[:])
        for name, logger in logging.root.manager.loggerDict.items()
        if isinstance(logger, logging.Logger)
    }


def _put_loggers_back(loggers: dict[str, _LoggerState]) -> None:
    for name, (disabled, level, propagate, handlers) in loggers.items():
        logger = logging.getLogger(name)
        for handler in logger.handlers:
            if handler not in handlers:
                handler.close()
        logger.handlers[:] = handlers
        logger.disabled, logger.propagate = disabled, propagate
        logger.setLevel(level)


def _wait_for_threads(started: set[threading.Thread]) -> None:
    deadline = time.monotonic() + _THREADS_END_WITHIN
    for thread in started:
        thread.join(max(0.0, deadline - time.monotonic()))
    running = sorted(thread.name for thread in started if thread.is_alive())
    assert not running, (
        f"threads still running {_THREADS_END_WITHIN:.0f} s after the command: {running}"
    )


def _forget_app_modules(directory: Path) -> None:
    """Drop the modules of ``directory`` (apps a test wrote there) from ``sys.modules``, so that
    the next run imports them again, as a new process does."""
    names = {p.stem for p in directory.glob("*.py")}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        # A file in ``directory`` has its last part's name in its path: the test of the name
        # spares a Path of each of the thousand-odd modules loaded, per command run.
        if name in names or (
            file is not None and directory.name in file and Path(file).parent == directory
        ):
            del sys.modules[name]
