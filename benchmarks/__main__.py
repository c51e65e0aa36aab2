"""``python -m benchmarks``: run the suite (see ``benchmarks.run``)."""

from benchmarks.run import main

raise SystemExit(main())
