"""Errors raised by the real engine (all are ``ValueError``s with a message saying what to change)."""

from __future__ import annotations

__all__ = ["EngineError", "SpecMismatchError", "TokenRangeError", "UnsupportedModelError"]


class EngineError(ValueError):
    """Base class: the engine was asked for something it cannot do exactly."""


class UnsupportedModelError(EngineError):
    """An architecture the engine cannot serve exactly (unknown, Mamba-1, sliding-window ...)."""


class SpecMismatchError(EngineError):
    """The ``ModelSpec`` used for byte accounting disagrees with the model's real cache tensors."""


class TokenRangeError(EngineError):
    """Token ids outside ``[0, vocab_size)`` (or not a 1-D integer sequence)."""
