"""Test-suite marks shared by several test modules.

``make test`` (CI) runs everything; ``make test-fast`` deselects ``slow`` so a developer's loop stays
under a minute. A parametrized test keeps its first case in the fast subset, so every behaviour
is still exercised there once.
"""

from __future__ import annotations

from typing import Any, Iterable

import pytest

slow = pytest.mark.slow


def slow_but_first(values: Iterable[Any]) -> list[Any]:
    """``values`` for ``parametrize``: the first as is, the others marked ``slow``."""
    return [v if i == 0 else pytest.param(*(v if isinstance(v, tuple) else (v,)), marks=slow)
            for i, v in enumerate(values)]
