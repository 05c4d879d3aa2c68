import json

import pytest

from marconi.core.model import PRESETS, ModelSpec, SpecError, get_model


def test_paper_7b_matches_the_paper_numbers():
    spec = PRESETS["paper-7b"]
    assert spec.ssm_checkpoint_bytes == 26_787_840
    assert spec.kv_bytes_per_token == 65_536
    # 4·L·D bytes per attention layer in fp16 without GQA
    assert spec.kv_bytes(10) == 4 * (4 * 10 * 4096)


def test_flop_formulas_hand_computed():
    spec = ModelSpec("t", num_attn_layers=1, num_ssm_layers=1, num_mlp_layers=1, d_model=4, ssm_state_dim=2)
    L = 3
    assert spec.attn_flops(L) == 8 * 3 * 16 + 4 * 9 * 4
    assert spec.mlp_flops(L) == 16 * 3 * 16
    assert spec.ssm_flops(L) == 12 * 3 * 16 + 16 * 3 * 4 * 2 + 10 * 3 * 4
    assert spec.prefill_flops(L) == spec.attn_flops(3) + spec.mlp_flops(3) + spec.ssm_flops(3)
    # span: attention pays attn(end) - attn(start), linear layers the span only
    assert spec.span_flops(1, 3) == (spec.attn_flops(3) - spec.attn_flops(1)) + spec.mlp_flops(2) + spec.ssm_flops(2)
    assert spec.span_flops(0, 3) == spec.prefill_flops(3)


def test_presets_have_positive_sizes():
    assert {"paper-7b", "jamba-1.5-mini", "nemotron-h-8b", "bamba-9b", "qwen3-next-80b-a3b"} <= set(PRESETS)
    for spec in PRESETS.values():
        assert spec.kv_bytes_per_token > 0
        if spec.has_recurrent_state:
            assert spec.ssm_checkpoint_bytes > 0


def test_nemotron_h_real_state_sizes():
    spec = PRESETS["nemotron-h-8b"]
    assert (spec.num_attn_layers, spec.num_ssm_layers, spec.num_mlp_layers) == (4, 24, 24)
    # Mamba-2: 128 heads x 64 head dim x N=128 state + conv over 8192 + 2*8*128 channels, bf16
    per_layer = (128 * 64 * 128 + (8192 + 2 * 8 * 128) * 4) * 2
    assert spec.ssm_checkpoint_bytes == 24 * per_layer
    assert spec.kv_bytes_per_token == 4 * 2 * 8 * 128 * 2


def test_from_hf_config_file_and_dir(tmp_path):
    cfg = {"model_type": "bamba", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
           "num_key_value_heads": 2, "attn_layer_indices": [1], "mamba_n_heads": 4, "mamba_d_head": 16,
           "mamba_d_state": 8, "mamba_n_groups": 1, "mamba_d_conv": 4, "torch_dtype": "float32"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = ModelSpec.from_hf_config(tmp_path)
    assert spec.bytes_per_elem == 4
    assert (spec.num_attn_layers, spec.num_ssm_layers) == (1, 3)
    assert spec.kv_bytes_per_token == 1 * 2 * 2 * 16 * 4
    assert spec.ssm_checkpoint_bytes == 3 * (64 * 8 + (64 + 16) * 4) * 4
    assert get_model(str(tmp_path / "config.json")) == spec


def test_bad_specs_and_configs(tmp_path):
    with pytest.raises(SpecError, match="unsupported model_type 'llama'"):
        ModelSpec.from_hf_config({"model_type": "llama"})
    with pytest.raises(SpecError, match="lacks the field"):
        ModelSpec.from_hf_config({"model_type": "nemotron_h", "hidden_size": 8})
    with pytest.raises(SpecError, match="no config.json"):
        ModelSpec.from_hf_config(tmp_path)
    with pytest.raises(SpecError, match="unknown model 'nope'"):
        get_model("nope")
    with pytest.raises(SpecError, match="num_ssm_layers must be >= 0"):
        ModelSpec("x", 1, -1, 1, 8, 4)


def test_transformers_5_layer_kind_names():
    nemotron = {"model_type": "nemotron_h", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                "mamba_num_heads": 4, "mamba_head_dim": 16, "n_groups": 1, "ssm_state_size": 8,
                "layers_block_type": ["linear_attention", "mlp", "full_attention", "mlp", "linear_attention", "moe"]}
    spec = ModelSpec.from_hf_config(nemotron)
    assert (spec.num_attn_layers, spec.num_ssm_layers, spec.num_mlp_layers) == (1, 2, 3)
    granite = {"model_type": "granitemoehybrid", "hidden_size": 64, "num_attention_heads": 4,
               "layer_types": ["linear_attention", "full_attention", "mamba", "attention"],
               "mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_state": 8}
    spec = ModelSpec.from_hf_config(granite)
    assert (spec.num_attn_layers, spec.num_ssm_layers) == (2, 2)
    with pytest.raises(SpecError, match="unknown layer kinds"):
        ModelSpec.from_hf_config({**nemotron, "layers_block_type": ["linear_attention", "sparse"]})
