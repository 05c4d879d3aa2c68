"""Where data lives: the vendored samples inside the package and the shared data set beside the repo."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["bundled_data_dir", "shared_data_dir", "shared_data_where", "shared_data_absent", "SHARED_DATA_ENV"]

SHARED_DATA_ENV = "MARCONI_SHARED_DATA"
_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # src/marconi


def bundled_data_dir() -> Path:
    """``marconi/data``: the small permissively licensed samples shipped with the package."""
    return _PACKAGE_DIR / "data"


def shared_data_dir() -> Path | None:
    """The shared data set (``<repo>/../shared/data``, or ``$MARCONI_SHARED_DATA``; empty means none),
    or None where absent (so tests that need it skip)."""
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


def shared_data_where() -> str:
    """Where the shared data set was looked for (a set ``$MARCONI_SHARED_DATA`` with its value), for
    messages."""
    value = os.environ.get(SHARED_DATA_ENV)
    if value is None:
        return f"../shared/data beside the repository or the current directory (or set {SHARED_DATA_ENV})"
    if not value.strip():
        return f"nowhere: {SHARED_DATA_ENV} is set empty, which means no shared data set"
    path = Path(value.strip()).expanduser()
    if not path.is_dir():
        return (f"{SHARED_DATA_ENV}={value.strip()}, which is not a directory: set it to the data set's directory "
                "or unset it")
    return f"{SHARED_DATA_ENV}={value.strip()}"


def shared_data_absent(sub: str) -> str:
    """``"<where>/<sub> is absent"``: why a catalog entry fell back to its stand-in."""
    value = os.environ.get(SHARED_DATA_ENV, "").strip()
    if value:
        path = Path(value).expanduser()
        if not path.is_dir():
            return f"{SHARED_DATA_ENV}={value} is not a directory, so {sub} is absent"
        return f"{SHARED_DATA_ENV}={value}: {path / sub} is absent"
    return f"../shared/data/{sub} is absent"
