#!/usr/bin/env bash
# The GPU check for the SGLang plugin (issue 23; docs/sglang.md, "Limits"). Not run on CPU: checked with
# `bash -n` only. On a machine with one CUDA GPU and an SGLang 0.5.23 environment that has this project
# installed (the plugin's entry point), it
#   1. writes a tiny random-weight hybrid (NemotronH: Mamba-2 + attention layers) with a fixed seed;
#   2. serves it twice, stock (--radix-eviction-policy lru) and with the plugin (marconi, alpha 0.5),
#      each with a small --max-total-tokens so the radix cache must evict;
#   3. sends the same multi-turn greedy requests (temperature 0) to both, one at a time;
#   4. compares the outputs token for token (eviction must never change an output) and prints each
#      server's cached-token rate (meta_info.cached_tokens / prompt_tokens).
# Exit status 0 when every output matches; 1 otherwise. Output and logs under $OUT (default /tmp/gpu_check_sglang).
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
import sys, torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast
from tokenizers import Tokenizer, models, pre_tokenizers

path = sys.argv[1]
torch.manual_seed(0)
config = AutoConfig.for_model(
    "nemotron_h", vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
    hybrid_override_pattern="M*M-", num_attention_heads=4, num_key_value_heads=2, head_dim=64,
    mamba_num_heads=8, mamba_head_dim=32, ssm_state_size=32, n_groups=1, conv_kernel=4, chunk_size=64,
    max_position_embeddings=8192, torch_dtype="bfloat16")
model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
model.save_pretrained(path)
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
for turn in range(40):
    s = rng.randrange(len(sessions))
    prompt = sessions[s] + [rng.randrange(3, 512) for _ in range(rng.randrange(20, 200))]
    body = {"input_ids": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 32, "ignore_eos": True}}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    reply = json.loads(urllib.request.urlopen(req, timeout=300).read())
    meta = reply["meta_info"]
    records.append({"output_ids": reply["output_ids"], "prompt_tokens": meta["prompt_tokens"],
                    "cached_tokens": meta.get("cached_tokens", 0)})
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
diff = [i for i, (x, y) in enumerate(zip(a, b)) if x["output_ids"] != y["output_ids"]]
rate = lambda rs: sum(r["cached_tokens"] for r in rs) / sum(r["prompt_tokens"] for r in rs)
print(f"requests {len(a)}; outputs differing: {len(diff)} {diff[:10]}")
print(f"cached-token rate: lru {rate(a):.2%}, marconi {rate(b):.2%}")
sys.exit(1 if diff or len(a) != len(b) else 0)
EOF
