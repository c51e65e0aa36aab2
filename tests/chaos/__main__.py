"""``python -m tests.chaos``: one chaos run from the command line; exit code 1 on violations."""

from __future__ import annotations

import argparse
import sys

from .harness import run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--minutes", type=float, default=1.0)
    parser.add_argument(
        "--database-url",
        default=None,
        help="a server's maintenance database; a fresh database is made there "
        "(default: an embedded PostgreSQL started for the run)",
    )
    parser.add_argument("--bouncer", action="store_true", help="workers through PgBouncer")
    parser.add_argument(
        "--lock-tickets",
        action="store_true",
        help="the lock fault sometimes locks waiting jobs' tickets too",
    )
    parser.add_argument(
        "--server-dir",
        default=None,
        help="the directory of the tests/debian_postgres.py server at --database-url, so the "
        "faults may restart it (an embedded server the run starts is always restarted)",
    )
    parser.add_argument(
        "--key-history",
        type=int,
        default=0,
        metavar="N",
        help="start with N idle concurrency-key rows, as months of keys made of customer ids "
        "leave them",
    )
    parser.add_argument(
        "--partitioned-history",
        action="store_true",
        help='workers with history="partitioned", moving jobs seconds after they end',
    )
    parser.add_argument("--keep", action="store_true", help="keep the database and the logs")
    options = parser.parse_args(argv)
    result = run(
        options.seed,
        options.minutes,
        options.database_url,
        bouncer=options.bouncer,
        lock_tickets=options.lock_tickets,
        keep=options.keep,
        server_dir=options.server_dir,
        key_history=options.key_history,
        history=options.partitioned_history,
    )
    print(result.text)
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
