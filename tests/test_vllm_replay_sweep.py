"""``marconi vllm replay`` sweeps and production shapes: the grid, the CLI's comma lists, tensor
parallelism in the pool arithmetic and the step time. Only the last test needs vLLM."""

from __future__ import annotations

import argparse
import subprocess

import pytest

from marconi.core.model import PRESETS
from marconi.core.registry import ConfigError
from marconi.integrations.vllm.commands import replay_axes
from marconi.integrations.vllm.replay.run import ReplayConfig, replay_table
from marconi.integrations.vllm.replay.steptime import StepTimeModel
from marconi.integrations.vllm.replay.sweep import sweep_configs
from vllm_env import VLLM_PYTHON, require_vllm

BASE = ReplayConfig(vllm_python="x", num_blocks=1, concurrency=1, policies=("lru", "marconi"))


def test_the_grid_is_pools_times_loads_pool_major_and_each_point_has_one_of_each() -> None:
    configs = sweep_configs(BASE, pools=[{"capacity": "0.02x"}, {"gpu_memory": "80GB"}],
                            loads=[{"concurrency": 16}, {"rate": 2.0}])
    assert [(c.capacity, c.gpu_memory, c.num_blocks, c.concurrency, c.rate) for c in configs] == [
        ("0.02x", None, None, 16, None), ("0.02x", None, None, None, 2.0),
        (None, "80GB", None, 16, None), (None, "80GB", None, None, 2.0)]
    assert all(c.policies == ("lru", "marconi") for c in configs)


def test_a_sweep_refuses_empty_axes_foreign_fields_and_invalid_points() -> None:
    with pytest.raises(ConfigError, match="at least one"):
        sweep_configs(BASE, pools=[], loads=[{"concurrency": 1}])
    with pytest.raises(ConfigError, match="not among"):
        sweep_configs(BASE, pools=[{"concurrency": 4}], loads=[{"concurrency": 1}])
    with pytest.raises(ConfigError, match="concurrency must be"):
        sweep_configs(BASE, pools=[{"num_blocks": 64}], loads=[{"concurrency": 0}])


def test_a_point_that_cannot_run_leaves_the_others_to_finish(monkeypatch, tmp_path) -> None:
    """The replay's sweep runs on the simulator's runner: a ConfigError in one point is reported,
    with the point's pool and load, after the other points finished."""
    from marconi.integrations.vllm.replay import sweep
    from marconi.sim.sweep import PointsFailed

    def fake_replay(config: ReplayConfig, **_: object) -> list[dict[str, object]]:
        if config.concurrency == 4:
            raise ConfigError("the pool holds no request")
        return [{"arm": arm, "concurrency": config.concurrency} for arm in config.policies]

    monkeypatch.setattr("marconi.integrations.common.probe.probe_python", lambda *a, **k: None)
    monkeypatch.setattr(sweep, "run_replay", fake_replay)
    configs = sweep_configs(BASE, pools=[{"num_blocks": 64}], loads=[{"concurrency": 4}, {"concurrency": 8}])
    seen: list[list[dict[str, object]]] = []
    with pytest.raises(PointsFailed, match="1 of 2 points could not run: num_blocks-64_concurrency-4: the pool") as info:
        sweep.run_sweep(configs, work_dir=tmp_path, workers=1, on_point=seen.append)
    assert info.value.records == [[{"arm": "lru", "concurrency": 8}, {"arm": "marconi", "concurrency": 8}]]
    assert seen == info.value.records
    assert [p.config.concurrency for p, _ in info.value.failures] == [4]
    assert sweep.run_sweep(configs[1:], work_dir=tmp_path, workers=1) == info.value.records[0]


def _args(**given: object) -> argparse.Namespace:
    fields = {"blocks": None, "capacity": None, "gpu_memory": None, "concurrency": None, "rate": None,
              "trace_times": None}
    return argparse.Namespace(**{**fields, **given})


def test_comma_lists_on_the_command_line_become_the_axes() -> None:
    pools, loads = replay_axes(_args(capacity="0.02x,16GB", concurrency="16,64,256"))
    assert pools == [{"capacity": "0.02x"}, {"capacity": "16GB"}]
    assert loads == [{"concurrency": 16}, {"concurrency": 64}, {"concurrency": 256}]
    assert replay_axes(_args(blocks="100", trace_times=0.5)) == ([{"num_blocks": 100}], [{"time_scale": 0.5}])
    with pytest.raises(ConfigError, match="--concurrency: 'x'"):
        replay_axes(_args(blocks="100", concurrency="16,x"))


def test_tensor_parallel_must_divide_every_head_count_and_weight_bytes_needs_gpu_memory() -> None:
    ok = ReplayConfig(vllm_python="x", model="qwen3-next-80b-a3b", gpu_memory="80GB", tensor_parallel=2,
                      weight_bytes=1, concurrency=16)
    assert ok.tensor_parallel == 2
    with pytest.raises(ConfigError, match="num_key_value_heads=2"):   # Qwen3-Next has 2 KV heads
        ReplayConfig(vllm_python="x", model="qwen3-next-80b-a3b", gpu_memory="80GB", tensor_parallel=4,
                     concurrency=16)
    with pytest.raises(ConfigError, match="give --gpu-memory"):
        ReplayConfig(vllm_python="x", capacity="16GB", weight_bytes=1, concurrency=16)


def test_the_step_time_divides_over_tensor_parallel_gpus() -> None:
    spec = PRESETS["nemotron-h-8b"]
    one = StepTimeModel.named(spec, "h100", 16 * 10**9)
    two = StepTimeModel.named(spec, "h100", 16 * 10**9, num_gpus=2)
    spans = [(0, 4096), (1000, 1001)]
    assert two.step_s(spans) - two.overhead_s == pytest.approx((one.step_s(spans) - one.overhead_s) / 2)
    with pytest.raises(ConfigError, match="num_gpus"):
        StepTimeModel.named(spec, "h100", 0, num_gpus=0)


def test_the_table_names_each_points_pool() -> None:
    rec = {"arm": "lru", "concurrency": 16, "rate": None, "num_blocks": 2728, "block_size": 1152,
           "token_hit_rate": 0.5, "sim_token_hit_rate": None, "ttft_p50_s": 0.1, "ttft_p95_s": 0.2,
           "ttft_p99_s": 0.3, "tpot_mean_s": 0.01, "throughput_tok_s": 100.0, "num_preemptions": 0,
           "sched_s_per_step": 1e-4, "gpu_memory": "80GB", "tensor_parallel": 2}
    table = replay_table([rec, {**rec, "gpu_memory": None, "capacity": "16GB", "num_blocks": 850}])
    assert "80GB GPU x2" in table and "16GB" in table and "850" in table


def test_vllms_arithmetic_splits_the_weights_over_tensor_parallel_gpus() -> None:
    """Per GPU: 0.9 x 80 GB - weights / TP - 4 GiB; the pool holds TP times that of whole-model pages."""
    require_vllm()
    code = ("from marconi.integrations.vllm.replay.engine import available_kv_bytes as a, ACTIVATION_RESERVE_BYTES as r\n"
            "g = 80 * 10**9\n"
            "print(a(g, 8 * 10**9, 2), a(g, 80 * 10**9, 1, tensor_parallel=2), r)\n"
            "try:\n    a(g, 80 * 10**9, 2)\nexcept ValueError as e:\n    print('refused', 'tensor' in str(e))\n")
    out = subprocess.run([VLLM_PYTHON, "-c", code], capture_output=True, text=True, timeout=300, check=True).stdout
    one, two, reserve, *rest = out.split()
    assert int(one) == int(0.9 * 80e9) - 16 * 10**9 - int(reserve)
    assert int(two) == 2 * (int(0.9 * 80e9) - 40 * 10**9 - int(reserve))
    assert rest == ["refused", "True"]


@pytest.mark.slow  # one vLLM engine core (~20 s)
def test_under_open_loop_arrivals_ttft_counts_from_the_due_time(tmp_path) -> None:
    """A request due between two step boundaries is submitted at the next one; its TTFT counts the
    wait. A session's next turn arrives when its predecessor's answer does, not before."""
    require_vllm()
    import json
    import os

    from marconi.integrations.vllm.arrivals import poisson_times
    from marconi.integrations.vllm.replay.run import model_dir

    requests = [{"session": s, "prompt": list(range(1 + 100 * s, 400 + 100 * s + 50 * t)), "output": [5] * 4, "ts": 0.0}
                for t in range(2) for s in range(6)]
    path, out = tmp_path / "requests.json", tmp_path / "out.json"
    path.write_text(json.dumps({"requests": requests}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MARCONI_VLLM_")}
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", OMP_NUM_THREADS="1", MARCONI_VLLM_MAMBA2_CPU_FIX="off")
    subprocess.run([VLLM_PYTHON, "-m", "marconi.integrations.vllm.replay.worker", str(path), str(out), "--model",
                    str(model_dir("nemotron-h-8b")), "--blocks", "64", "--rate", "40", "--max-model-len", "4096"],
                   env=env, check=True, capture_output=True, timeout=400)
    res = json.loads(out.read_text())
    due = poisson_times(len(requests), 40.0, 0)
    for i in range(6):                                   # first turns: their due times
        assert res["arrival_s"][i] == pytest.approx(due[i])
    for i in range(6, 12):                               # second turns: not before the first turn's answer
        assert res["arrival_s"][i] == pytest.approx(max(due[i], res["finish_s"][i - 6]))
    assert all(f >= a for f, a in zip(res["first_token_s"], res["arrival_s"]))
