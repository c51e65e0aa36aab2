"""The distribution that installs pgqueue, by the name users install it under, and its version
(a worker's registry row and the tracing spans say which pgqueue ran)."""

from __future__ import annotations

from importlib import metadata
from typing import Final

# The package index's "pgqueue" is an unrelated project: asking for that name's version would
# report its version wherever both are installed.
DISTRIBUTION: Final = "sqlalchemy-pgqueue"


def installed_version() -> str | None:
    """The installed distribution's version; None when pgqueue runs from a bare source tree."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None
