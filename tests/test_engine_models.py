"""Loading hybrids: presets, checkpoints, the spec check against real tensors, and clear refusals."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
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
    for empty in ("", "  "):    # Path("") is the current directory: it used to say ". has no config.json"
        with pytest.raises(EngineError, match=r"the model is empty \('\s*'\): use a preset \(bamba-tiny"):
            load_model(empty)
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


# ----------------------------------------------------------------------------- issue 21: bugs 13, 19
@pytest.fixture(scope="module")
def lfm2_checkpoint(tmp_path_factory):
    """A saved lfm2-tiny checkpoint (the cheapest preset), copied per test that breaks it."""
    directory = tmp_path_factory.mktemp("lfm2")
    load_model("lfm2-tiny").module.save_pretrained(directory)
    return directory


def _copy(checkpoint, tmp_path):
    import shutil

    target = tmp_path / "ckpt"
    shutil.copytree(checkpoint, target)
    return target


@pytest.mark.parametrize("text, message", [
    ("[1, 2]", "config.json: expected a JSON object .*got a list$"),
    ('{"text_config": [1]}', "config.json: text_config must be a JSON object .*got a list$"),
    ('{"model_type": ["lfm2"]}', "model_type must be a string naming the architecture, got a list;"),
    ("\xff\xfe", "config.json:1: not valid JSON \\(not UTF-8 text"),
])
def test_a_config_json_that_is_not_an_object_is_a_clear_error(tmp_path, text, message):
    (tmp_path / "config.json").write_bytes(text.encode("latin-1"))
    with pytest.raises(EngineError, match=message):
        load_checkpoint(tmp_path)


def test_a_config_transformers_refuses_names_the_file(lfm2_checkpoint, tmp_path):
    directory = _copy(lfm2_checkpoint, tmp_path)
    cfg = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**cfg, "hidden_size": None}))
    with pytest.raises(EngineError, match="config.json: transformers cannot build a config from it .*hidden_size"):
        load_checkpoint(directory)


@pytest.mark.parametrize("damage, message", [
    (lambda data: b"", "model.safetensors: the weights file is empty"),
    (lambda data: data[:1000], "model.safetensors: not a readable safetensors file"),
    (lambda data: b"\0" * 64, "model.safetensors: not a readable safetensors file"),
])
def test_empty_or_corrupt_safetensors_name_the_file(lfm2_checkpoint, tmp_path, damage, message):
    directory = _copy(lfm2_checkpoint, tmp_path)
    weights = directory / "model.safetensors"
    weights.write_bytes(damage(weights.read_bytes()))
    with pytest.raises(EngineError, match=message):
        load_checkpoint(directory)


def test_a_vocab_size_that_disagrees_with_the_weights_says_which_field_to_fix(lfm2_checkpoint, tmp_path):
    directory = _copy(lfm2_checkpoint, tmp_path)
    cfg = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**cfg, "vocab_size": 1000}))
    with pytest.raises(EngineError, match="shapes disagree with config.json: .*embed_tokens.weight is \\(32000, 64\\) "
                                          "in model.safetensors but \\(1000, 64\\) by the config \\(vocab_size is "
                                          "1000; the checkpoint's vocabulary has 32000 ids: fix vocab_size\\)"):
        load_checkpoint(directory)


@pytest.mark.parametrize("dtype", [np.uint64, np.uint32, np.uint16, np.uint8, np.int16])
def test_unsigned_numpy_token_arrays_are_checked_not_crashed(dtype):
    """Bug 19: torch has no ``min`` for UInt64, so a numpy uint64 id array crashed check_tokens."""
    model = load_model("lfm2-tiny")
    ids = model.check_tokens(np.array([1, 2, 200], dtype=dtype))
    assert ids.dtype == torch.int64 and ids.tolist() == [1, 2, 200]
    read_only = np.array([5, 6], dtype=dtype)
    read_only.flags.writeable = False
    assert model.check_tokens(read_only).tolist() == [5, 6]


def test_unsigned_ids_out_of_range_are_token_range_errors():
    model = load_model("lfm2-tiny")
    with pytest.raises(TokenRangeError, match="token id 32000 is outside the vocabulary \\[0, 32000\\)"):
        model.check_tokens(np.array([1, 32000], dtype=np.uint64))
    with pytest.raises(TokenRangeError, match="fits no vocabulary"):
        model.check_tokens(np.array([2**64 - 1], dtype=np.uint64))
    with pytest.raises(TokenRangeError, match="outside the vocabulary"):
        model.check_tokens(torch.tensor([1, 40000], dtype=torch.uint32))
    assert model.check_tokens(torch.tensor([3, 4], dtype=torch.uint64)).tolist() == [3, 4]
