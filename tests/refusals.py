"""One check for the tests of bad input: a call is refused with one line that names what to change."""

from __future__ import annotations

from typing import Callable

import pytest

from marconi.core.registry import ConfigError


def refused(fn: Callable[[], object], *words: str) -> str:
    """The one-line ConfigError message ``fn()`` raises, asserted to contain every one of ``words``."""
    with pytest.raises(ConfigError) as err:
        fn()
    message = str(err.value)
    assert all(w in message for w in words), (message, words)
    assert "\n" not in message
    return message
