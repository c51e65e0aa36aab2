"""Kept only for ``docs/screenshots.py``, which imports ``serving`` from here: the dashboard
helpers live in ``support/dashboard.py``, and this module goes once that script imports them
from there."""

from support.dashboard import serving

__all__ = ["serving"]
