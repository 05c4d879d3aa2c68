"""The replay validated against vLLM's in-process engine with a real forward pass, and the shared admitter.

The admitter tests need no vLLM. The validation (slow, vLLM environment) serves the same SWE
requests twice on a tiny random-weight Qwen3-Next with a small pool (so blocks are evicted): once
through vLLM's in-process engine (``marconi.integrations.vllm.offline``, a real forward pass,
requests submitted by the closed-loop admitter between engine steps), once through the replay
worker (vLLM's scheduler, a stub runner) with the ids the real engine generated as outputs, so
both see identical token sequences. vLLM's per-request ``num_cached_tokens`` must be identical, at
one request in flight and at eight. The pool (96 blocks of 384 tokens for 23 requests of 2-4k
tokens) is small enough that both policies evict, and at eight in flight requests miss what they
hit one at a time. The real engine runs eager (no torch.compile: 20 s less start-up, the same
scheduling).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from marconi.integrations.vllm.arrivals import (Admitter, make_admitter, poisson_times, predecessors,
                                                       trace_times)
from vllm_env import VLLM_PYTHON, require_vllm

REPO = Path(__file__).resolve().parents[1]


# ====================================================================================== no vLLM needed
def _drive(admitter: Admitter, finish_order: list[int]) -> list[list[int]]:
    """Admission rounds when requests finish one per round in ``finish_order`` (among those submitted)."""
    rounds, live = [], []
    while not admitter.finished:
        batch = admitter.admit()
        rounds.append(batch)
        live += batch
        nxt = next(i for i in finish_order if i in live)
        live.remove(nxt)
        admitter.finish(nxt)
    return rounds


def test_closed_loop_caps_in_flight_and_a_waiting_turn_holds_its_slot() -> None:
    # sessions: a a b c -> request 1 waits for 0 while holding the second slot
    adm = Admitter(["a", "a", "b", "c"], concurrency=2)
    assert adm.admit() == [0]               # 1 admitted but behind 0: its slot is taken, 2 must wait
    assert adm.admit() == []
    adm.finish(0)
    assert adm.admit() == [1, 2]            # 1 goes first (it was waiting), then 2 takes 0's slot
    adm.finish(2)
    assert adm.admit() == [3]
    adm.finish(1)
    adm.finish(3)
    assert adm.finished and adm.next_arrival() is None


def test_concurrency_one_serves_in_trace_order() -> None:
    sessions = ["a", "b", "a", "c", "b"]
    assert _drive(Admitter(sessions, concurrency=1), list(range(5))) == [[0], [1], [2], [3], [4]]


def test_open_loop_admits_by_time_and_turns_wait_for_predecessors() -> None:
    adm = Admitter(["a", "b", "a"], times=[0.0, 2.0, 1.0])
    assert adm.next_arrival() == 0.0
    assert adm.admit(0.0) == [0]
    assert adm.next_arrival() == 1.0                  # due in time order, not trace order
    assert adm.admit(1.5) == []                       # request 2 is due but its predecessor 0 runs
    adm.finish(0)
    assert adm.admit(1.5) == [2]
    assert adm.admit(2.0) == [1]


def test_arrival_times() -> None:
    assert trace_times([10.0, 12.0, 11.0], 0.5) == [0.0, 1.0, 0.5]
    assert trace_times([]) == []
    times = poisson_times(50, 4.0, seed=3)
    assert times == poisson_times(50, 4.0, seed=3) and times != poisson_times(50, 4.0, seed=4)
    assert all(a < b for a, b in zip(times, times[1:]))
    assert predecessors(["a", "b", "a", "a"]) == [None, None, 0, 2]


def test_make_admitter_refuses_what_it_cannot_run() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        make_admitter(["a"], "closed-loop")
    with pytest.raises(ValueError, match="rate"):
        make_admitter(["a"], "poisson", rate=0)
    with pytest.raises(ValueError, match="timestamp"):
        make_admitter(["a", "b"], "trace", ts=[0.0])
    with pytest.raises(ValueError, match="unknown"):
        make_admitter(["a"], "bursty")
    assert make_admitter(["a", "b"], "trace", ts=[5.0, 7.0], time_scale=2.0).times == [0.0, 4.0]


def test_replay_config_trace_times_load() -> None:
    from marconi.core.registry import ConfigError
    from marconi.integrations.vllm.replay.run import ReplayConfig, load_label

    cfg = ReplayConfig(vllm_python="x", num_blocks=100, time_scale=0.5)
    assert cfg.arrivals == "trace" and cfg.load_args() == ["--trace-times", "0.5"]
    assert ReplayConfig(vllm_python="x", num_blocks=100, rate=2.0).arrivals == "poisson"
    assert ReplayConfig(vllm_python="x", num_blocks=100, concurrency=4).load_args() == ["--concurrency", "4"]
    with pytest.raises(ConfigError, match="concurrency"):
        ReplayConfig(vllm_python="x", num_blocks=100, concurrency=4, time_scale=1.0)
    assert load_label({"arrivals": "trace", "time_scale": 0.5, "concurrency": None, "rate": None}) == "trace×0.5"
    assert load_label({"concurrency": 8, "rate": None}) == "C=8"        # a record from before `arrivals`


def test_cli_takes_trace_times() -> None:
    import argparse

    from marconi.integrations.vllm.commands import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["vllm", "replay", "--blocks", "10", "--trace-times"])
    assert args.trace_times == 1.0 and args.concurrency is None
    assert parser.parse_args(["vllm", "replay", "--blocks", "10", "--trace-times", "0.25"]).trace_times == 0.25
    with pytest.raises(SystemExit):
        parser.parse_args(["vllm", "replay", "--blocks", "10", "--trace-times", "--rate", "2"])


# ====================================================================================== vLLM
_PRESET = "qwen3_next-tiny"
_ENGINE = {"--blocks": "96", "--max-model-len": "8192", "--max-num-batched-tokens": "2048", "--max-num-seqs": "256"}


def _policy_env(policy: str) -> dict[str, str]:
    """The plugin as a server would be configured (lru: stock vLLM, the plugin absent), one CPU thread."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MARCONI_VLLM_")}
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", OMP_NUM_THREADS="1")
    if policy == "marconi":
        env.update(MARCONI_VLLM_POLICY="marconi", MARCONI_VLLM_ALPHA="0.5")
    return env


def _run(args: list[str], policy: str, timeout: int = 300) -> None:
    proc = subprocess.run([VLLM_PYTHON, "-m", *args], capture_output=True, text=True, timeout=timeout,
                          env=_policy_env(policy), cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _engine_args() -> list[str]:
    return [x for kv in _ENGINE.items() for x in kv]


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    """The model directory and the SWE requests (selected as ``marconi vllm replay`` selects them)."""
    require_vllm()
    from marconi.integrations.common.bench import select_requests

    work = tmp_path_factory.mktemp("validation")
    _run(["marconi.integrations.vllm.models", _PRESET, str(work / "model")], "lru")
    sel = select_requests("swe-sample", max_input_len=4096, num_requests=24, max_output_len=8)
    return work / "model", sel.requests


def _real(model: Path, requests: list, concurrency: int, policy: str, work: Path) -> dict:
    path, out = work / f"real-{policy}-{concurrency}.json", work / f"real-{policy}-{concurrency}.out.json"
    path.write_text(json.dumps([{"session": str(r.session_id), "prompt": r.input_tokens.tolist(),
                                 "max_tokens": max(1, len(r.output_tokens))} for r in requests]))
    _run(["marconi.integrations.vllm.offline", str(path), str(out), "--model", str(model), *_engine_args(),
          "--concurrency", str(concurrency), "--enforce-eager"], policy)
    return json.loads(out.read_text())


def _replay(model: Path, requests: list, outputs: list[list[int]], concurrency: int, policy: str,
            work: Path) -> dict:
    path, out = work / f"replay-{policy}-{concurrency}.json", work / f"replay-{policy}-{concurrency}.out.json"
    path.write_text(json.dumps({"requests": [{"session": str(r.session_id), "prompt": r.input_tokens.tolist(),
                                              "output": o} for r, o in zip(requests, outputs)]}))
    _run(["marconi.integrations.vllm.replay.worker", str(path), str(out), "--model", str(model), *_engine_args(),
          "--concurrency", str(concurrency)], policy)
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize(("concurrency", "policy"), [(1, "marconi"), (8, "marconi"), (8, "lru")])
def test_replay_caches_what_the_real_engine_caches(workload: tuple[Path, list], concurrency: int, policy: str,
                                                   tmp_path: Path) -> None:
    """Per request, vLLM's ``num_cached_tokens`` through the replay (stub runner) equals the
    in-process engine's (real forward pass), on a pool small enough that blocks are evicted."""
    model, requests = workload
    real = _real(model, requests, concurrency, policy, tmp_path)
    assert not real["async_scheduling"]            # vLLM's CPU platform turns it off; the replay has none
    outputs = [r["output"] for r in real["results"]]
    replay = _replay(model, requests, outputs, concurrency, policy, tmp_path)
    real_cached = [r["num_cached_tokens"] for r in real["results"]]
    assert replay["num_cached_tokens"] == real_cached
    assert replay["kv_cache"]["num_blocks"] == real["num_blocks"] and replay["kv_cache"]["block_size"] == real["block_size"]
    assert sum(real_cached) > 0                     # something was reused ...
    if policy == "marconi":                         # ... and blocks were evicted (the plugin counts them)
        assert sum(replay["plugin_evictions"].values()) > 0
