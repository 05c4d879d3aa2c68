"""Tiny random-weight hybrid checkpoints that vLLM's CPU build serves (never downloaded).

    .venv-vllm/bin/python -m marconi.integrations.vllm.models qwen3_next-tiny /path/to/dir

The presets fit vLLM 0.32's CPU kernels; vocabulary 32000 (Mistral-v1 ids fit); weights seeded, every
projection at ``initializer_range = 1/sqrt(hidden)`` (transformers' own initialisation otherwise: not
the engine's Mamba-2 draws of :mod:`marconi.engine.models`); no tokenizer (servers take token ids).
Under these weights a random model's greedy tokens barely depend on the prefix, so the exactness
tests that serve them compare top-5 log-probabilities bit for bit, beside a control prompt whose
changed token must change them (tests/test_vllm_e2e.py, tests/test_vllm_sparse_retention.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["PRESETS", "BLOCK_SIZES", "NEEDS_MAMBA2_CPU_FIX", "build_checkpoint", "main"]

_V = 32000
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    # 3 gated-DeltaNet layers + 1 attention layer, ~9M parameters (4M of them embeddings/LM head).
    "qwen3_next-tiny": ("qwen3_next", dict(
        vocab_size=_V, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, linear_key_head_dim=64, linear_value_head_dim=64,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_conv_kernel_dim=4, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64, mlp_only_layers=[],
        max_position_embeddings=32768, tie_word_embeddings=False, initializer_range=128 ** -0.5)),
    # Mamba-2 + attention (Nemotron-H pattern M*M-M-): needs the plugin's Mamba-2 CPU fix.
    "nemotron_h-tiny": ("nemotron_h", dict(
        vocab_size=_V, hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, hybrid_override_pattern="M*M-M-", mamba_num_heads=4, mamba_head_dim=32, ssm_state_size=64,
        n_groups=1, conv_kernel=4, chunk_size=128, max_position_embeddings=32768, tie_word_embeddings=False,
        initializer_range=128 ** -0.5, time_step_min=1e-9)),
}


# vLLM 0.32's block size for each preset on CPU (attention block inflated to the Mamba page, in
# multiples of the CPU kernel's 128 tokens), as its engine core reports it. The server must be
# given it explicitly: its multi-process scheduler otherwise splits prefill on a stale 128-token
# block and misses the states it means to cache. ``marconi vllm bench`` checks it against
# /metrics on every run.
BLOCK_SIZES = {"qwen3_next-tiny": 384, "nemotron_h-tiny": 256}
# Presets that need the plugin's Mamba-2 CPU checkpoint fix to run at all.
NEEDS_MAMBA2_CPU_FIX = {"nemotron_h-tiny"}


def build_checkpoint(preset: str, out_dir: str | Path, *, seed: int = 0, dtype: str = "bfloat16") -> Path:
    """Build ``preset`` with random weights and save it (config + safetensors) to ``out_dir``; an
    existing checkpoint of the same preset, seed and dtype is kept. KeyError: unknown preset."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if preset not in PRESETS:
        raise KeyError(f"unknown preset {preset!r}; presets: {', '.join(PRESETS)}")
    out = Path(out_dir)
    stamp = {"preset": preset, "seed": seed, "dtype": dtype}
    marker = out / "marconi_preset.json"
    if marker.is_file() and json.loads(marker.read_text()) == stamp and (out / "config.json").is_file():
        return out
    model_type, kwargs = PRESETS[preset]
    config = AutoConfig.for_model(model_type, **kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    marker.write_text(json.dumps(stamp))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("preset", choices=sorted(PRESETS))
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    path = build_checkpoint(args.preset, args.out_dir, seed=args.seed)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
