"""Bad input to the library an engine embeds (``PrefixCache``, ``get_model``, the policy factories):
a clear error naming the argument and what it must be, and nothing lost or corrupted.

Each test says what the old code did with the input.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

import marconi
from marconi.choosers.family import DEFAULT_RULES, TAILS_RULE_LABELS, FamilyPolicy, parse_rules
from marconi.core.admission import make_admission
from marconi.core.cache import ManualClock, PrefixCache
from marconi.core.eviction import make_eviction
from marconi.core.model import PRESETS, ModelSpec, SpecError, get_model, list_models
from marconi.core.registry import ConfigError


def _cache(**kwargs) -> PrefixCache:
    return PrefixCache("paper-7b", 1e11, "marconi", "flop-aware:alpha=1", **kwargs)


# ------------------------------------------------------------------ constructor arguments
@pytest.mark.parametrize("admission", [None, 3, object()])
def test_an_admission_that_is_no_policy_is_a_config_error_naming_admission(admission):
    """Old: AttributeError "'NoneType' object has no attribute 'caches'" from the constructor."""
    with pytest.raises(ConfigError, match=r"admission must be a policy name \(.*marconi.*\) or an AdmissionPolicy"):
        PrefixCache("paper-7b", 1e10, admission=admission)
    with pytest.raises(ConfigError, match="lacks"):
        make_admission(admission)


@pytest.mark.parametrize("which", ["admission", "eviction"])
def test_an_empty_policy_name_says_which_policy_and_lists_the_names(which):
    """Old: ConfigError "empty name", naming neither the argument nor the choices."""
    with pytest.raises(ConfigError, match=rf"empty {which} policy name; choose one of: .*lru|marconi"):
        PrefixCache("paper-7b", 1e10, **{which: "  "})


@pytest.mark.parametrize("model", [None, 3, b"paper-7b", {"model_type": "bamba"}])
def test_a_model_of_the_wrong_type_is_a_spec_error(model):
    """Old: TypeError "expected str, bytes or os.PathLike object" (a dict: "unhashable type")."""
    with pytest.raises(SpecError, match=r"model must be a ModelSpec, a preset name \(paper-7b"):
        get_model(model)
    with pytest.raises(SpecError, match="model must be"):
        PrefixCache(model, 1e10)


def test_a_dict_model_points_to_from_hf_config():
    with pytest.raises(SpecError, match="ModelSpec.from_hf_config"):
        get_model({"model_type": "bamba"})


def test_an_empty_model_name_is_named_as_empty_not_a_missing_config_json():
    """Old: "no config.json at config.json" (the empty name read as the working directory)."""
    with pytest.raises(SpecError, match="model name is empty: use one of paper-7b") as info:
        get_model("")
    assert "config.json at" not in str(info.value)


def test_a_model_name_too_long_for_a_path_is_an_unknown_model():
    """Old: OSError "[Errno 36] File name too long", with the 5,000-character name in it."""
    with pytest.raises(SpecError, match="unknown model 'x+\\.\\.\\.': use one of") as info:
        get_model("x" * 5000)
    assert len(str(info.value)) < 400


@pytest.mark.parametrize("config", [[1, 2], None, 5])
def test_from_hf_config_of_the_wrong_type_is_a_spec_error(config):
    """Old: TypeError "expected str, bytes or os.PathLike object, not list"."""
    with pytest.raises(SpecError, match="config must be a mapping .*, got"):
        ModelSpec.from_hf_config(config)


def test_a_clock_that_is_not_callable_is_refused_at_construction():
    """Old: accepted; the first begin() raised "TypeError: 'int' object is not callable"."""
    with pytest.raises(ConfigError, match="clock must be None .* or a callable .*got int 5"):
        _cache(clock=5)


def test_payloads_lacking_payload_ops_are_refused_at_construction():
    """Old: accepted; the first finish() raised AttributeError "'int' object has no attribute 'state_at'"."""
    with pytest.raises(ConfigError, match="payloads must be None .* PayloadOps .*int lacks split_kv, join_kv, "
                                          "release, state_at"):
        _cache(payloads=5)

    class HalfOps:
        def split_kv(self, kv, at):
            return kv, kv

    with pytest.raises(ConfigError, match="HalfOps lacks join_kv, release, state_at"):
        _cache(payloads=HalfOps())


# ------------------------------------------------------------------ the clock's values
@pytest.mark.parametrize("bad", [math.nan, math.inf, "x", None])
def test_a_clock_returning_no_finite_number_fails_begin_and_locks_nothing(bad):
    """Old: NaN was stored as every node's recency (silently: NaN never compares, so evictions ranked
    by recency were arbitrary); text failed deep in NumPy ("could not convert string to float")."""
    now = [0.0]
    cache = _cache(clock=lambda: now[0])
    cache.process([1, 2, 3], [4])
    used = cache.used_bytes
    now[0] = bad
    with pytest.raises(ValueError, match="the cache's clock returned .*: it must return the time as a finite number"):
        cache.begin([1, 2, 3, 5])
    assert cache.num_in_flight == 0
    cache.check_invariants()
    assert cache.used_bytes == used
    now[0] = 1.0
    match, result = cache.process([1, 2, 3, 5], [6])
    assert match.kv_hit_len == 3 and result.cached
    cache.check_invariants()


def test_a_clock_going_bad_between_begin_and_finish_ends_the_request_as_an_abort():
    now = [0.0]
    cache = _cache(clock=lambda: now[0])
    handle = cache.begin([7, 8, 9])
    now[0] = math.nan
    with pytest.raises(ValueError, match="clock returned float nan"):
        cache.finish(handle, [1])
    assert cache.num_in_flight == 0 and not handle.active and cache.used_bytes == 0
    cache.check_invariants()
    assert cache.tree.walk(np.array([7, 8, 9], dtype=np.int32)).matched_len == 0  # nothing inserted


# ------------------------------------------------------------------ tokens


def test_a_clock_going_backwards_fails_begin_before_anything_changes():
    """Old: a time below the previous one was stored as the touched nodes' recency, so what a request
    just used ranked as older than what it used before (a wall clock stepped back by an adjustment)."""
    now = [5.0]
    cache = _cache(clock=lambda: now[0])
    cache.process([1, 2, 3], [4])
    used, lookups = cache.used_bytes, cache.stats.num_requests
    now[0] = 4.0
    with pytest.raises(ValueError, match=r"the cache's clock went backwards: it returned 4\.0 after 5\.0; pass a "
                                         r"monotone clock \(time\.monotonic"):
        cache.begin([1, 2, 3, 5])
    assert cache.num_in_flight == 0 and cache.used_bytes == used and cache.stats.num_requests == lookups
    cache.check_invariants()
    now[0] = 5.0                      # the same time again is not going back
    match, result = cache.process([1, 2, 3, 5], [6])
    assert match.kv_hit_len == 3 and result.cached


def test_a_clock_going_backwards_between_begin_and_finish_ends_the_request_as_an_abort():
    now = [2.0]
    cache = _cache(clock=lambda: now[0])
    handle = cache.begin([7, 8, 9])
    now[0] = 1.0
    with pytest.raises(ValueError, match="clock went backwards: it returned 1.0 after 2.0"):
        cache.finish(handle, [1])
    assert cache.num_in_flight == 0 and not handle.active and cache.used_bytes == 0
    cache.check_invariants()
@pytest.mark.parametrize("tokens,got", [
    ([[1], [1, 2]], "list that NumPy cannot read as an array"),
    (None, "NoneType None"),
    ("abc", "str 'abc'"),
    (5, "int 5"),
])
def test_input_tokens_that_are_no_1d_sequence_name_input_tokens_and_what_came(tokens, got):
    """Old: a ragged list raised NumPy's own "setting an array element with a sequence", naming no
    argument; None, a string or an int said only "got shape ()"."""
    cache = _cache()
    with pytest.raises(ValueError, match="input_tokens must be a 1-D sequence of token ids, got " + got):
        cache.begin(tokens)
    assert cache.num_in_flight == 0
    cache.check_invariants()


def test_output_tokens_that_are_ragged_name_output_tokens_and_abort_the_request():
    cache = _cache()
    handle = cache.begin([1, 2, 3])
    with pytest.raises(ValueError, match="output_tokens must be a 1-D sequence of token ids, got list that NumPy"):
        cache.finish(handle, [[1], [2, 3]])
    assert cache.num_in_flight == 0
    cache.check_invariants()


# ------------------------------------------------------------------ handles
@pytest.mark.parametrize("method", ["finish", "abort", "cached_prefix", "finish_checkpoints"])
@pytest.mark.parametrize("handle", [None, "x", 0])
def test_a_handle_that_is_no_request_handle_is_a_type_error_naming_handle(method, handle):
    """Old: AttributeError "'NoneType' object has no attribute 'active'"."""
    cache = _cache()
    live = cache.begin([1, 2, 3])
    with pytest.raises(TypeError, match="handle must be the RequestHandle this cache's begin\\(\\) returned, got"):
        getattr(cache, method)(handle)
    assert cache.num_in_flight == 1  # the live request is untouched
    cache.finish(live, [4])
    cache.check_invariants()


def test_a_handle_from_another_cache_says_so_and_changes_neither_cache():
    """Old: "not in flight in this cache (finished or aborted)" for a request that was neither."""
    one, two = _cache(), _cache()
    mine = one.begin([9, 9, 9])
    theirs = two.begin([9, 9, 9])  # the same request id in the other cache
    assert mine.request_id == theirs.request_id
    with pytest.raises(ValueError, match="not in flight in this cache \\(begun by another PrefixCache"):
        two.finish(mine, [1])
    assert one.num_in_flight == 1 and two.num_in_flight == 1 and mine.active and theirs.active
    one.finish(mine, [1])
    two.finish(theirs, [1])
    one.check_invariants()
    two.check_invariants()


def test_finishing_a_handle_twice_still_says_finished_or_aborted():
    cache = _cache()
    handle = cache.begin([1, 2])
    cache.finish(handle, [3])
    with pytest.raises(ValueError, match="not in flight in this cache \\(finished or aborted\\)"):
        cache.finish(handle, [3])
    cache.check_invariants()


# ------------------------------------------------------------------ the factories' existing refusals stay
@pytest.mark.parametrize("name", ["flop-aware:alpha=-1", "flop-aware:alpha=nan", "flop-aware:alpha=abc",
                                  "flop-aware:alpha=1,alpha=2", "flop-aware:alpha="])
def test_bad_eviction_parameters_are_config_errors_naming_alpha(name):
    with pytest.raises(ConfigError, match="alpha"):
        make_eviction(name)


# ------------------------------------------------------------------ masked arrays as tokens
_MASKED = "must be a 1-D sequence of token ids, got a NumPy masked array"


def test_a_masked_array_of_input_tokens_is_refused_and_locks_nothing():
    """Old: accepted; the mask was dropped, so the masked id 2 was looked up and cached as a token."""
    cache = PrefixCache("nemotron-h-8b", 10e9)
    with pytest.raises(ValueError, match=r"input_tokens " + _MASKED + r" \[1, None, 3, 4\] \(1 of 4 ids masked, "
                                         r"shown as None\): masked arrays are not token lists; fill or compress"):
        cache.begin(np.ma.masked_array([1, 2, 3, 4], mask=[0, 1, 0, 0]))
    with pytest.raises(ValueError, match=r"input_tokens " + _MASKED + r" \[1, None\]"):
        cache.process(np.ma.masked_array([1, 2], mask=[0, 1]), [5])
    assert cache.num_in_flight == 0 and cache.used_bytes == 0
    cache.check_invariants()


def test_a_masked_array_with_nothing_masked_is_refused_too():
    """A masked array is no token list whatever its mask: its data is read only once filled or compressed."""
    with pytest.raises(ValueError, match=r"input_tokens " + _MASKED + r" \[1, 2, 3\] \(none masked\)"):
        _cache().begin(np.ma.masked_array([1, 2, 3]))


def test_masked_output_tokens_end_the_request_as_an_abort_and_insert_nothing():
    """Old: finish() inserted the masked id 8 as if it were a token."""
    cache = _cache()
    handle = cache.begin([1, 2, 3])
    masked = np.ma.masked_array([7, 8], mask=[0, 1])
    with pytest.raises(ValueError, match=r"output_tokens " + _MASKED + r" \[7, None\]"):
        cache.finish_checkpoints(handle, masked)
    assert handle.active  # a dry run: the request stays in flight
    with pytest.raises(ValueError, match=r"output_tokens " + _MASKED):
        cache.finish(handle, masked)
    assert cache.num_in_flight == 0 and not handle.active and cache.used_bytes == 0
    cache.check_invariants()


def test_a_masked_array_in_a_snapshot_is_a_config_error_naming_the_node():
    cache = PrefixCache("paper-7b", 1e11, "marconi", "flop-aware:alpha=1", clock=ManualClock())
    cache.process([1, 2, 3, 4], [5])
    snapshot = cache.snapshot()
    snapshot.tokens[0] = np.ma.masked_array(snapshot.tokens[0])
    with pytest.raises(ConfigError, match=r"snapshot.tokens\[0\] " + _MASKED):
        PrefixCache.from_snapshot(snapshot, "paper-7b", 1e11, "marconi", "flop-aware:alpha=1", clock=ManualClock())


@pytest.mark.parametrize("bad", [5, None])
def test_checkpoint_positions_that_are_no_list_are_a_config_error_naming_the_node(bad):
    """Old: a bare TypeError ('int' object is not iterable)."""
    cache = PrefixCache("paper-7b", 1e11, "marconi", "lru", clock=ManualClock())
    cache.process([1, 2, 3, 4], [5])
    snapshot = cache.snapshot()
    snapshot.ckpt_positions[0] = bad
    with pytest.raises(ConfigError, match=r"snapshot.ckpt_positions\[0\] = .*: expected a list of positions"):
        PrefixCache.from_snapshot(snapshot, "paper-7b", 1e11, "marconi", "lru", clock=ManualClock())


@pytest.mark.parametrize("eviction", ["lru", "flop-aware", "worlds"])
def test_set_rule_takes_a_label_and_refuses_what_is_no_rule_with_a_config_error(eviction):
    """Old: a label or None was an AttributeError raised while writing the error message."""
    cache = PrefixCache("paper-7b", 1e10, "marconi", eviction)
    with pytest.raises(ConfigError, match="an eviction rule or its label"):
        cache.set_rule(None)
    if eviction == "worlds":
        cache.set_rule("a2m")                                # a label of the family: now live
        assert cache.eviction.rule.label() == "a2m"
        with pytest.raises(ConfigError, match="not of the family"):
            cache.set_rule("a1")
    elif eviction == "lru":
        with pytest.raises(ConfigError, match="applies one fixed rule"):
            cache.set_rule("a1")


def test_filled_or_compressed_masked_arrays_and_plain_arrays_still_work():
    masked = np.ma.masked_array([1, 2, 3, 4], mask=[0, 1, 0, 0])
    cache = _cache()
    match, result = cache.process(masked.compressed(), [5])
    assert match.input_len == 3 and result.cached
    match, _ = cache.process(masked.filled(0), np.array([6], dtype=np.int64))
    assert (match.input_len, match.kv_hit_len) == (4, 1)
    match, _ = cache.process(np.array([1, 3, 4, 5]), [7])
    assert match.kv_hit_len == 4
    cache.check_invariants()


# ------------------------------------------------------------------ rule families
@pytest.mark.parametrize("text, position", [("a2m/", "2 of 2"), ("lru//a2m", "2 of 3"), ("/a2m", "1 of 2"),
                                            ("lru/ /a2m", "2 of 3"), ("/", "1 of 2")])
def test_a_rule_family_with_an_empty_label_is_a_config_error_naming_it(text, position):
    """Old: the empty label was skipped, so "a2m/" was the one-rule family a2m ("/" alone was
    "the adaptive rule family is empty")."""
    message = (rf"the adaptive rule family '{text}' has an empty label at position {position} \(a leading, "
               r"trailing or doubled '/'\): write labels separated by single '/', e\.g\. lru/a0\.5m/a2m")
    with pytest.raises(ConfigError, match=message):
        parse_rules(text)
    with pytest.raises(ConfigError, match="has an empty label"):
        FamilyPolicy(text)


def test_the_rule_families_the_project_uses_still_parse():
    assert [r.label() for r in DEFAULT_RULES] == ["lru", "a0.5m", "a2m"]
    assert parse_rules("default") == parse_rules(" default ") == parse_rules("lru/a0.5m/a2m") == DEFAULT_RULES
    assert [r.label() for r in parse_rules(TAILS_RULE_LABELS)] == ["lru", "a0.5m", "a0.5mt", "a2m"]
    assert [r.label() for r in parse_rules(" lru / a2m ")] == ["lru", "a2m"]  # spaces around a label still do
    for text in ("", "  "):
        with pytest.raises(ConfigError, match="the adaptive rule family is empty"):
            parse_rules(text)


def test_a_family_naming_one_decision_twice_is_refused():
    """α = 0 ignores the efficiency, so ``a0`` and ``a0m`` are one rule (both label as ``a0``): a
    family of both spent a world on a copy of the live rule."""
    with pytest.raises(ConfigError, match=r"lists a rule twice: \['a0', 'a0'\]"):
        parse_rules("a0/a0m")


# ------------------------------------------------------------------ attention heads
def _bamba_config(**change) -> dict:
    return {"model_type": "bamba", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 16, "attn_layer_indices": [1], "mamba_n_heads": 4,
            "mamba_d_head": 16, "mamba_d_state": 8, "torch_dtype": "float32", **change}


@pytest.mark.parametrize("kv", [5, 3, 64])
def test_attention_heads_that_kv_heads_do_not_divide_are_a_spec_error_naming_the_file_and_fields(tmp_path, kv):
    """Old: accepted; the spec kept kv KV heads that grouped-query attention cannot have."""
    message = (rf"num_attention_heads = 32 is not a multiple of num_key_value_heads = {kv}: grouped-query "
               r"attention shares each KV head among an equal number of query heads; give a num_key_value_heads "
               r"that divides num_attention_heads")
    with pytest.raises(SpecError, match=r"config of model_type 'bamba': " + message):
        ModelSpec.from_hf_config(_bamba_config(num_key_value_heads=kv))
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_bamba_config(num_key_value_heads=kv)))
    for load in (lambda: ModelSpec.from_hf_config(tmp_path), lambda: get_model(str(path))):
        with pytest.raises(SpecError, match=re.escape(str(path)) + r" of model_type 'bamba': " + message):
            load()
    with pytest.raises(SpecError, match=message):
        PrefixCache(str(path), 1e10)


def test_zamba2_shared_attention_heads_are_checked_too():
    config = {"model_type": "zamba2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 3, "layers_block_type": ["mamba", "hybrid"]}
    with pytest.raises(SpecError, match="model_type 'zamba2': num_attention_heads = 4 is not a multiple of "
                                        "num_key_value_heads = 3"):
        ModelSpec.from_hf_config(config)
    assert ModelSpec.from_hf_config({**config, "num_key_value_heads": 2}).num_kv_heads == 2


@pytest.mark.parametrize("kv, expected", [(8, 8), (1, 1), (32, 32), (None, 32)])
def test_kv_heads_dividing_the_attention_heads_still_load(kv, expected):
    assert ModelSpec.from_hf_config(_bamba_config(num_key_value_heads=kv)).num_kv_heads == expected


def test_every_preset_and_bundled_config_still_loads():
    assert [spec.name for spec in list_models()] == list(PRESETS)
    configs = sorted((Path(marconi.__file__).parent / "data" / "configs").glob("*/config.json"))
    assert configs
    for config in configs:
        spec = get_model(str(config.parent))
        assert spec.num_attn_layers and spec.num_kv_heads


def test_a_nemotron_pattern_with_unknown_layer_letters_is_a_spec_error_naming_them():
    """Old: the letters were not counted, so "Zq*" became a one-layer transformer (audit)."""
    config = {"model_type": "nemotron_h", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "mamba_num_heads": 4, "mamba_head_dim": 16, "n_groups": 1, "ssm_state_size": 16}
    assert ModelSpec.from_hf_config({**config, "hybrid_override_pattern": "M-*-"}).num_ssm_layers == 1
    with pytest.raises(SpecError, match=r"unknown layer letters \['Z', 'q'\]"):
        ModelSpec.from_hf_config({**config, "hybrid_override_pattern": "Zq*"})
