"""The Ray sweep backend on a local Ray instance: same records as the local process pool.

``ray`` is a dependency of the project (extra ``ray``, installed by ``make test``): if it cannot be
imported this module fails, it does not skip.
"""

import logging

import numpy as np
import pytest
import ray

from marconi.cli import main
from marconi.core.registry import ConfigError
from marconi.sim.backends import LocalBackend, RayBackend, make_backend, pack_trace
from marconi.sim.sweep import TIMING_FIELDS, SweepPoint, SweepTask, expand_points, run_sweep, run_tasks, read_records
from marconi.workloads import build_workload, chat_trace

pytestmark = pytest.mark.slow  # minutes of sweeps / processes: CI and `make test` only


@pytest.fixture(scope="module")
def ray_backend():
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    backend = RayBackend()  # joins the instance started above; close() leaves it running
    try:
        yield backend
    finally:
        backend.close()
        ray.shutdown()


@pytest.fixture(scope="module")
def trace():
    return build_workload("swe-sample").head(150)


def _strip(rec):
    return {k: v for k, v in rec.items() if k not in TIMING_FIELDS}


def test_ray_records_equal_local_records(ray_backend, trace):
    points = expand_points(["vllm+", "sglang+", "marconi", "marconi:tuner=bootstrap", "marconi:alpha=1.0"],
                           ["0.02x", "0.1x"], ["paper-7b"])
    local = run_sweep(trace, "swe-sample", points, workers=2)
    seen = []
    remote = run_sweep(trace, "swe-sample", points, backend=ray_backend, on_record=seen.append)
    assert len(seen) == len(points)
    assert [(_r["system"], _r["capacity"]) for _r in remote] == [(p.system, p.capacity) for p in points]
    assert [_strip(r) for r in remote] == [_strip(r) for r in local]
    # the bootstrap tuner ran (its grid search as nested Ray tasks) and agrees with the local pool
    tuned = [r for r in remote if r["system"] == "marconi:tuner=bootstrap"]
    assert any(r["tuned_alphas"] for r in tuned)
    for r in remote:
        assert 0.0 <= r["token_hit_rate"] <= r["kv_hit_rate"] <= 1.0
        assert len(r["per_request"]["reused_len"]) == len(trace)


def test_tasks_over_several_traces_and_tuning_windows(ray_backend, trace):
    chat = chat_trace(num_sessions=20, turns=(2, 5), system_prompt_len=200, seed=1)
    tasks = [SweepTask("swe", SweepPoint("marconi:tuner=bootstrap", "2GB", "paper-7b"), capture_tuning=True,
                       tags=(("k", 1),)),
             SweepTask("chat", SweepPoint("sglang+", "1GB", "paper-7b"), per_request=False)]
    traces = {"swe": trace, "chat": chat}
    local = run_tasks(traces, tasks, backend=LocalBackend(2))
    remote = run_tasks(traces, tasks, backend=ray_backend)
    assert [_strip(r) for r in remote] == [_strip(r) for r in local]
    # traces go to the object store once per backend: a second sweep over them puts nothing new
    stored = ray_backend.num_objects_put
    again = run_tasks(traces, tasks, backend=ray_backend)
    assert ray_backend.num_objects_put == stored
    assert [_strip(r) for r in again] == [_strip(r) for r in remote]
    assert remote[0]["k"] == 1 and remote[1]["trace"] == "chat" and "per_request" not in remote[1]
    windows = remote[0]["tuning_windows"]
    assert len(windows) == len(remote[0]["tuned_alphas"]) >= 1
    w = windows[0]
    assert len(w["grid"]) == len(w["hit_rate"]) == 21 and w["alpha"] in w["grid"]
    assert all(0.0 <= h <= 1.0 for h in w["hit_rate"])


def test_packed_trace_shares_session_buffers_and_round_trips():
    chat = chat_trace(num_sessions=10, turns=(4, 8), seed=2)
    packed = pack_trace(chat)
    assert list(packed.unpack()) == list(chat)
    # growing histories are views of one buffer per session: packing stores each once
    assert packed.tokens.size < sum(r.input_len + r.output_len for r in chat) / 2


def test_cli_simulate_on_ray(ray_backend, tmp_path):
    out = tmp_path / "r.jsonl"
    code = main(["simulate", "--trace", "swe-sample", "--limit", "60", "--systems", "sglang+,vllm+",
                 "--capacity", "0.1x", "--backend", "ray", "--out", str(out), "--quiet"])
    assert code == 0
    recs = read_records(out)
    assert [r["system"] for r in recs] == ["sglang+", "vllm+"]
    assert ray.is_initialized()  # the CLI joined the running instance and left it running


def test_backend_names():
    assert isinstance(make_backend("local", workers=1), LocalBackend)
    assert isinstance(make_backend("ray"), RayBackend)
    with pytest.raises(ConfigError):
        make_backend("dask")
    with pytest.raises(ConfigError):
        make_backend("local", address="auto")
    squares = LocalBackend(2).map(_square, [1, 2, 3], shared={"k": np.arange(3)})
    assert squares == [1, 4, 9]


def _square(shared, x):
    assert shared["k"].tolist() == [0, 1, 2]
    return x * x
