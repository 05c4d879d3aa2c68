"""Bad input to the library an engine embeds (``PrefixCache``, ``get_model``, the policy factories):
a clear error naming the argument and what it must be, and nothing lost or corrupted.

Each test says what the old code did with the input.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from marconi.core.admission import make_admission
from marconi.core.cache import PrefixCache
from marconi.core.eviction import make_eviction
from marconi.core.model import ModelSpec, SpecError, get_model
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
