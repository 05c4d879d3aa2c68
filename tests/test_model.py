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
    with pytest.raises(SpecError, match=r"model '/no/such/config.json': no such file or directory"):
        get_model("/no/such/config.json")        # meant as a path: was "unknown model" (audit)
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


# ----------------------------------------------------------------------------- issue 21: bugs 4, 13
BAMBA = {"model_type": "bamba", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
         "num_key_value_heads": 2, "attn_layer_indices": [1], "mamba_n_heads": 4, "mamba_d_head": 16,
         "mamba_d_state": 8, "mamba_n_groups": 1, "mamba_d_conv": 4, "torch_dtype": "float32"}


@pytest.mark.parametrize("field, value, message", [
    ("mamba_n_heads", -128, "mamba_n_heads must be >= 1, got -128"),
    ("mamba_d_state", 0, "mamba_d_state must be >= 1, got 0"),
    ("num_key_value_heads", 0, "num_key_value_heads must be >= 1, got 0"),   # was replaced by the head count
    ("num_key_value_heads", -2, "num_key_value_heads must be >= 1, got -2"),
])
def test_negative_or_zero_state_sizes_are_refused(field, value, message):
    """Bug 4: a negative mamba_n_heads gave negative checkpoint bytes; num_key_value_heads: 0 was
    silently replaced by the head count."""
    with pytest.raises(SpecError, match=f"config of model_type 'bamba': {message}"):
        ModelSpec.from_hf_config({**BAMBA, field: value})


def test_a_spec_refuses_negative_sizes_directly():
    base = dict(name="x", num_attn_layers=1, num_ssm_layers=1, num_mlp_layers=1, d_model=8, ssm_state_dim=4)
    for field, value in (("ssm_state_width", -1), ("conv_dim", -8), ("checkpoint_extra_bytes", -1),
                         ("conv_kernel", -1), ("ssm_expand", -2)):
        with pytest.raises(SpecError, match=f"x: {field} must be >= 0, got {value}"):
            ModelSpec(**base, **{field: value})
    for field in ("num_kv_heads", "head_dim"):
        with pytest.raises(SpecError, match=f"{field} must be > 0 when given, got 0"):
            ModelSpec(**base, **{"num_kv_heads": 2, "head_dim": 4, field: 0})
    with pytest.raises(SpecError, match="d_model must be an integer, got 8.5"):
        ModelSpec(**{**base, "d_model": 8.5})
    with pytest.raises(SpecError, match="d_model = 1000000000000000000000000000000 is implausibly large"):
        ModelSpec(**{**base, "d_model": 10**30})
    with pytest.raises(SpecError, match="KV bytes per token = .* is implausibly large"):
        ModelSpec(**base, num_kv_heads=2**30, head_dim=2**30)


def test_a_missing_kv_head_count_means_multi_head_attention():
    for kv in (None, "absent"):
        cfg = {k: v for k, v in BAMBA.items() if k != "num_key_value_heads"} if kv == "absent" else \
            {**BAMBA, "num_key_value_heads": None}
        assert ModelSpec.from_hf_config(cfg).num_kv_heads == 4


@pytest.mark.parametrize("change, message", [
    ({"num_attention_heads": 0}, "num_attention_heads must be >= 1, got 0"),
    ({"num_attention_heads": 200}, "num_attention_heads = 200 exceeds the 64 channels of hidden_size = 64"),
    ({"hidden_size": None}, "lacks the field 'hidden_size' \\(it is null\\)"),
    ({"hidden_size": "64"}, "hidden_size must be an integer, got a string \\('64'\\)"),
    ({"hidden_size": 64.5}, "hidden_size must be an integer, got a number \\(64.5\\)"),
    ({"hidden_size": [64]}, "hidden_size must be an integer, got a list$"),
    ({"hidden_size": True}, "hidden_size must be an integer, got a bool \\(True\\)"),
    ({"hidden_size": 1e30}, "hidden_size = 1000000000000000019884624838656 is implausibly large"),
    ({"num_hidden_layers": 10**12}, "num_hidden_layers = 1000000000000 is implausibly large"),
    ({"attn_layer_indices": 5}, "attn_layer_indices must be a list, got an integer \\(5\\)"),
    ({"attn_layer_indices": [1, 9]}, "attn_layer_indices must list layer indices in \\[0, 4\\) .* got 9"),
    ({"attn_layer_indices": [1, 1]}, "attn_layer_indices lists a layer twice"),
    ({"attn_layer_indices": ["1"]}, "attn_layer_indices must list layer indices .* got a string \\('1'\\)"),
    ({"model_type": ["bamba"]}, "unsupported model_type \\['bamba'\\]"),
    ({"torch_dtype": "int7"}, "unknown dtype 'int7'"),
])
def test_bad_model_configs_are_clear_errors_naming_the_file_and_field(tmp_path, change, message):
    """Bug 13: these gave tracebacks (ZeroDivisionError, TypeError, a hang over 10**12 layers)."""
    with pytest.raises(SpecError, match=message):
        ModelSpec.from_hf_config({**BAMBA, **change})
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**BAMBA, **change}))
    with pytest.raises(SpecError, match=f"{path}.*{message}"):
        ModelSpec.from_hf_config(tmp_path)


def test_a_text_config_must_be_an_object():
    with pytest.raises(SpecError, match="config: text_config must be a JSON object .*got a list$"):
        ModelSpec.from_hf_config({"model_type": "llava", "text_config": [1, 2]})
    assert ModelSpec.from_hf_config({"model_type": "llava", "text_config": BAMBA}).num_attn_layers == 1


def test_other_parsers_refuse_bad_fields_too():
    jamba = {"model_type": "jamba", "hidden_size": 64, "num_hidden_layers": 10**9, "num_attention_heads": 4}
    with pytest.raises(SpecError, match="num_hidden_layers = 1000000000 is implausibly large"):
        ModelSpec.from_hf_config(jamba)                     # no loop over a billion layers
    with pytest.raises(SpecError, match="attn_layer_period must be >= 1, got 0"):
        ModelSpec.from_hf_config({**jamba, "num_hidden_layers": 8, "attn_layer_period": 0})
    with pytest.raises(SpecError, match="layer_types must list layer kinds as strings, got an integer \\(3\\) among"):
        ModelSpec.from_hf_config({"model_type": "lfm2", "hidden_size": 64, "num_attention_heads": 4,
                                  "layer_types": ["conv", 3]})
    with pytest.raises(SpecError, match="hybrid_override_pattern must be a string, got an integer \\(7\\)"):
        ModelSpec.from_hf_config({"model_type": "nemotron_h", "hybrid_override_pattern": 7})
    with pytest.raises(SpecError, match="lacks the field 'hybrid_override_pattern'"):
        ModelSpec.from_hf_config({"model_type": "nemotron_h", "hidden_size": 8})
