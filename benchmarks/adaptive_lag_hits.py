"""What ``MARCONI_VLLM_ADAPTIVE_LAG`` costs in hits: the plugin's adaptive α with each lag, in the emulation.

The ``vllm-align`` emulation makes the plugin's choices exactly (the same
:class:`~marconi.integrations.vllm.policy.BlockEvictionState` and α source), so a lag's effect on
hits is measured here, without vLLM: requests served one at a time through
:class:`~marconi.integrations.vllm.emulate.engine.VllmAlignEngine` with ``eviction=marconi`` and a
:class:`~marconi.integrations.vllm.shadow.PoolShadowAlpha` of each lag (0 = the default: a switch
takes effect at the next request), at pools of a few sizes. Prints hit tokens per lag and the change
against lag 0, and the rule switches the shadow made. Not a test::

    .venv/bin/python benchmarks/adaptive_lag_hits.py --workload swe-sample --lags 0,1,4,8,32
"""

from __future__ import annotations

import argparse
import json
import sys

from marconi.core.model import get_model
from marconi.integrations.vllm.emulate.engine import VllmAlignEngine
from marconi.integrations.vllm.layout import layout_for_spec
from marconi.integrations.vllm.shadow import PoolShadowAlpha
from marconi.workloads import build_workload


def hits(requests: list, model: str, num_blocks: int, lag: int) -> tuple[int, int, int]:
    """(hit tokens, prompt tokens, rule switches) of the adaptive plugin with ``lag`` on a pool of ``num_blocks``."""
    spec = get_model(model)
    layout = layout_for_spec(spec, num_blocks=num_blocks)
    source = PoolShadowAlpha(lag=lag)
    engine = VllmAlignEngine(layout, spec, eviction="marconi", alpha=source)
    hit = sum(engine.run(r.input_tokens, r.output_tokens).hit_len for r in requests)
    return hit, sum(len(r.input_tokens) for r in requests), len(source.tuning_record()["rule_switches"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="swe-sample")
    parser.add_argument("--model", default="nemotron-h-8b")
    parser.add_argument("--blocks", default="40,80,160", help="pool sizes (blocks), comma-separated")
    parser.add_argument("--lags", default="0,1,4,8,32")
    args = parser.parse_args(argv)
    requests = list(build_workload(args.workload))
    lags = [int(x) for x in args.lags.split(",")]
    rows = []
    for n in (int(x) for x in args.blocks.split(",")):
        base = None
        for lag in lags:
            hit, prompt, switches = hits(requests, args.model, n, lag)
            base = hit if base is None else base
            rows.append({"workload": args.workload, "model": args.model, "blocks": n, "lag": lag, "hit_tokens": hit,
                         "hit_rate": round(hit / prompt, 5), "vs_lag0_pp": round(100 * (hit - base) / prompt, 3),
                         "switches": switches})
            print(json.dumps(rows[-1]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
