"""The float64 scan patch: faithful to upstream in float32, float64 end to end, scoped, and needed."""

from __future__ import annotations

import importlib
import threading

import pytest

import torch

pytestmark = pytest.mark.usefixtures("one_torch_thread")



from marconi.engine import precision
from marconi.engine.models import load_model
from marconi.engine.states import build_cache, capture_ssm, slice_kv

MAMBA2 = importlib.import_module(precision.PATCHED_MODULES["bamba"])
DELTANET = importlib.import_module(precision.PATCHED_MODULES["qwen3_next"])


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _mamba2_inputs(dtype, seq=37, heads=4, head_dim=8, groups=2, state=6, seed=0):
    g = _gen(seed)
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=dtype)
    return dict(hidden_states=r(1, seq, heads, head_dim), dt=r(1, seq, heads), A=-torch.rand(heads, generator=g) * 4,
                B=r(1, seq, groups, state), C=r(1, seq, groups, state), chunk_size=8, D=r(heads),
                dt_bias=r(heads), initial_states=r(1, heads, head_dim, state), dt_softplus=True,
                return_final_states=True)


def _deltanet_inputs(dtype, seq=37, hk=2, hv=4, dk=8, dv=8, seed=0):
    g = _gen(seed)
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=dtype)
    return dict(query=r(1, seq, hk, dk), key=r(1, seq, hk, dk), value=r(1, seq, hv, dv),
                g=-torch.rand(1, seq, hv, generator=g, dtype=dtype), beta=torch.rand(1, seq, hv, generator=g, dtype=dtype),
                initial_state=r(1, hv, dk, dv), output_final_state=True, use_qk_l2norm_in_kernel=True)


def _assert_same(a, b):
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and torch.equal(x, y)


class TestFaithfulToUpstream:
    """In float32 our copies must give upstream's exact bits (they only change the compute dtype)."""

    def test_chunk_scan(self):
        args = _mamba2_inputs(torch.float32)
        _assert_same(precision.chunk_scan(**args, compute_dtype=torch.float32), MAMBA2.mamba2_chunk_scan(**args))

    def test_chunk_scan_without_initial_state(self):
        args = {**_mamba2_inputs(torch.float32, seq=16), "initial_states": None}
        _assert_same(precision.chunk_scan(**args, compute_dtype=torch.float32), MAMBA2.mamba2_chunk_scan(**args))

    def test_selective_state_update(self):
        g = _gen(1)
        heads, head_dim, groups, state = 4, 8, 2, 6
        base = dict(hidden_states=torch.randn(1, heads, head_dim, generator=g),
                    dt=torch.randn(1, heads, head_dim, generator=g),
                    A=-torch.rand(heads, head_dim, state, generator=g), B=torch.randn(1, groups, state, generator=g),
                    C=torch.randn(1, groups, state, generator=g), D=torch.randn(heads, head_dim, generator=g),
                    dt_bias=torch.randn(heads, head_dim, generator=g), dt_softplus=True)
        s0 = torch.randn(1, heads, head_dim, state, generator=g)
        s1, s2 = s0.clone(), s0.clone()
        ours = precision.selective_state_update(s1, **base, compute_dtype=torch.float32)
        theirs = MAMBA2.mamba2_selective_state_update(s2, **base)
        _assert_same(ours, theirs)
        _assert_same(s1, s2)

    def test_chunk_gated_delta_rule(self):
        args = _deltanet_inputs(torch.float32)
        ours = precision.chunk_gated_delta_rule(**args, chunk_size=16, compute_dtype=torch.float32)
        _assert_same(ours, DELTANET.torch_chunk_gated_delta_rule(**args, chunk_size=16))

    def test_recurrent_gated_delta_rule(self):
        args = _deltanet_inputs(torch.float32, seq=5)
        ours = precision.recurrent_gated_delta_rule(**args, compute_dtype=torch.float32)
        _assert_same(ours, DELTANET.torch_recurrent_gated_delta_rule(**args))


class TestFloat64:
    def test_upstream_scans_drop_to_float32(self):
        # The reason for the patch: a float64 input comes back with a float32 state.
        _, state = MAMBA2.mamba2_chunk_scan(**_mamba2_inputs(torch.float64))
        assert state.dtype == torch.float32
        _, state = DELTANET.torch_chunk_gated_delta_rule(**_deltanet_inputs(torch.float64))
        assert state.dtype == torch.float32

    def test_patched_scans_stay_float64_and_match_a_float64_reference(self):
        args = _mamba2_inputs(torch.float64)
        with precision.float64_scans("bamba"):
            out, state = MAMBA2.mamba2_chunk_scan(**args)
        assert out.dtype == state.dtype == torch.float64
        # chunk grid must not matter in float64: chunk 37 (one chunk) vs chunk 8
        ref_out, ref_state = precision.chunk_scan(**{**args, "chunk_size": 37}, compute_dtype=torch.float64)
        assert (out - ref_out).abs().max().item() < 1e-12
        assert (state - ref_state).abs().max().item() < 1e-12

    def test_float32_inputs_still_go_upstream_inside_the_block(self):
        args = _mamba2_inputs(torch.float32)
        expected = MAMBA2.mamba2_chunk_scan(**args)
        with precision.float64_scans("bamba"):
            _assert_same(MAMBA2.mamba2_chunk_scan(**args), expected)

    def test_swap_is_scoped_and_reentrant(self):
        originals = {name: getattr(MAMBA2, name) for name in ("mamba2_chunk_scan", "mamba2_selective_state_update")}
        with precision.float64_scans("bamba"):
            inner = MAMBA2.mamba2_chunk_scan
            assert inner is not originals["mamba2_chunk_scan"]
            with precision.float64_scans("bamba"):
                assert MAMBA2.mamba2_chunk_scan is inner
            assert MAMBA2.mamba2_chunk_scan is inner
        for name, fn in originals.items():
            assert getattr(MAMBA2, name) is fn
        with precision.float64_scans("lfm2"):  # no scan to patch: a no-op
            pass

    def test_swap_stays_while_any_thread_is_inside(self):
        """Thread A enters, thread B enters, A leaves while B is still inside: B must keep the
        float64 scans (before the reference count, A's exit restored upstream under B)."""
        original = MAMBA2.mamba2_chunk_scan
        a_inside, b_inside, a_left = threading.Event(), threading.Event(), threading.Event()
        seen: dict[str, bool] = {}

        def a() -> None:
            with precision.float64_scans("bamba"):
                a_inside.set()
                assert b_inside.wait(10)
            a_left.set()

        def b() -> None:
            assert a_inside.wait(10)
            with precision.float64_scans("bamba"):
                b_inside.set()
                assert a_left.wait(10)
                seen["patched after A left"] = MAMBA2.mamba2_chunk_scan is not original
                args = _mamba2_inputs(torch.float64)
                seen["float64 state"] = MAMBA2.mamba2_chunk_scan(**args)[1].dtype == torch.float64

        threads = [threading.Thread(target=a), threading.Thread(target=b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert seen == {"patched after A left": True, "float64 state": True}
        assert MAMBA2.mamba2_chunk_scan is original  # the last one out restored upstream

    @pytest.mark.parametrize("preset", ["bamba-tiny", "qwen3_next-tiny"])
    def test_patch_is_what_makes_float64_splits_exact(self, preset, monkeypatch):
        model = load_model(preset, dtype="float64")
        ids = torch.randint(0, model.vocab_size, (90,), generator=_gen(3))
        split = 37  # not a chunk boundary (chunks of 16 / 64)

        def split_error() -> float:
            full = model.forward(model.new_cache(), ids, 0, keep_logits=0)
            head = model.new_cache()
            hidden = model.forward_full(head, ids[:split], 0).hidden
            resumed = build_cache(model, [slice_kv(head, model.layout, 0, split)],
                                  capture_ssm(head, model.layout, split, hidden))
            tail = model.forward(resumed, ids[split:], split, keep_logits=0)
            return (full[split:] - tail).abs().max().item()

        assert split_error() <= 1e-12
        monkeypatch.setattr(precision, "PATCHED_MODULES", {})  # the engine without the patch
        assert split_error() > 1e-10
