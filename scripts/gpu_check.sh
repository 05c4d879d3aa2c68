#!/usr/bin/env bash
# GPU check (issue 22, item 7): vLLM 0.33 (the GPU wheel) serving one real hybrid config with
# random weights, stock vs the Marconi plugin, on the bundled SWE trace at concurrency 16.
#
#   scripts/gpu_check.sh            # on a machine with one NVIDIA GPU; about 8 minutes
#   scripts/gpu_check.sh --tier     # the CPU tier's check instead (issue 34, item 6); about 8 minutes
#   scripts/gpu_check.sh --all      # both (in any order with --tier)
#   scripts/gpu_check.sh --dry-run  # print the steps, run nothing (with --tier/--all: theirs)
#
# Setup (1-3): a venv with vllm==0.33.0 and its own CUDA dependencies (or GPU_CHECK_PYTHON's
# environment), this project in it with numpy, the bench's client, tqdm and matplotlib, and a model
# directory holding only the bundled Nemotron-H-8B config.json (never weights: vLLM's --load-format
# dummy gives random ones). Setup needs the package index (vLLM 0.33.0 is ~800 MB and pins torch
# 2.14.0) unless GPU_CHECK_PYTHON names a python that already has vLLM 0.33; without either the check
# stops at once, saying so.
# The pool (P1-P2): two servers in turn, stock (plugin not loaded) and MARCONI_VLLM_POLICY=marconi,
# each replaying the first NUM_REQUESTS requests of the SWE trace with CONCURRENCY in flight: vLLM's
# own hit rate (prefix_cache_hits / queries), TTFT P50/P95; then the `marconi vllm replay`
# prediction for the same model, pool and concurrency (vLLM's scheduler on a virtual clock, run with
# the GPU build's python, so its block sizes are CUDA's as the servers' are).
# The tier (--tier, T1-T4): vLLM's OffloadingConnector with Marconi's tier policy
# (MarconiCachePolicy, loaded from kv_connector_extra_config alone) beside a small GPU pool. T1:
# greedy outputs of the requests one at a time, twice over, in three runs of one engine configuration:
# recomputed (the cache never read), a GPU pool that evicts nothing, and the small pool plus the
# tier; a request resumed at the same depth from the tier and from the GPU pool must give
# bit-for-bit the same outputs, the tier must have served tokens from host memory, and a control
# prompt must show that the outputs see a changed prefix (reloaded states are exact). T2: the same
# requests through a server with the tier, 4 in flight; T3: `marconi vllm replay --cpu-tier` for the
# same pool and tier; T4: the verdict, and vLLM's hits by tier beside the replay's.
# scripts/gpu_tier_check.py holds the Python half.
#
# Settings (environment): GPU_CHECK_DIR (default build/gpu-check), PYTHON (default python3: makes
# the venv), GPU_CHECK_PYTHON (an existing environment's python with vllm==0.33.0: no venv, no vLLM
# install; the project goes into it without build isolation), GPU_MODEL (the replay's step-time
# GPU: h100, h200 or a100; default read from nvidia-smi), NUM_BLOCKS (2000), NUM_REQUESTS (60),
# CONCURRENCY (16); for --tier: NUM_BLOCKS_TIER (40), CPU_TIER_BYTES (32 GiB), TIER_REQUESTS (12),
# REFERENCE_BLOCKS (400, T1's recompute and GPU-pool runs). Not verified on a GPU yet (no device
# that could install vLLM was lent).
set -euo pipefail

DRY_RUN=0
WANT_POOL=0
WANT_TIER=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    --tier) WANT_TIER=1 ;;
    --all) WANT_POOL=1; WANT_TIER=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check: unknown argument $arg (--dry-run, --tier, --all)" >&2; exit 2 ;;
  esac
done
POOL=$WANT_POOL
TIER=$WANT_TIER
[ "$WANT_TIER" = 0 ] && POOL=1      # no --tier: the pool's check alone

REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=${GPU_CHECK_DIR:-$REPO/build/gpu-check}
PYTHON=${PYTHON:-python3}
NUM_BLOCKS=${NUM_BLOCKS:-2000}
NUM_REQUESTS=${NUM_REQUESTS:-60}
CONCURRENCY=${CONCURRENCY:-16}
NUM_BLOCKS_TIER=${NUM_BLOCKS_TIER:-40}
CPU_TIER_BYTES=${CPU_TIER_BYTES:-34359738368}
TIER_REQUESTS=${TIER_REQUESTS:-12}
REFERENCE_BLOCKS=${REFERENCE_BLOCKS:-400}
SERVE=
if [ -n "${GPU_CHECK_PYTHON:-}" ]; then
  VPY=$GPU_CHECK_PYTHON
else
  VPY=$WORK/venv/bin/python
fi
MODEL=$WORK/nemotron-h-8b
CONFIG=$REPO/src/marconi/data/configs/nemotron-h-8b/config.json

step() {  # step DESCRIPTION -- COMMAND...: print it (as a shell would take it); run it unless --dry-run
  local what=$1; shift; [ "$1" = "--" ] && shift
  echo "== $what"
  local shown
  shown=$(printf '%q ' "$@")
  [ -n "$SERVE" ] && shown=${shown//"$(printf '%q' "$SERVE")"/'"$SERVE" (the script printed above)'}
  echo "   $shown"
  if [ "$DRY_RUN" = 0 ]; then "$@"; fi
}

gpu_name=
if [ "$DRY_RUN" = 0 ]; then
  gpu_name=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -n 1) \
    || { echo "gpu_check: no NVIDIA GPU here (nvidia-smi missing or failing); try --dry-run" >&2; exit 1; }
  echo "$gpu_name"
fi
case "${GPU_MODEL:-}" in
  h100|h200|a100) ;;
  "") case "$gpu_name" in *H100*) GPU_MODEL=h100 ;; *A100*) GPU_MODEL=a100 ;; *) GPU_MODEL=h200 ;; esac ;;
  *) echo "gpu_check: GPU_MODEL must be h100, h200 or a100, got $GPU_MODEL" >&2; exit 2 ;;
esac
[ -f "$CONFIG" ] || { echo "gpu_check: $CONFIG missing" >&2; exit 1; }

# Preflight: the setup needs vLLM 0.33 in hand or the package index in reach; say which is missing
# now, not after pip's retries.
if [ "$DRY_RUN" = 0 ]; then
  if [ -n "${GPU_CHECK_PYTHON:-}" ]; then
    "$VPY" -c 'import sys, vllm; v = vllm.__version__; sys.exit(0 if v.startswith("0.33.") else f"vLLM {v}")' \
      || { echo "gpu_check: GPU_CHECK_PYTHON=$GPU_CHECK_PYTHON has no vLLM 0.33 (see above): give the python" \
                "of an environment with vllm==0.33.0" >&2; exit 1; }
  elif ! "$VPY" -c 'import vllm' 2>/dev/null \
      && ! "$PYTHON" -m pip index versions vllm --timeout 5 --retries 0 >/dev/null 2>&1; then
    echo "gpu_check: the package index is out of reach and $VPY has no vLLM: this check installs vllm==0.33.0" \
         "(~800 MB with CUDA torch 2.14.0). Run it where pip reaches the index, or set GPU_CHECK_PYTHON to the python" \
         "of an environment that already has vllm==0.33.0." >&2
    exit 1
  fi
fi

if [ -n "${GPU_CHECK_PYTHON:-}" ]; then
  step "setup 1/3 vLLM 0.33 from GPU_CHECK_PYTHON ($GPU_CHECK_PYTHON): nothing to install" -- true
  step "setup 2/3 this project in it (plugin entry point; no build isolation) with numpy, httpx, tqdm, matplotlib" -- \
    bash -c "'$VPY' -m pip install --quiet --no-deps --no-build-isolation -e '$REPO' \
             && '$VPY' -c 'import numpy, httpx, tqdm, matplotlib'"
else
  step "setup 1/3 venv with vLLM 0.33.0 (GPU wheel and its CUDA deps)" -- \
    bash -c "[ -x '$VPY' ] || $PYTHON -m venv '$WORK/venv'; '$VPY' -m pip install --quiet vllm==0.33.0"
  step "setup 2/3 this project in it (plugin entry point) with numpy, httpx, tqdm and matplotlib" -- \
    bash -c "'$VPY' -m pip install --quiet --no-deps -e '$REPO' \
             && '$VPY' -m pip install --quiet numpy httpx==0.28.1 tqdm matplotlib"
fi
step "setup 3/3 model directory: the bundled Nemotron-H-8B config, no weights (--load-format dummy)" -- \
  bash -c "mkdir -p '$MODEL' && cp '$CONFIG' '$MODEL/config.json'"

if [ "$POOL" = 1 ]; then
# Both servers, in turn, through the project's own server and client (marconi.integrations.*).
SERVE=$(cat <<'PY'
import json, os, sys
from marconi.integrations.common.bench import percentile, replay_concurrent, select_requests
from marconi.integrations.vllm.server import ServerConfig, VllmServer

work, model, num_blocks, num_requests, concurrency = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
requests = select_requests("swe-sample", max_input_len=8192, num_requests=num_requests).requests
rows = []
for label, env in (("stock", {}), ("marconi", {"MARCONI_VLLM_POLICY": "marconi", "MARCONI_VLLM_ALPHA": "0.5"})):
    config = ServerConfig(python=sys.executable, model_dir=model, num_blocks=num_blocks, max_model_len=16384,
                          max_num_batched_tokens=8192, max_num_seqs=concurrency, block_size=None, plugin_env=env,
                          extra_args=("--load-format", "dummy", "--gpu-memory-utilization", "0.85"))
    with VllmServer(config, log_path=os.path.join(work, f"{label}.log")) as server:
        results = replay_concurrent(server, model, requests, concurrency, label, lambda line: print("  ", line))
        metrics = server.metrics()
    hits, queries = metrics.get("vllm:prefix_cache_hits_total", 0.0), metrics.get("vllm:prefix_cache_queries_total", 0.0)
    ttft = [r.ttft_s for r in results]
    rows.append({"policy": label, "num_requests": len(results), "token_hit_rate": hits / queries if queries else None,
                 "ttft_p50_s": percentile(ttft, 50), "ttft_p95_s": percentile(ttft, 95)})
    print(json.dumps(rows[-1]), flush=True)
with open(os.path.join(work, "served.jsonl"), "w") as out:
    out.writelines(json.dumps(row) + "\n" for row in rows)
print(f"{'policy':8s} {'hit rate':>9s} {'TTFT P50':>9s} {'TTFT P95':>9s}")
for row in rows:
    print(f"{row['policy']:8s} {row['token_hit_rate']:9.2%} {row['ttft_p50_s']:8.3f}s {row['ttft_p95_s']:8.3f}s")
PY
)
[ "$DRY_RUN" = 1 ] && { echo "   the script (\$SERVE):"; printf '%s\n' "$SERVE" | sed 's/^/   | /'; }
step "P1 serve stock vs plugin: $NUM_REQUESTS SWE requests, $CONCURRENCY in flight, $NUM_BLOCKS blocks" -- \
  "$VPY" -c "$SERVE" "$WORK" "$MODEL" "$NUM_BLOCKS" "$NUM_REQUESTS" "$CONCURRENCY"
step "P2 the replay's prediction for the same run (vLLM's scheduler, virtual clock, no GPU)" -- \
  "$VPY" -m marconi vllm replay --vllm-python "$VPY" --trace swe-sample \
  --model nemotron-h-8b --blocks "$NUM_BLOCKS" --concurrency "$CONCURRENCY" --num-requests "$NUM_REQUESTS" \
  --gpu "$GPU_MODEL" --policies lru,marconi --no-emulation --out "$WORK/replay.jsonl" --plot ''
echo "gpu_check: served results in $WORK/served.jsonl, replay prediction in $WORK/replay.jsonl"
fi

if [ "$TIER" = 1 ]; then
  SERVE=
  TIER_WORK=$WORK/tier
  CHECK=$REPO/scripts/gpu_tier_check.py
  for mode in recompute gpu tier; do
    what="T1/$mode greedy outputs of $TIER_REQUESTS SWE requests, one at a time (pool: $NUM_BLOCKS_TIER blocks"
    what+=" with the tier, $REFERENCE_BLOCKS without; tier: $CPU_TIER_BYTES bytes, MarconiCachePolicy)"
    step "$what" -- \
      "$VPY" "$CHECK" generate --mode "$mode" --model "$MODEL" --blocks "$NUM_BLOCKS_TIER" \
      --reference-blocks "$REFERENCE_BLOCKS" --cpu-tier-bytes "$CPU_TIER_BYTES" --num-requests "$TIER_REQUESTS" \
      --work "$TIER_WORK"
  done
  step "T2 the same requests through a server with the tier, 4 in flight (vLLM's hits by tier)" -- \
    "$VPY" "$CHECK" serve --model "$MODEL" --blocks "$NUM_BLOCKS_TIER" --cpu-tier-bytes "$CPU_TIER_BYTES" \
    --num-requests "$TIER_REQUESTS" --concurrency 4 --work "$TIER_WORK"
  step "T3 the replay's prediction for that server run (vLLM's scheduler and tier, virtual clock, no GPU)" -- \
    "$VPY" -m marconi vllm replay --vllm-python "$VPY" --trace swe-sample \
    --model nemotron-h-8b --blocks "$NUM_BLOCKS_TIER" --concurrency 4 --num-requests "$TIER_REQUESTS" \
    --cpu-tier "${CPU_TIER_BYTES}B" --policies lru --tier-policies marconi --gpu "$GPU_MODEL" --no-emulation \
    --out "$TIER_WORK/replay.jsonl" --plot ''
  step "T4 exactness verdict, and served hits by tier against the replay's" -- \
    "$VPY" "$CHECK" compare --work "$TIER_WORK" --replay "$TIER_WORK/replay.jsonl"
fi
