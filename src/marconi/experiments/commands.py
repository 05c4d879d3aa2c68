"""CLI wiring for experiments: ``marconi experiment <name> …`` and ``marconi reproduce``.

Each experiment module exposes ``register(subparsers)``; this file only collects them.
"""

from __future__ import annotations

import argparse
import importlib

# (module, where it registers): "experiment" modules add a sub-command under `marconi experiment`,
# "top" modules add a top-level command.
_EXPERIMENTS = (("marconi.experiments.sparse", "experiment"), ("marconi.experiments.headroom", "experiment"),
                ("marconi.experiments.reproduce", "top"))


def register(subparsers: argparse._SubParsersAction) -> None:
    group = subparsers.add_parser("experiment", help="run a study and write records, plots and a summary")
    experiment_sub = group.add_subparsers(dest="experiment", required=True)
    for module_name, where in _EXPERIMENTS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        module.register(experiment_sub if where == "experiment" else subparsers)
