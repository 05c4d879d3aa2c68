#!/usr/bin/env bash
# The GPU check for the SGLang plugin (issue 23; docs/sglang.md, "Limits"). Not run on CPU: checked with
# `bash -n` only. On a machine with one CUDA GPU and an SGLang 0.5.23 environment that has this project
# installed (the plugin's entry point), it
#   1. writes a tiny random-weight hybrid (NemotronH: Mamba-2 + attention layers) with a fixed seed, drawn
#      as the engine's presets are (marconi.engine.models.build_model: projections at 1/sqrt(hidden),
#      Mamba-2's A and dt, the skip D = 0), so the outputs see the recurrent state (under transformers'
#      default initialisation zeroing every state moved the logits by 4.5e-6 and no token: an audit);
#   2. serves it twice, stock (--radix-eviction-policy lru) and with the plugin (marconi, alpha 0.5),
#      each with a small --max-total-tokens so the radix cache must evict;
#   3. sends the same multi-turn greedy requests (temperature 0) to both, one at a time;
#   4. compares the outputs token for token (eviction must never change an output), prints the largest
#      gap between their top-5 log-probabilities and each server's cached-token rate
#      (meta_info.cached_tokens / prompt_tokens); a last control request (a session's prompt with one
#      token changed halfway) must move the log-probabilities, and each server must have hit.
# Exit status 0 when every output matches, both servers hit and the control moved; 1 otherwise.
# Output and logs under $OUT (default /tmp/gpu_check_sglang).
#
#   PYTHON=.venv-sglang-gpu/bin/python bash scripts/gpu_check_sglang.sh
set -euo pipefail

PYTHON=${PYTHON:-python}
OUT=${OUT:-/tmp/gpu_check_sglang}
PORT=${PORT:-31000}
MAX_TOTAL_TOKENS=${MAX_TOTAL_TOKENS:-6000}
MAMBA_BUFFER=${MAMBA_BUFFER:-no_buffer}          # or extra_buffer
mkdir -p "$OUT"
MODEL="$OUT/tiny-hybrid"

"$PYTHON" - "$MODEL" <<'EOF'
import sys
from transformers import AutoConfig, PreTrainedTokenizerFast
from tokenizers import Tokenizer, models, pre_tokenizers
from marconi.engine.models import build_model
import torch

path = sys.argv[1]
config = AutoConfig.for_model(
    "nemotron_h", vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
    hybrid_override_pattern="M*M-", num_attention_heads=4, num_key_value_heads=2, head_dim=64,
    mamba_num_heads=8, mamba_head_dim=32, ssm_state_size=32, n_groups=1, conv_kernel=4, chunk_size=64,
    max_position_embeddings=8192, initializer_range=256 ** -0.5, time_step_min=1e-9)
build_model(config, seed=0).module.to(torch.bfloat16).save_pretrained(path)      # the engine builds in float32
vocab = {f"t{i}": i for i in range(512)}
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", eos_token="t1", bos_token="t2").save_pretrained(path)
print("wrote", path)
EOF

serve_and_query() {   # $1: label, rest: extra server arguments
  local label=$1; shift
  "$PYTHON" -m sglang.launch_server --model-path "$MODEL" --port "$PORT" --max-total-tokens "$MAX_TOTAL_TOKENS" \
      --mamba-scheduler-strategy "$MAMBA_BUFFER" --random-seed 0 --disable-cuda-graph "$@" \
      > "$OUT/server-$label.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 180); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
    kill -0 "$pid" 2> /dev/null || { echo "server $label died"; tail -50 "$OUT/server-$label.log"; return 1; }
    sleep 2
  done
  "$PYTHON" - "$PORT" "$OUT/out-$label.json" <<'EOF'
import json, random, sys, urllib.request
port, out = sys.argv[1], sys.argv[2]
rng = random.Random(7)
sessions = [[rng.randrange(3, 512) for _ in range(rng.randrange(200, 900))] for _ in range(6)]
records = []
for turn in range(41):
    s = rng.randrange(len(sessions))
    prompt = sessions[s] + [rng.randrange(3, 512) for _ in range(rng.randrange(20, 200))]
    if turn == 40:                 # the control: the last request's prompt with one token changed halfway
        prompt = list(records[-1]["prompt"])
        prompt[len(prompt) // 2] = prompt[len(prompt) // 2] % 509 + 3
    body = {"input_ids": prompt, "return_logprob": True, "top_logprobs_num": 5,
            "sampling_params": {"temperature": 0, "max_new_tokens": 32, "ignore_eos": True}}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    reply = json.loads(urllib.request.urlopen(req, timeout=300).read())
    meta = reply["meta_info"]
    steps = meta.get("output_top_logprobs") or []           # per token: (logprob, token id, text) tuples
    records.append({"prompt": prompt, "output_ids": reply["output_ids"], "prompt_tokens": meta["prompt_tokens"],
                    "cached_tokens": meta.get("cached_tokens", 0),
                    "top_logprobs": [[[lp, tok] for lp, tok, *_ in step] for step in steps]})
    sessions[s] = prompt + reply["output_ids"] if len(prompt) < 3000 else sessions[s][:200]
json.dump(records, open(out, "w"))
hit = sum(r["cached_tokens"] for r in records) / sum(r["prompt_tokens"] for r in records)
print(f"cached-token rate {hit:.2%}")
EOF
  local rc=$?
  kill "$pid"; wait "$pid" 2> /dev/null || true
  return $rc
}

echo "== stock (lru)";  serve_and_query lru --radix-eviction-policy lru
echo "== plugin (marconi, alpha 0.5)"
serve_and_query marconi --radix-eviction-policy marconi --radix-eviction-policy-config '{"alpha": 0.5}'
grep -q "marconi" "$OUT/server-marconi.log" || echo "note: the server log does not name the marconi policy"

"$PYTHON" - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
a, b = (json.load(open(f"{out}/out-{k}.json")) for k in ("lru", "marconi"))

def gap(x, y):       # the largest gap between two requests' top log-probabilities, token for token
    pairs = [(p, q) for sx, sy in zip(x["top_logprobs"], y["top_logprobs"]) for p, q in zip(sx, sy) if p[1] == q[1]]
    return max((abs(p[0] - q[0]) for p, q in pairs), default=float("inf") if x["top_logprobs"] else 0.0)

diff = [i for i, (x, y) in enumerate(zip(a[:-1], b[:-1])) if x["output_ids"] != y["output_ids"]]
rate = lambda rs: sum(r["cached_tokens"] for r in rs) / sum(r["prompt_tokens"] for r in rs)
reuse_gap = max(gap(x, y) for x, y in zip(a[:-1], b[:-1]))
control_gap = gap(a[-1], a[-2])
print(f"requests {len(a) - 1}; outputs differing: {len(diff)} {diff[:10]}; largest log-probability gap "
      f"{reuse_gap:.3g}; the control moved them by {control_gap:.3g}")
print(f"cached-token rate: lru {rate(a):.2%}, marconi {rate(b):.2%}")
failed = []
if diff or len(a) != len(b):
    failed.append("outputs differ")
if not (rate(a) > 0 and rate(b) > 0):
    failed.append("a server served no cached token: nothing was reused, so nothing was checked")
if not control_gap > 0:
    failed.append("the control moved no log-probability: these outputs cannot see a wrong state")
print("FAIL: " + "; ".join(failed) if failed else "PASS")
sys.exit(1 if failed else 0)
EOF
