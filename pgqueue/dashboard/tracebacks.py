"""A job's recorded traceback as its page shows it: the frames inside pgqueue (the worker's
dispatch and executor, which wrap every handler) folded into one collapsed part, so that the
frames of the user's own code are the first ones read."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

PACKAGE_DIR: Final = str(Path(__file__).resolve().parents[1]) + os.sep
# An installed pgqueue seen from another machine's traceback: its path under site-packages.
INSTALLED: Final = f"{os.sep}site-packages{os.sep}pgqueue{os.sep}"
FRAME: Final = re.compile(r'^(\s*)File "([^"]*)", line \d+')


@dataclass(frozen=True, slots=True)
class TracePart:
    """Consecutive lines of a traceback: ``frames`` frames inside pgqueue (``internal``), or
    anything else (the user's frames, the headline, chained exceptions' separators)."""

    text: str
    internal: bool
    frames: int = 0


def _internal(path: str) -> bool:
    return path.startswith(PACKAGE_DIR) or INSTALLED in path


def traceback_parts(text: str) -> list[TracePart]:
    """``text`` cut into parts, each run of frames inside pgqueue one part of its own."""
    parts: list[TracePart] = []
    lines: list[str] = []
    internal = False
    frames = 0
    frame_indent: int | None = None

    def close() -> None:
        if lines:
            parts.append(TracePart("\n".join(lines), internal, frames))

    # Lines end at "\n" alone: the text holds whatever the error said, control characters
    # that splitlines() would also break at included.
    for line in text.split("\n"):
        found = FRAME.match(line)
        if found is not None:
            frame_internal = _internal(found.group(2))
            frame_indent = len(found.group(1))
            if frame_internal != internal:
                close()
                lines, internal, frames = [], frame_internal, 0
            frames += 1
        elif frame_indent is None or len(line) - len(line.lstrip()) <= frame_indent:
            # Not a frame's source line: the frame run ended.
            frame_indent = None
            if internal:
                close()
                lines, internal, frames = [], False, 0
        lines.append(line)
    close()
    return parts
