"""The ``marconi sglang`` command group (wired into ``marconi.cli`` by ``register``); the lab adds
its ``bench`` (:mod:`marconi.lab.commands`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> Any:
    """Add the ``sglang`` group to an argparse subparsers object; return the group's own subparsers
    object, where the lab adds its ``sglang`` leaves (:mod:`marconi.lab.commands`)."""
    group = subparsers.add_parser("sglang", help="Marconi inside SGLang: a trace through SGLang's own radix cache")
    return group.add_subparsers(dest="sglang_command", required=True)
