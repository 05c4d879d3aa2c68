"""``make vllm-peer-test``: vLLM 0.32.0's own ``tests/v1/core``, stock and with the plugin's hooks.

1. Fetches vLLM's source release with pip (``pip download --no-deps --no-binary :all:``; its
   metadata step runs vLLM's ``setup.py`` with ``VLLM_TARGET_DEVICE=empty`` and no build isolation,
   so nothing is compiled) into ``build/vllm-peer`` and unpacks ``tests/`` and ``pyproject.toml``
   only (vLLM's own ``vllm/`` source must not shadow the installed package).
2. Installs the test runner (``requirements/vllm-peer.txt``, ``--no-deps``) into
   ``build/vllm-peer/site``, put on ``PYTHONPATH``: the vLLM environment itself is not touched.
3. Runs the tests once plugin-absent (the baseline) and once per mode (``lru``, ``marconi``,
   ``adaptive``, ``adaptive-process``) through ``tests/vllm_peer/peer_plugin.py``, which hooks every
   supported pool.
4. Prints per mode the pass/fail/skip counts, the tests that fail with the plugin and not without
   (new failures), and what the harness exercised. Exit 1 on a new failure, or a mode that hooked
   no pool.

Tests that need a model download fail alike in every run (``HF_HUB_OFFLINE=1``); they count in
the baseline, never as new failures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VERSION = "0.32.0"
MODES = ("baseline", "lru", "marconi", "adaptive", "adaptive-process")


def fetch(python: str, work: Path) -> Path:
    """vLLM's tests, unpacked under ``work`` (once)."""
    root = work / f"vllm-{VERSION}"
    if (root / "tests" / "v1" / "core").is_dir():
        return root
    sdist = work / f"vllm-{VERSION}.tar.gz"
    if not sdist.is_file():
        build_deps = work / "build-deps"
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(build_deps),
                        "-r", str(REPO / "requirements" / "vllm-sdist-build.txt")], check=True)
        env = {**os.environ, "PYTHONPATH": str(build_deps), "VLLM_TARGET_DEVICE": "empty",
               "VLLM_SKIP_VERSION_SUFFIX": "1"}
        subprocess.run([python, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                        "--no-build-isolation", "-d", str(work), f"vllm=={VERSION}"], check=True, env=env)
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers()
                   if m.name.startswith(f"vllm-{VERSION}/tests/") or m.name == f"vllm-{VERSION}/pyproject.toml"]
        tar.extractall(work, members=members, filter="data")
    return root


def install_runner(python: str, work: Path) -> Path:
    site = work / "site"
    if not (site / ".installed").is_file():
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
                        "-r", str(REPO / "requirements" / "vllm-peer.txt")], check=True)
        (site / ".installed").touch()
    return site


def run_mode(python: str, root: Path, site: Path, mode: str, work: Path, select: list[str]) -> dict:
    xml, stats = work / f"{mode}.xml", work / f"{mode}.stats.json"
    stats.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MARCONI_")}
    env.update(HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join([str(site), str(REPO / "tests" / "vllm_peer")]))
    args = [python, "-m", "pytest", *select, "-q", "-p", "no:cacheprovider", f"--junitxml={xml}"]
    if mode != "baseline":
        env.update(MARCONI_PEER_MODE=mode, MARCONI_PEER_STATS=str(stats))
        args += ["-p", "peer_plugin"]
    started = time.monotonic()
    with open(work / f"{mode}.log", "w") as log:
        subprocess.run(args, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    return {"outcomes": outcomes(xml), "seconds": time.monotonic() - started,
            "harness": json.loads(stats.read_text()) if stats.is_file() else {}}


def outcomes(xml: Path) -> dict[str, str]:
    """test id -> passed/failed/error/skipped, from pytest's JUnit XML."""
    result = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        result[name] = {"failure": "failed"}.get(kinds[0], kinds[0]) if kinds else "passed"
    return result


def summary(mode: str, run: dict, baseline: dict[str, str]) -> tuple[str, list[str]]:
    counts: dict[str, int] = {}
    for outcome in run["outcomes"].values():
        counts[outcome] = counts.get(outcome, 0) + 1
    new = sorted(t for t, o in run["outcomes"].items() if o in ("failed", "error")
                 and baseline.get(t, "passed") not in ("failed", "error"))
    text = (f"{mode:9s} {len(run['outcomes'])} tests: " + ", ".join(f"{counts[k]} {k}" for k in sorted(counts))
            + f"; new failures: {len(new)}; {run['seconds']:.0f} s")
    if run["harness"]:
        text += "\n          harness: " + json.dumps(run["harness"])
    return text, new


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--work-dir", default=str(REPO / "build" / "vllm-peer"))
    parser.add_argument("--modes", default=",".join(MODES), help="baseline first (default %(default)s)")
    parser.add_argument("tests", nargs="*", default=["tests/v1/core"], help="paths inside vLLM's source tree")
    args = parser.parse_args(argv)
    # absolute (the tests run from inside vLLM's source tree), not resolved (a venv's python is a link)
    args.vllm_python = os.path.abspath(args.vllm_python)
    work = Path(args.work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    modes = args.modes.split(",")
    if modes[0] != "baseline" or not set(modes) <= set(MODES):
        parser.error(f"--modes: baseline first, then any of {MODES[1:]}")
    root = fetch(args.vllm_python, work)
    site = install_runner(args.vllm_python, work)
    runs = {}
    for mode in modes:
        print(f"vllm-peer-test: {mode} ...", flush=True)
        runs[mode] = run_mode(args.vllm_python, root, site, mode, work, args.tests)
    baseline = runs["baseline"]["outcomes"]
    failed = False
    for mode, run in runs.items():
        text, new = summary(mode, run, baseline)
        print(text)
        for test in new:
            print("          NEW FAILURE", test)
        unexercised = mode != "baseline" and not run["harness"].get("managers_hooked")
        if unexercised:
            print("          the harness hooked no pool: nothing was exercised")
        failed |= bool(new) or unexercised
    (work / "summary.json").write_text(json.dumps({m: {**r, "outcomes": None} for m, r in runs.items()}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
