"""Loading hybrids: presets, checkpoints, the spec check against real tensors, and clear refusals."""

from __future__ import annotations

import dataclasses
import json

import pytest

import torch
import transformers

pytestmark = pytest.mark.usefixtures("one_torch_thread")

from marconi.engine import precision
from marconi.engine.errors import (
    EngineError,
    SpecMismatchError,
    TokenRangeError,
    UnsupportedModelError,
)
from marconi.engine.models import (
    PRESETS,
    HybridModel,
    build_model,
    check_spec,
    load_checkpoint,
    load_model,
    measure_cache_bytes,
    preset_config,
)

TINY = [name for name in PRESETS if name.endswith("-tiny")]




@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("preset", TINY)
def test_every_preset_loads_with_a_spec_matching_its_tensors(preset, dtype):
    model = load_model(preset, dtype=dtype)
    real = measure_cache_bytes(model)
    assert real.kv_bytes_per_token == model.spec.kv_bytes_per_token > 0
    assert real.ssm_checkpoint_bytes == model.spec.ssm_checkpoint_bytes > 0
    assert model.spec.bytes_per_elem == (4 if dtype == "float32" else 8)
    assert model.vocab_size >= 32000  # the project tokenizer's ids fit without folding
    assert model.layout.attn_layers and model.layout.ssm_layers  # a real hybrid


def test_bench_preset_size():
    config = preset_config("bamba-bench")
    with torch.device("meta"):
        module = transformers.AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in module.parameters())
    assert 50e6 <= params <= 100e6


def test_seeded_and_deterministic():
    a, b = load_model("qwen3_next-tiny", seed=3), load_model("qwen3_next-tiny", seed=3)
    c = load_model("qwen3_next-tiny", seed=4)
    pa, pb, pc = (dict(m.module.named_parameters()) for m in (a, b, c))
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert not all(torch.equal(pa[k], pc[k]) for k in pa)
    state = torch.random.get_rng_state()
    load_model("bamba-tiny", seed=5)
    assert torch.equal(state, torch.random.get_rng_state())  # the global RNG is left alone


def test_spec_disagreeing_with_real_shapes_names_both_numbers():
    model = load_model("bamba-tiny")
    spec = model.spec
    with pytest.raises(SpecMismatchError) as err:
        check_spec(model, spec.with_changes(bytes_per_elem=2))
    msg = str(err.value)
    halved = spec.with_changes(bytes_per_elem=2)
    assert f"spec {spec.kv_bytes_per_token // 2}, model's cache {spec.kv_bytes_per_token}" in msg
    assert f"spec {halved.ssm_checkpoint_bytes}, model's cache {spec.ssm_checkpoint_bytes}" in msg
    with pytest.raises(SpecMismatchError, match="SSM checkpoint bytes"):
        check_spec(model, spec.with_changes(ssm_state_dim=spec.ssm_state_dim + 1))
    # the final hidden state kept with each checkpoint is counted: D elements of the model's dtype
    assert spec.checkpoint_extra_bytes == model.config.hidden_size * 4
    with pytest.raises(SpecMismatchError, match=f"spec {spec.ssm_checkpoint_bytes - 256}, model's cache"):
        check_spec(model, spec.with_changes(checkpoint_extra_bytes=0))
    with pytest.raises(SpecMismatchError, match="attention layers: spec 2, cache layers with KVs 1"):
        check_spec(model, spec.with_changes(num_attn_layers=2))


@pytest.mark.parametrize("preset,changes", [("falcon_h1-tiny", {"lm_head_multiplier": 0.37}),
                                            ("granitemoehybrid-tiny", {"logits_scaling": 3.0}),
                                            ("nemotron_h-tiny", {})])
def test_logits_from_a_kept_hidden_state_are_the_forwards_own(preset, changes):
    """Checked at load: the LM head's post-processing (a multiplier, a scale, a cast) is
    reproduced bitwise; an architecture entry without it is refused, naming the problem."""
    model_type, kwargs = PRESETS[preset]
    config = transformers.AutoConfig.for_model(model_type, **{**kwargs, **changes})
    model = build_model(config, dtype="float64")
    cache = model.new_cache()
    fwd = model.forward_full(cache, torch.arange(20) * 13, 0)
    assert torch.equal(model.logits_from_hidden(fwd.hidden.clone()), fwd.logits)
    assert fwd.hidden.shape == (1, 1, config.hidden_size)
    bare = dataclasses.replace(model.arch, logits_post=None)
    with pytest.raises(SpecMismatchError, match="logits recomputed from the final hidden state differ"):
        HybridModel("bare", model.module, model.config, bare, model.dtype)


def test_float64_without_the_scan_patch_fails_the_spec_check(monkeypatch):
    # Upstream scans return float32 states in a float64 model: 4-byte tensors where the spec says 8.
    monkeypatch.setattr(precision, "PATCHED_MODULES", {})
    with pytest.raises(SpecMismatchError, match="SSM checkpoint bytes"):
        load_model("bamba-tiny", dtype="float64")


def test_unsupported_architectures_are_refused():
    llama = transformers.AutoConfig.for_model("llama", vocab_size=100, hidden_size=16, intermediate_size=32,
                                              num_hidden_layers=1, num_attention_heads=2)
    with pytest.raises(UnsupportedModelError, match="unsupported model_type 'llama'.*bamba"):
        build_model(llama)
    jamba = transformers.AutoConfig.for_model("jamba", vocab_size=100, hidden_size=16, num_hidden_layers=2)
    with pytest.raises(UnsupportedModelError, match="Mamba-1"):
        build_model(jamba)
    with pytest.raises(EngineError, match="unknown model 'no-such-model'"):
        load_model("no-such-model")
    with pytest.raises(EngineError, match="dtype"):
        load_model("bamba-tiny", dtype="float16")


def test_checkpoint_directory_round_trip(tmp_path):
    original = load_model("nemotron_h-tiny")
    original.module.save_pretrained(tmp_path)
    loaded = load_model(tmp_path)
    assert loaded.spec.kv_bytes_per_token == original.spec.kv_bytes_per_token
    assert loaded.spec.ssm_checkpoint_bytes == original.spec.ssm_checkpoint_bytes
    ids = torch.arange(40) * 7
    a = original.forward(original.new_cache(), ids, 0, keep_logits=0)
    b = loaded.forward(loaded.new_cache(), ids, 0, keep_logits=0)
    assert torch.equal(a, b)


def test_bad_checkpoint_directories(tmp_path):
    with pytest.raises(EngineError, match="has no config.json"):
        load_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(EngineError, match="not valid JSON"):
        load_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "jamba"}))
    with pytest.raises(UnsupportedModelError, match="Mamba-1"):
        load_checkpoint(tmp_path)
    preset_config("bamba-tiny").save_pretrained(tmp_path)  # a config but no weights
    with pytest.raises(EngineError, match="cannot load weights"):
        load_checkpoint(tmp_path)
    with pytest.raises(EngineError, match="not a directory"):
        load_checkpoint(tmp_path / "config.json")


@pytest.mark.parametrize("bad", [[1, 2, 32000], [-3], [[1, 2], [3, 4]], [], [1.0, 2.0], [True, False]])
def test_token_ids_out_of_range_or_malformed(bad):
    model = load_model("lfm2-tiny")
    with pytest.raises(TokenRangeError):
        model.check_tokens(bad)
