"""What the plugin costs vLLM: the in-process engine with and without it, side by side.

Serves the same prefill-heavy requests (the bundled SWE trace's prompts, a few output tokens each)
through vLLM's in-process engine (:mod:`marconi.integrations.vllm.offline`), once per configuration and round,
the configurations in a rotating order so the machine's background load falls on all alike:

* ``stock`` — the plugin not loaded (``VLLM_PLUGINS=''``);
* ``marconi`` — the plugin's eviction with a fixed α (``MARCONI_VLLM_ALPHA``);
* ``adaptive`` — with ``MARCONI_VLLM_ALPHA=adaptive`` (the shadow cache where the plugin puts it by default:
  in a child process on two CPUs or more, ``MARCONI_VLLM_ADAPTIVE_REPLAY``).

Prints, per configuration, the serving wall time (median and minimum over rounds, start-up
excluded), its ratio to stock, and the scheduler-thread time the plugin itself measured in its
α source; checks that every configuration generated the same tokens (greedy) and that the plugin's
runs reused what the ``vllm-align`` emulation says they should. Run from the main environment::

    .venv/bin/python -m marconi.lab.vllm_overhead --vllm-python .venv-vllm/bin/python --num-requests 30 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from marconi.pool import run_child
from marconi.integrations.common.probe import default_env_python, python_command

__all__ = ["main", "CONFIGS"]

CONFIGS: dict[str, dict[str, str]] = {
    "stock": {"VLLM_PLUGINS": ""},
    "marconi": {"MARCONI_VLLM_POLICY": "marconi", "MARCONI_VLLM_ALPHA": "0.5"},
    "adaptive": {"MARCONI_VLLM_POLICY": "marconi", "MARCONI_VLLM_ALPHA": "adaptive"},
}


def _serve(vllm_python: str, config: str, requests_path: Path, model_dir: Path, blocks: int,
           block_size: int, max_model_len: int, work: Path) -> dict[str, Any]:
    out = work / f"out-{config}.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MARCONI_VLLM_")}
    env.update(CONFIGS[config])
    proc = run_child([vllm_python, "-m", "marconi.integrations.vllm.offline", str(requests_path), str(out), "--model",
                      str(model_dir), "--blocks", str(blocks), "--block-size", str(block_size),
                      "--max-model-len", str(max_model_len)], env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{config}: the in-process engine failed:\n{proc.stderr[-3000:]}")
    with out.open() as fh:
        return json.load(fh)


def main(argv: list[str] | None = None) -> int:
    from marconi.core.model import ModelSpec
    from marconi.lab.vllm_bench import BenchConfig, build_model, max_model_len, select_requests
    from marconi.integrations.vllm.emulate.engine import VllmAlignEngine
    from marconi.integrations.vllm.layout import layout_for_spec

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vllm-python", default=default_env_python(".venv-vllm"), type=python_command)
    parser.add_argument("--num-requests", type=int, default=30)
    parser.add_argument("--max-tokens", type=int, default=4, help="output tokens per request (prefill-heavy: few)")
    parser.add_argument("--blocks", type=int, default=80, help="block pool (contended: evictions happen)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--work-dir", default="results/vllm_bench_work")
    args = parser.parse_args(argv)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown or not configs:
        parser.error(f"--configs: choose from {', '.join(CONFIGS)}")
    config = BenchConfig(vllm_python=args.vllm_python, num_requests=args.num_requests, max_output_len=args.max_tokens,
                         num_blocks=args.blocks, work_dir=args.work_dir)
    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    requests, _, _ = select_requests(config)
    model_dir = build_model(config, say)
    spec = ModelSpec.from_hf_config(model_dir, name=config.model, bytes_per_elem=2)
    payload = [{"prompt": r.input_tokens.tolist(), "max_tokens": args.max_tokens} for r in requests]
    say(f"{len(requests)} requests, {sum(r.input_len for r in requests):,} prompt tokens, {args.max_tokens} output "
        f"tokens each; {args.blocks} blocks of {config.block_size}; {args.rounds} rounds of {', '.join(configs)}")
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        requests_path = work / "requests.json"
        requests_path.write_text(json.dumps(payload))
        for r in range(args.rounds):
            order = configs[r % len(configs):] + configs[:r % len(configs)]
            for name in order:
                result = _serve(args.vllm_python, name, requests_path, model_dir, args.blocks, config.block_size,
                                max_model_len(requests, config.block_size), work)
                runs[name].append(result)
                say(f"round {r + 1}: {name} served in {result['serve_s']:.2f}s")
    base = runs[configs[0]][0]["results"]
    for name, results in runs.items():
        for res in results:
            if [x["output"] for x in res["results"]] != [x["output"] for x in base]:
                raise SystemExit(f"{name}: greedy outputs differ from {configs[0]}'s")
    layout = layout_for_spec(spec, num_blocks=args.blocks, block_size=config.block_size)
    stock_median = statistics.median(r["serve_s"] for r in runs[configs[0]])
    print(f"{'config':<10} {'median s':>9} {'min s':>7} {'vs ' + configs[0]:>9} {'in alpha source':>16} "
          f"{'hits (tokens)':>14} {'emulated':>9} {'alpha changes':>14}")
    for name, results in runs.items():
        times = [r["serve_s"] for r in results]
        plugin = results[0]["marconi"]
        eviction = "lru" if name == "stock" else "marconi"
        alpha: Any = CONFIGS[name].get("MARCONI_VLLM_ALPHA", "0.5")
        engine = VllmAlignEngine(layout, spec, eviction=eviction, alpha=alpha if alpha == "adaptive" else float(alpha))
        sim = sum(engine.run(r.input_tokens, np.asarray(x["output"], dtype=np.int32)).hit_len
                  for r, x in zip(requests, results[0]["results"]))
        hits = sum(x["num_cached_tokens"] for x in results[0]["results"])
        source = "-" if plugin is None else f"{1000 * statistics.median(r['marconi']['source_s'] for r in results):.1f} ms"
        changes = "-" if plugin is None else str(plugin["num_alpha_changes"])
        print(f"{name:<10} {statistics.median(times):>9.2f} {min(times):>7.2f} "
              f"{statistics.median(times) / stock_median:>9.3f} {source:>16} {hits:>14,} {sim:>9,} {changes:>14}")
    print(f"greedy outputs identical across {', '.join(configs)} ({args.rounds} rounds each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
