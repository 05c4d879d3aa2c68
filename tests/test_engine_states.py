"""Payload capture / restore and the PayloadOps the cache core uses on tensors."""

from __future__ import annotations

import pytest

import torch

pytestmark = pytest.mark.usefixtures("one_torch_thread")

from marconi.engine.errors import EngineError
from marconi.engine.models import load_model
from marconi.engine.states import (
    KVPayload,
    TensorPayloads,
    build_cache,
    capture_ssm,
    concat_kv,
    slice_kv,
)


@pytest.fixture(scope="module")
def model():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_model("falcon_h1-tiny", dtype="float64")  # parallel hybrid: KV and state in every layer
    torch.set_num_threads(before)


_LAST_HIDDEN = {}  # id(cache) -> final hidden state of the forward that filled it


def _filled(model, n=30):
    cache = model.new_cache()
    _LAST_HIDDEN[id(cache)] = model.forward_full(cache, torch.arange(n) * 11, 0).hidden
    return cache


def _capture(model, cache, position):
    return capture_ssm(cache, model.layout, position, _LAST_HIDDEN[id(cache)])


def test_capture_is_a_copy(model):
    cache = _filled(model)
    state = _capture(model, cache, 30)
    before = [t.clone() for t in state.conv + state.recurrent + (state.hidden,)]
    model.forward(cache, torch.tensor([5]), 30)  # updates the cache's buffers in place
    assert all(torch.equal(a, b) for a, b in zip(before, state.conv + state.recurrent + (state.hidden,)))
    assert state.hidden.shape == (1, 1, model.config.hidden_size)
    assert state.hidden.untyped_storage().nbytes() == state.hidden.numel() * 8  # not a view of the forward's buffer
    assert not torch.equal(cache.layers[0].recurrent_states[0], state.recurrent[0])


def test_rebuilt_cache_matches_and_never_aliases_payloads(model):
    cache = _filled(model)
    kv = [slice_kv(cache, model.layout, 0, 12), slice_kv(cache, model.layout, 12, 30)]
    state = _capture(model, cache, 30)
    rebuilt = build_cache(model, kv, state)
    assert rebuilt.get_seq_length() == 30
    for i in model.layout.attn_layers:
        assert torch.equal(rebuilt.layers[i].keys, cache.layers[i].keys)
    snapshot = [t.clone() for t in state.conv + state.recurrent + kv[0].keys]
    model.forward(rebuilt, torch.tensor([1, 2, 3]), 30)
    assert all(torch.equal(a, b) for a, b in zip(snapshot, state.conv + state.recurrent + kv[0].keys))


def test_payload_sizes(model):
    cache = _filled(model)
    assert slice_kv(cache, model.layout, 3, 10).nbytes == 7 * model.spec.kv_bytes_per_token
    state = _capture(model, cache, 30)
    assert state.nbytes == model.spec.ssm_checkpoint_bytes
    assert state.hidden.numel() * 8 == model.spec.checkpoint_extra_bytes  # the kept final hidden state
    with pytest.raises(EngineError, match=r"\[1, 1, D\]"):
        capture_ssm(cache, model.layout, 30, torch.zeros(1, 2, model.config.hidden_size, dtype=torch.float64))


def test_split_and_join(model):
    ops = TensorPayloads()
    kv = slice_kv(_filled(model), model.layout, 0, 30)
    first, rest = ops.split_kv(kv, 10)
    assert (first.num_tokens, rest.num_tokens) == (10, 20)
    assert first.nbytes + rest.nbytes == kv.nbytes
    assert first.keys[0].untyped_storage().nbytes() == first.keys[0].numel() * 8  # owns its bytes only
    joined = ops.join_kv(first, rest)
    assert all(torch.equal(a, b) for a, b in zip(joined.keys + joined.values, kv.keys + kv.values))
    ops.release(first)
    assert (ops.num_splits, ops.num_joins, ops.num_released, ops.released_bytes) == (1, 1, 1, first.nbytes)
    with pytest.raises(EngineError):
        ops.split_kv(kv, 30)
    with pytest.raises(EngineError):
        ops.release(123)


def test_inconsistent_payloads_are_refused(model):
    cache = _filled(model)
    kv = slice_kv(cache, model.layout, 0, 30)
    with pytest.raises(EngineError, match="no SSM state"):
        build_cache(model, [kv], None)
    with pytest.raises(EngineError, match="position 30 but the KVs cover 12"):
        build_cache(model, [slice_kv(cache, model.layout, 0, 12)], _capture(model, cache, 30))
    with pytest.raises(EngineError, match="outside"):
        slice_kv(cache, model.layout, 5, 31)
    with pytest.raises(EngineError, match="no state yet"):
        capture_ssm(model.new_cache(), model.layout, 0, torch.zeros(1, 1, model.config.hidden_size))
    assert build_cache(model, [], None).get_seq_length() == 0
    assert concat_kv([kv]) is kv and isinstance(kv, KVPayload)
