"""``python -m benchmarks.report FILE``: the tables of a results file written by
``python -m benchmarks``, in Markdown, as BENCHMARKS.md quotes them.

Every number BENCHMARKS.md and the README give for the suite comes from a file under
``benchmarks/results/``; this prints that file's tables again (the summary against the raw-SQL
ceiling, the ceiling's threads x batch sweep, the peers side by side) with the run's server,
machine and failures, so a reader can check a quoted number against its source.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks import peers
from benchmarks.run import grid_markdown, markdown_table


def render(report: dict[str, Any]) -> str:
    """The Markdown for one results file."""
    parts = [
        f"Run: {report.get('mode')} mode, started {report.get('started_at')},"
        f" {report.get('elapsed_s', 0):.0f} s.",
        f"Server: {json.dumps(report.get('server'), sort_keys=True)}",
        f"Machine: {json.dumps(report.get('machine'), sort_keys=True)}",
    ]
    if report.get("summary"):
        parts += ["", markdown_table(report["summary"])]
    grid = ((report.get("results") or {}).get("drain") or {}).get("ceiling_grid")
    if grid:
        parts += ["", "The ceiling's sweep (raw SQL drain, jobs/s):", "", grid_markdown(grid)]
    if report.get("peers_table"):
        parts += ["", peers.markdown(report["peers_table"])]
    failed = report.get("failures") or []
    parts += ["", "Failures: " + ("; ".join(failed) if failed else "none")]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__)
    parser.add_argument("file", type=Path, help="a JSON file under benchmarks/results/")
    args = parser.parse_args(argv)
    try:
        report = json.loads(args.file.read_text())
    except (OSError, ValueError) as exc:
        print(f"error: cannot read {args.file}: {exc}", file=sys.stderr)
        return 1
    print(render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
