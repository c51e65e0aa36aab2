"""``pgqueue.testing`` imports where pytest is not installed: only its plugin module needs it."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
sys.modules["pytest"] = None  # any import of pytest now fails
import pgqueue.testing
from pgqueue.testing import TestDatabases, assert_enqueued, immediate, run_jobs
try:
    import pgqueue.testing.plugin
except ImportError:
    print("plugin needs pytest")
"""


def test_pgqueue_testing_imports_without_pytest_and_its_plugin_does_not() -> None:
    completed = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=False
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "plugin needs pytest"
