"""How much faster the replay serves a trace than vLLM's in-process engine with a real forward pass.

    .venv/bin/python benchmarks/vllm_replay_speed.py [--vllm-python .venv-vllm/bin/python] [--num-requests 77]
        [--max-input-len 8192] [--max-output-len N] [--blocks 150] [--concurrency 8] [--policy marconi|lru]

The same SWE requests (selected as ``marconi vllm replay`` selects them) go through vLLM's in-process
engine on the tiny random-weight Qwen3-Next (:func:`marconi.integrations.vllm.offline.serve_closed_loop`:
C in flight, a real forward pass each step, torch.compile as a server runs it) and then through the
replay worker (vLLM's scheduler, a stub runner) with the ids the engine generated as outputs, on the
same pool. It prints each side's serving time (after start-up), its process's wall time (start-up
included), the ratio, and whether vLLM's per-request ``num_cached_tokens`` agree. A real CPU server
adds HTTP and a separate engine process to the in-process engine's time, so the ratio is a lower
bound on "replay vs the CPU server". Prints numbers only; nothing asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PRESET = "qwen3_next-tiny"


def _env(policy: str) -> dict[str, str]:
    """The plugin as a server is configured (lru: stock vLLM), one engine thread, in-process core."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MARCONI_VLLM_")}
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", OMP_NUM_THREADS="1")
    if policy == "marconi":
        env.update(MARCONI_VLLM_POLICY="marconi", MARCONI_VLLM_ALPHA="0.5")
    return env


def _run(python: str, args: list[str], policy: str, log: Path) -> float:
    """Run ``python -m args`` in the vLLM environment; its wall time in seconds."""
    started = time.perf_counter()
    from marconi.pool import child_process      # the child dies with this script

    with log.open("w") as fh, child_process([python, "-m", *args], stdout=fh, stderr=subprocess.STDOUT,
                                            env=_env(policy), cwd=REPO) as proc:
        rc = proc.wait()
    if rc != 0:
        sys.exit(f"{args[0]} failed (exit {rc}); log {log}:\n{log.read_text()[-3000:]}")
    return time.perf_counter() - started


def _engine_args(args: argparse.Namespace, max_model_len: int) -> list[str]:
    return ["--blocks", str(args.blocks), "--max-model-len", str(max_model_len), "--max-num-batched-tokens",
            str(args.max_num_batched_tokens), "--max-num-seqs", str(args.max_num_seqs),
            "--concurrency", str(args.concurrency)]


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Serve the requests both ways; the figures :func:`main` prints."""
    from marconi.integrations.common.bench import select_requests

    requests = select_requests(args.trace, max_input_len=args.max_input_len, num_requests=args.num_requests,
                               max_output_len=args.max_output_len).requests
    model = work / "model"
    _run(args.vllm_python, ["marconi.integrations.vllm.models", PRESET, str(model)], "lru", work / "model.log")
    max_model_len = max(2048, max(r.input_len + max(1, len(r.output_tokens)) for r in requests))
    engine = _engine_args(args, max_model_len)
    real_in, real_out = work / "real.json", work / "real.out.json"
    real_in.write_text(json.dumps([{"session": str(r.session_id), "prompt": r.input_tokens.tolist(),
                                    "max_tokens": max(1, len(r.output_tokens))} for r in requests]))
    real_wall = _run(args.vllm_python, ["marconi.integrations.vllm.offline", str(real_in), str(real_out),
                                        "--model", str(model), *engine], args.policy, work / "real.log")
    real = json.loads(real_out.read_text())
    rep_in, rep_out = work / "replay.json", work / "replay.out.json"
    rep_in.write_text(json.dumps({"requests": [{"session": str(r.session_id), "prompt": r.input_tokens.tolist(),
                                                "output": res["output"]}
                                               for r, res in zip(requests, real["results"])]}))
    rep_wall = _run(args.vllm_python, ["marconi.integrations.vllm.replay.worker", str(rep_in), str(rep_out),
                                       "--model", str(model), *engine], args.policy, work / "replay.log")
    rep = json.loads(rep_out.read_text())
    real_cached = [r["num_cached_tokens"] for r in real["results"]]
    return {"num_requests": len(requests), "prompt_tokens": int(sum(r.input_len for r in requests)),
            "output_tokens": int(sum(len(r["output"]) for r in real["results"])),
            "real_serve_s": real["serve_s"], "real_wall_s": real_wall, "real_steps": real["num_steps"],
            "replay_serve_s": rep["wall_s"], "replay_wall_s": rep_wall, "replay_steps": rep["num_steps"],
            "cached_equal": rep["num_cached_tokens"] == real_cached,
            "hit_tokens": int(sum(real_cached))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--trace", default="swe-sample")
    parser.add_argument("--num-requests", type=int, default=None)
    parser.add_argument("--max-input-len", type=int, default=8192)
    parser.add_argument("--max-output-len", type=int, default=None)
    parser.add_argument("--blocks", type=int, default=150)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--policy", choices=("marconi", "lru"), default="marconi")
    parser.add_argument("--work-dir", default=None, help="model, requests, logs (default: a temp dir)")
    args = parser.parse_args(argv)
    from marconi.pool import scratch_dir

    with scratch_dir("marconi-replay-speed-", args.work_dir) as work:     # removed at the end unless given
        m = measure(args, work)
        print(f"{m['num_requests']} requests ({m['prompt_tokens']} prompt, {m['output_tokens']} output tokens), "
              f"{args.blocks} blocks, {args.concurrency} in flight, policy {args.policy}")
        print(f"in-process engine (real forward pass): serve {m['real_serve_s']:.2f} s ({m['real_steps']} steps), "
              f"process {m['real_wall_s']:.1f} s")
        print(f"replay (stub runner):                  serve {m['replay_serve_s']:.2f} s ({m['replay_steps']} steps), "
              f"process {m['replay_wall_s']:.1f} s")
        print(f"ratio engine/replay: serve {m['real_serve_s'] / m['replay_serve_s']:.1f}x, "
              f"process {m['real_wall_s'] / m['replay_wall_s']:.1f}x")
        print(f"num_cached_tokens identical per request: {m['cached_equal']} ({m['hit_tokens']} hit tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
