"""argparse ``type=`` checks the lab's commands share, so a misspelt name is refused at parse time
with argparse's own ``argument --flag: ...`` (exit 2), before a trace loads or a model builds.

Each check is cheap and reads no file: a path is left to the command, which reads it (and names
the file) where it is used. The numeric and capacity types live in :mod:`marconi.options`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["simulator_model", "eviction_policy"]


def simulator_model(text: str) -> str:
    """``--model`` of a simulation study: a preset of :mod:`marconi.core.model`, or an existing path
    (a Hugging Face ``config.json`` or model directory, read later by the command); returns the text."""
    from marconi.core.model import get_model

    if not Path(text).exists():
        try:
            get_model(text)
        except ValueError as exc:   # SpecError: "unknown model 'x': use one of ..."
            raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def eviction_policy(text: str) -> str:
    """``--eviction`` of a cache: a registered eviction policy a cache can build on its own (the
    ``oracle``, which needs the whole trace, is refused), with its parameters checked; returns the text."""
    from marconi.core.eviction import make_eviction

    try:
        make_eviction(text)
    except ValueError as exc:   # ConfigError: an unknown name or parameter, or the oracle
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text
