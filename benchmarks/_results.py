"""Writing result tables: a re-measured table keeps the notes written under it."""

from __future__ import annotations

from pathlib import Path

NOTES = "\n## Notes"
"""A results file's trailing section of hand-written notes, kept when the table is rewritten."""


def write_markdown(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, keeping the ``## Notes`` section the old file ended with."""
    path = Path(path)
    old = path.read_text() if path.is_file() else ""
    notes = old[old.index(NOTES) :] if NOTES in old else ""
    path.write_text(text.rstrip("\n") + "\n" + notes if notes else text)
