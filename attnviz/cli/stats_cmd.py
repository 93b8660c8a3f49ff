"""`attnviz stats` (not yet implemented)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this command to ``app``."""
