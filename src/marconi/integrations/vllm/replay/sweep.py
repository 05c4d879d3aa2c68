"""Pool-size × load sweeps of ``marconi vllm replay``, on a local process pool or as Ray tasks.

Each :class:`~marconi.integrations.vllm.replay.run.ReplayConfig` point is one independent
:func:`run_replay` with its own work directory, run by :func:`marconi.sim.sweep.run_points`. A point
runs vLLM's scheduler on one core: oversubscription slows only ``sched_s_per_step``, never the hit
rates or the virtual-clock latencies.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from marconi.core.registry import ConfigError
from marconi.integrations.vllm.replay.run import ReplayConfig, run_replay

__all__ = ["ReplayPoint", "sweep_configs", "run_sweep", "check_points", "POOL_FIELDS", "LOAD_FIELDS"]

#: The pool options a sweep varies (one per point) and the load options (one per point).
POOL_FIELDS = ("num_blocks", "capacity", "gpu_memory")
LOAD_FIELDS = ("concurrency", "rate", "time_scale")


@dataclass(frozen=True, slots=True)
class ReplayPoint:
    """One point: its configuration and the work directory its workers write."""

    config: ReplayConfig
    work_dir: str
    emulate: bool = True

    @property
    def label(self) -> str:
        """The point's pool and load (how a failure names it): its work directory's name."""
        return Path(self.work_dir).name


def sweep_configs(base: ReplayConfig, *, pools: Sequence[Mapping[str, Any]],
                  loads: Sequence[Mapping[str, Any]]) -> list[ReplayConfig]:
    """The grid ``pools × loads`` over ``base``, pool-major. ``pools``: e.g. ``[{"capacity":
    "0.02x"}]``; ``loads``: e.g. ``[{"rate": 2.0}]``; each mapping replaces all its group's fields.
    Raises ConfigError for an empty axis, a field outside the group or an invalid point.
    """
    if not pools or not loads:
        raise ConfigError("a sweep needs at least one pool size and one load")
    out = []
    for pool in pools:
        for load in loads:
            fields: dict[str, Any] = {**{f: None for f in POOL_FIELDS + LOAD_FIELDS}}
            for group, given in ((POOL_FIELDS, pool), (LOAD_FIELDS, load)):
                unknown = set(given) - set(group)
                if unknown:
                    raise ConfigError(f"sweep: {sorted(unknown)} are not among {group}")
                fields.update(given)
            out.append(dataclasses.replace(base, **fields))
    return out


def _point_label(config: ReplayConfig) -> str:
    pool = next(f"{k}-{getattr(config, k)}" for k in POOL_FIELDS if getattr(config, k) is not None)
    load = next(f"{k}-{getattr(config, k)}" for k in LOAD_FIELDS if getattr(config, k) is not None)
    return f"{pool}_{load}".replace("/", "-").replace(":", "-")


def _run_point(shared: Mapping[str, Any], point: ReplayPoint) -> list[dict[str, Any]]:
    """One point's records (a module-level function: it runs in a forked worker or a Ray task)."""
    # the selection's notes (a cap that left requests out, a stand-in) were told once by check_points
    return run_replay(point.config, work_dir=point.work_dir, emulate=point.emulate, show_bars=False,
                      selection_notice=lambda _: None)


def run_sweep(configs: Sequence[ReplayConfig], *, work_dir: str | Path | None = None, backend: Any = "local",
              workers: int | None = 1, emulate: bool = True,
              on_point: Callable[[list[dict[str, Any]]], None] | None = None,
              notice: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """All points' records, in point order (each point's policies in the order given).

    ``backend``: ``"local"``, ``"ray"`` or a :mod:`marconi.sim.backends` backend (closed here only
    if made here). ``on_point`` sees each point's records as it completes. ``work_dir`` is kept
    (on Ray the nodes must share its path); without one a temporary folder is removed at the end
    unless ``MARCONI_KEEP_SCRATCH=1``. Every point is checked first (:func:`check_points`: its
    ``--cpu-tier`` fraction and its pool), ``notice`` told of each pool the workers will raise to
    vLLM's least pool, once per pool; then the vLLM environment is probed.

    Raises:
        PointsFailed: some points raised :class:`ConfigError` (after every other point finished;
            the others' records are on it, one list per point).
    """
    from marconi.integrations.common.probe import probe_python
    from marconi.pool import scratch_dir
    from marconi.sim.sweep import run_points

    for note in check_points(configs):
        if notice is not None:
            notice(note)
    for python in dict.fromkeys(c.vllm_python for c in configs):
        probe_python(python, "vllm", option="--vllm-python", make_target="make vllm-env")
    with scratch_dir("marconi-replay-sweep-", work_dir) as work:
        points = [ReplayPoint(c, str(work / _point_label(c)), emulate) for c in configs]
        if len({p.work_dir for p in points}) != len(points):
            raise ConfigError("sweep: two points are the same configuration")
        results = run_points(_run_point, points, backend=backend, workers=workers, on_result=on_point)
    return [rec for recs in results for rec in recs]


def check_points(configs: Sequence[ReplayConfig]) -> list[str]:
    """Check every point before any runs, as :func:`run_replay` checks its one
    (:func:`~marconi.integrations.vllm.replay.run.check_pool`: a ``--cpu-tier`` fraction that holds
    no chunk of vLLM's tier, the pool against vLLM's least pool for the longest request). Each
    distinct selection of requests is read and measured once.

    Returns:
        The notes, one per distinct note: each selection's (requests a cap left out, a stand-in for
        absent data), which the points then leave untold, and each pool the workers will raise to
        vLLM's least pool (a pool swept over several loads is noted once).

    Raises:
        ConfigError: naming ``--cpu-tier`` or ``--blocks``.
    """
    from marconi.integrations.vllm.replay.run import (check_pool, needs_working_set, replay_working_set,
                                                      select_replay_requests)

    requests_of: dict[tuple[Any, ...], Sequence[Any]] = {}
    working_sets: dict[tuple[Any, ...], int] = {}
    notes: dict[str, None] = {}
    for config in configs:
        key = (config.trace, config.max_input_len, config.num_requests, config.max_output_len, config.model)
        if key not in requests_of:
            requests_of[key] = select_replay_requests(config, notice=lambda note: notes.setdefault(note)).requests
        requests = requests_of[key]
        if key not in working_sets and needs_working_set(config):
            working_sets[key] = replay_working_set(config, requests)
        for note in check_pool(config, requests, working_sets.get(key)):
            notes[note] = None
    return list(notes)
