#!/usr/bin/env bash
# GPU check (issue 22, item 7): vLLM 0.33 (the GPU wheel) serving one real hybrid config with
# random weights, stock vs the Marconi plugin, on the bundled SWE trace at concurrency 16.
#
#   scripts/gpu_check.sh            # on a machine with one NVIDIA GPU; about 8 minutes
#   scripts/gpu_check.sh --tier     # the CPU tier's check instead (issue 34, item 6); about 8 minutes
#   scripts/gpu_check.sh --all      # both
#   scripts/gpu_check.sh --dry-run  # print the steps, run nothing (with --tier/--all: theirs)
#
# Steps: (1) a venv with vllm==0.33.0 and its own (CUDA) dependencies, and this project with no
# dependencies but numpy, the bench's client, tqdm and matplotlib; (2) a model directory holding only the bundled
# Nemotron-H-8B config.json (never weights: vLLM's --load-format dummy gives random ones);
# (3) two servers in turn, stock (plugin not loaded) and MARCONI_VLLM_POLICY=marconi, each replaying
# the first NUM_REQUESTS requests of the SWE trace with 16 in flight; (4) for each: vLLM's own hit
# rate (prefix_cache_hits / queries), TTFT P50/P95; then the `marconi vllm replay` prediction for
# the same model, pool and concurrency (vLLM's scheduler on a virtual clock, no GPU).
# Settings (environment): GPU_CHECK_DIR (default build/gpu-check), NUM_BLOCKS (default 2000),
# NUM_REQUESTS (default 60), CONCURRENCY (default 16), GPU_MODEL (the replay's step-time GPU: h100, h200
# or a100; default h200), PYTHON (default python3). Not verified on a GPU yet (no device was lent).
# --tier: vLLM's OffloadingConnector with Marconi's tier policy (MarconiCachePolicy, loaded from
# kv_connector_extra_config alone) beside a small GPU pool (NUM_BLOCKS_TIER, default 40; CPU_TIER_BYTES,
# default 32 GiB; TIER_REQUESTS, default 12): (T1) greedy outputs of the requests one at a time,
# recomputed / GPU pool only / GPU pool + tier, and the tier must give the recomputed outputs on as
# many requests as the GPU pool alone does, having served tokens from host memory (reloaded states
# are exact); (T2) the same requests through a server with the tier, 4 in flight, vLLM's hits by
# tier against `marconi vllm replay --cpu-tier` for the same pool and tier. scripts/gpu_tier_check.py
# holds the Python half.
set -euo pipefail

DRY_RUN=0
POOL=1
TIER=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    --tier) POOL=0; TIER=1 ;;
    --all) POOL=1; TIER=1 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument $arg (--dry-run, --tier, --all)" >&2; exit 2 ;;
  esac
done

REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=${GPU_CHECK_DIR:-$REPO/build/gpu-check}
PYTHON=${PYTHON:-python3}
NUM_BLOCKS=${NUM_BLOCKS:-2000}
NUM_REQUESTS=${NUM_REQUESTS:-60}
CONCURRENCY=${CONCURRENCY:-16}
GPU_MODEL=${GPU_MODEL:-h200}
NUM_BLOCKS_TIER=${NUM_BLOCKS_TIER:-40}
CPU_TIER_BYTES=${CPU_TIER_BYTES:-34359738368}
TIER_REQUESTS=${TIER_REQUESTS:-12}
SERVE=
VENV=$WORK/venv
MODEL=$WORK/nemotron-h-8b
CONFIG=$REPO/src/marconi/data/configs/nemotron-h-8b/config.json

step() {  # step DESCRIPTION -- COMMAND...: print it; run it unless --dry-run
  local what=$1; shift; [ "$1" = "--" ] && shift
  echo "== $what"
  local shown="$*"
  echo "   ${shown//"$SERVE"/<the serve script above>}"
  if [ "$DRY_RUN" = 0 ]; then "$@"; fi
}

if [ "$DRY_RUN" = 0 ]; then
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader \
    || { echo "gpu_check: no NVIDIA GPU here (nvidia-smi missing); try --dry-run" >&2; exit 1; }
fi
[ -f "$CONFIG" ] || { echo "gpu_check: $CONFIG missing" >&2; exit 1; }

step "1/5 venv with vLLM 0.33.0 (GPU wheel and its CUDA deps)" -- \
  bash -c "[ -x '$VENV/bin/python' ] || $PYTHON -m venv '$VENV'; '$VENV/bin/python' -m pip install --quiet vllm==0.33.0"
step "2/5 this project in it (plugin entry point; numpy and httpx only)" -- \
  bash -c "'$VENV/bin/python' -m pip install --quiet --no-deps -e '$REPO' && '$VENV/bin/python' -m pip install --quiet numpy httpx==0.28.1 tqdm matplotlib"
step "3/5 model directory: the bundled Nemotron-H-8B config, no weights (--load-format dummy)" -- \
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
step "4/5 serve stock vs plugin: $NUM_REQUESTS SWE requests, $CONCURRENCY in flight, $NUM_BLOCKS blocks" -- \
  "$VENV/bin/python" -c "$SERVE" "$WORK" "$MODEL" "$NUM_BLOCKS" "$NUM_REQUESTS" "$CONCURRENCY"
step "5/5 the replay's prediction for the same run (vLLM's scheduler, virtual clock, no GPU)" -- \
  "$VENV/bin/python" -m marconi vllm replay --vllm-python "$VENV/bin/python" --trace swe-sample \
  --model nemotron-h-8b --blocks "$NUM_BLOCKS" --concurrency "$CONCURRENCY" --num-requests "$NUM_REQUESTS" \
  --gpu "$GPU_MODEL" --policies lru,marconi --no-emulation --out "$WORK/replay.jsonl" --plot ''
echo "gpu_check: served results in $WORK/served.jsonl, replay prediction in $WORK/replay.jsonl"
fi

if [ "$TIER" = 1 ]; then
  TIER_WORK=$WORK/tier
  CHECK=$REPO/scripts/gpu_tier_check.py
  for mode in recompute gpu tier; do
    step "T1/$mode greedy outputs of $TIER_REQUESTS SWE requests, one at a time ($NUM_BLOCKS_TIER blocks; tier: $CPU_TIER_BYTES bytes, MarconiCachePolicy)" -- \
      "$VENV/bin/python" "$CHECK" generate --mode "$mode" --model "$MODEL" --blocks "$NUM_BLOCKS_TIER" \
      --cpu-tier-bytes "$CPU_TIER_BYTES" --num-requests "$TIER_REQUESTS" --work "$TIER_WORK"
  done
  step "T2 the same requests through a server with the tier, 4 in flight (vLLM's hits by tier)" -- \
    "$VENV/bin/python" "$CHECK" serve --model "$MODEL" --blocks "$NUM_BLOCKS_TIER" --cpu-tier-bytes "$CPU_TIER_BYTES" \
    --num-requests "$TIER_REQUESTS" --concurrency 4 --work "$TIER_WORK"
  step "T3 the replay's prediction for that server run (vLLM's scheduler and tier, virtual clock, no GPU)" -- \
    "$VENV/bin/python" -m marconi vllm replay --vllm-python "$VENV/bin/python" --trace swe-sample \
    --model nemotron-h-8b --blocks "$NUM_BLOCKS_TIER" --concurrency 4 --num-requests "$TIER_REQUESTS" \
    --cpu-tier "${CPU_TIER_BYTES}B" --policies lru --tier-policies marconi --gpu "$GPU_MODEL" --no-emulation \
    --out "$TIER_WORK/replay.jsonl" --plot ''
  step "T4 exactness verdict, and served hits by tier against the replay's" -- \
    "$VENV/bin/python" "$CHECK" compare --work "$TIER_WORK" --replay "$TIER_WORK/replay.jsonl"
fi
