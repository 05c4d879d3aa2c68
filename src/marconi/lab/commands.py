"""The lab's commands, wired into ``marconi.cli`` by :func:`register`.

* ``marconi experiment <study> …`` (the sparse study, headroom) and ``marconi reproduce`` (the paper's
  figures): top-level commands of the lab's own.
* ``marconi engine bench``, ``marconi vllm bench``, ``marconi vllm frontier`` and ``marconi sglang
  bench``: the lab's leaves under the library's ``engine``, ``vllm`` and ``sglang`` groups, added to
  the subparsers objects those groups' ``register`` return.

The library never imports the lab: the CLI, above both, hands the groups down.
"""

from __future__ import annotations

import importlib
from typing import Any, Mapping

__all__ = ["register"]

# (module, where it registers): "experiment" modules add a sub-command under `marconi experiment`,
# "top" modules add a top-level command.
_EXPERIMENTS = (("marconi.lab.sparse", "experiment"), ("marconi.lab.headroom", "experiment"),
                ("marconi.lab.reproduce", "top"))
# (module, the library group it adds a leaf to)
_LEAVES = (("marconi.lab.engine_bench_command", "engine"), ("marconi.lab.vllm_bench_command", "vllm"),
           ("marconi.lab.frontier_command", "vllm"), ("marconi.lab.sglang_bench_command", "sglang"))


def register(subparsers: Any, groups: Mapping[str, Any]) -> None:
    """Add the lab's commands to the top-level subparsers object, and its leaves to ``groups``
    (library group name, e.g. ``"vllm"``, -> that group's subparsers object); a leaf whose group is
    absent from ``groups`` is left out."""
    group = subparsers.add_parser("experiment", help="run a study and write records, plots and a summary")
    experiment_sub = group.add_subparsers(dest="experiment", required=True)
    for module_name, where in _EXPERIMENTS:
        importlib.import_module(module_name).register(experiment_sub if where == "experiment" else subparsers)
    for module_name, group_name in _LEAVES:
        if group_name in groups:
            importlib.import_module(module_name).register(groups[group_name])
