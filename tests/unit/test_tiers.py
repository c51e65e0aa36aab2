"""tests/tiers.py's split of the integration tier: every file in exactly one half, the halves
of about the same estimated length."""

from __future__ import annotations

from tiers import CONNECTION_TESTS, ROOT, file_seconds, integration_halves


def test_the_halves_hold_every_integration_file_once_and_weigh_about_the_same() -> None:
    first, second = integration_halves()
    files = [
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "tests" / "integration").glob("test_*.py")
    ]
    assert sorted(first + second) == sorted([*files, *CONNECTION_TESTS])
    assert first == sorted(first) and second == sorted(second)
    heaviest = max(file_seconds(name) for name in first + second)
    assert abs(sum(map(file_seconds, first)) - sum(map(file_seconds, second))) <= heaviest
