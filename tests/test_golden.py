"""Golden numbers: exact ``reused_tokens`` per system x capacity on the bundled ``swe-sample``.

These pin the simulator's decisions so refactors cannot silently move results. The numbers live in
``tests/golden/swe_sample.json``. A change that moves them on purpose (a policy fix, a new default)
regenerates the file with ``MARCONI_UPDATE_GOLDEN=1 pytest tests/test_golden.py`` and says in its
commit message why the numbers moved.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from marconi.sim.sweep import expand_points, run_sweep
from marconi.workloads import build_workload

GOLDEN = Path(__file__).parent / "golden" / "swe_sample.json"
SYSTEMS = ["vanilla", "vllm+", "sglang+", "marconi", "marconi:selector=regret", "marconi:tuner=bootstrap", "marconi:alpha=0", "marconi:alpha=1",
           "marconi:alpha=0.5,efficiency=marginal", "marconi:alpha=1,recency=inverse-age"]
CAPACITIES = ["0.05x", "0.15x", "1TB"]
MODES = ["sequential", "event"]


def _measure() -> dict[str, int]:
    trace = build_workload("swe-sample")
    points = expand_points(SYSTEMS, CAPACITIES, ["paper-7b"])
    out: dict[str, int] = {}
    for mode in MODES:
        for rec in run_sweep(trace, "swe-sample", points, mode=mode, per_request=False, workers=1):
            out[f"{mode} | {rec['system']} | {rec['capacity']}"] = rec["reused_tokens"]
    out["input_tokens"] = rec["input_tokens"]
    return out


def test_reused_tokens_match_the_golden_numbers() -> None:
    measured = _measure()
    if os.environ.get("MARCONI_UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(measured, indent=1, sort_keys=True) + "\n")
        pytest.skip(f"regenerated {GOLDEN}; review the diff and say why it moved")
    golden = json.loads(GOLDEN.read_text())
    moved = {k: (golden.get(k), v) for k, v in measured.items() if golden.get(k) != v}
    missing = sorted(set(golden) - set(measured))
    assert not moved and not missing, (
        "golden numbers moved (key: (golden, now)):\n" + "\n".join(f"  {k}: {v}" for k, v in sorted(moved.items()))
        + (f"\nno longer measured: {missing}" if missing else ""))
