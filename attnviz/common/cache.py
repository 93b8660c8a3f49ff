"""Where attnviz keeps what it may compute again but would rather not: converted models, the GPU's launches."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """attnviz's own cache: ``$ATTNVIZ_CACHE`` or ``$XDG_CACHE_HOME/attnviz`` (default ``~/.cache/attnviz``)."""
    if os.environ.get("ATTNVIZ_CACHE"):
        return Path(os.environ["ATTNVIZ_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attnviz"
