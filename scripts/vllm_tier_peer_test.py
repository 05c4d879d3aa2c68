"""``make vllm-tier-peer-test``: vLLM 0.32.0's own offload-tier tests, stock and with Marconi's tier policy.

1. Fetches vLLM's source release and the test runner exactly as ``make vllm-peer-test`` does
   (:func:`vllm_peer_test.fetch`, :func:`vllm_peer_test.install_runner`: ``build/vllm-peer``).
2. Runs vLLM's tier tests that exercise a cache policy (:data:`DEFAULT_TESTS`: the policy factory,
   the CPU manager, the spec factories, the tiering manager over a CPU primary tier) once stock
   (the baseline) and once through
   ``tests/vllm_tier/peer_tier_plugin.py``, which makes every ``CPUOffloadingManager`` built with
   ``cache_policy="lru"`` load ``MarconiCachePolicy`` by module path instead.
3. Prints per run the pass/fail/skip counts and the tests that fail with Marconi and not without
   (new failures). A few tests assert that the policy *is* ``LRUCachePolicy`` and read its private
   fields (:data:`LRU_INTERNALS`): they are listed apart, with the reason, and do not count. Exit 1 on
   any other new failure, or when the harness built no manager with Marconi.

It downloads (PyPI), so it is not part of ``make test``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_peer_test import fetch, install_runner, outcomes, summary  # noqa: E402  (the pool suite's helpers)

REPO = Path(__file__).resolve().parents[1]
#: vLLM's tier tests that build a CPU tier and need no GPU, network or file-system backend (the p2p,
#: fs and obj tiers, the GPU worker, shared-region and Triton tests test no cache policy; on a
#: 2-core machine the whole directory ran past 20 minutes, stalling in the fs/obj tier tests).
DEFAULT_TESTS = ["tests/v1/kv_offload/cpu/policies/test_factory.py", "tests/v1/kv_offload/cpu/test_manager.py",
                 "tests/v1/kv_offload/test_factory.py", "tests/v1/kv_offload/tiering/test_factory.py",
                 "tests/v1/kv_offload/tiering/test_tiering_offloading.py",
                 "tests/v1/kv_offload/tiering/test_backpressure.py", "tests/v1/kv_offload/tiering/test_async_lookup.py",
                 "tests/v1/kv_offload/tiering/test_metrics.py"]
#: Tests that check LRU's implementation, not a policy's contract: each asserts
#: ``isinstance(policy, LRUCachePolicy)`` and then reads LRU's own fields (``_heap``, ``_ranks``).
LRU_INTERNALS = {
    "tests.v1.kv_offload.cpu.test_manager::test_lru_batch_eviction_failure_is_atomic":
        "asserts isinstance(policy, LRUCachePolicy) (then the atomicity our own tests check)",
    "tests.v1.kv_offload.cpu.test_manager::test_lru_repeated_pin_cycles_compact_lazy_heap_entries":
        "asserts isinstance(policy, LRUCachePolicy), reads LRU's _heap",
    "tests.v1.kv_offload.tiering.test_tiering_offloading.TestTieringOffloadingManager::test_touch_propagates_to_all_tiers":
        "asserts isinstance(policy, LRUCachePolicy), reads LRU's _ranks",
}


def run(python: str, root: Path, site: Path, mode: str, work: Path, select: list[str]) -> dict:
    xml, stats = work / f"tier-{mode}.xml", work / f"tier-{mode}.stats.json"
    stats.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MARCONI_")}
    env.update(HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join([str(site), str(REPO / "tests" / "vllm_tier")]))
    args = [python, "-m", "pytest", *select, "-q", "-p", "no:cacheprovider", f"--junitxml={xml}"]
    if mode != "baseline":
        env["MARCONI_PEER_STATS"] = str(stats)
        args += ["-p", "peer_tier_plugin"]
    started = time.monotonic()
    with open(work / f"tier-{mode}.log", "w") as log:
        subprocess.run(args, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    return {"outcomes": outcomes(xml), "seconds": time.monotonic() - started,
            "harness": json.loads(stats.read_text()) if stats.is_file() else {}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--work-dir", default=str(REPO / "build" / "vllm-peer"))
    parser.add_argument("tests", nargs="*", default=DEFAULT_TESTS, help="paths inside vLLM's source tree")
    args = parser.parse_args(argv)
    # absolute (the tests run from inside vLLM's source tree), not resolved (a venv's python is a link)
    args.vllm_python = os.path.abspath(args.vllm_python)
    work = Path(args.work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    root = fetch(args.vllm_python, work)
    site = install_runner(args.vllm_python, work)
    runs = {}
    for mode in ("baseline", "marconi"):
        print(f"vllm-tier-peer-test: {mode} ...", flush=True)
        runs[mode] = run(args.vllm_python, root, site, mode, work, args.tests)
    baseline = runs["baseline"]["outcomes"]
    failed = False
    for mode, result in runs.items():
        text, new = summary(mode, result, baseline)
        print(text)
        for test in new:
            why = LRU_INTERNALS.get(test)
            print(f"          {'LRU INTERNALS' if why else 'NEW FAILURE'} {test}" + (f" ({why})" if why else ""))
            failed |= why is None
        if mode != "baseline" and not result["harness"].get("managers_with_marconi"):
            print("          the harness built no manager with Marconi: nothing was exercised")
            failed = True
    (work / "tier-summary.json").write_text(json.dumps({m: {**r, "outcomes": None} for m, r in runs.items()},
                                                       indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
