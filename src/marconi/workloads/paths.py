"""Where data lives: the vendored samples inside the package and the shared data set beside the repo."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["bundled_data_dir", "shared_data_dir", "SHARED_DATA_ENV"]

SHARED_DATA_ENV = "MARCONI_SHARED_DATA"
_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # src/marconi


def bundled_data_dir() -> Path:
    """``marconi/data``: the small permissively licensed samples shipped with the package."""
    return _PACKAGE_DIR / "data"


def shared_data_dir() -> Path | None:
    """The shared data set (``<repo>/../shared/data``), or None where it is absent.

    ``$MARCONI_SHARED_DATA`` overrides the location (an empty value means "none"); a set but
    missing directory also gives None, so tests that need the data skip instead of failing.
    """
    if SHARED_DATA_ENV in os.environ:
        value = os.environ[SHARED_DATA_ENV].strip()
        if not value:
            return None
        path = Path(value).expanduser()
        return path.resolve() if path.is_dir() else None
    repo_root = _PACKAGE_DIR.parent.parent  # src/marconi -> src -> repo
    for candidate in (repo_root / ".." / "shared" / "data", Path.cwd() / ".." / "shared" / "data"):
        if candidate.is_dir():
            return candidate.resolve()
    return None
