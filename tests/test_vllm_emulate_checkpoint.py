"""vllm-align and vLLM 0.32's Mamba-2 prefill checkpoint; a resumed request's lookup past its prompt.

``MambaMixer2`` (Nemotron-H) asks for ``num_prefill_checkpoint_blocks=1``: the prompt's last chunk
is not split at its last block boundary; its state goes to a checkpoint block reserved in the same
step, and the full-sequence admission gate counts that block. Same cached states as the split
prefill, fewer steps, one more block per Mamba group at admission: on a tight pool that decides
which requests run together (the replay's 3.7 pp gap on Nemotron-H came from here). These tests
are vLLM-free; the rules were read off vLLM 0.32's code (``scheduler.py``
``_mamba_block_aligned_split``, ``single_type_kv_cache_manager.py`` ``MambaManager``) and the
validity cases checked against its ``is_mamba_prefill_checkpoint_valid``.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from marconi.core.model import PRESETS, ModelSpec
from marconi.core.registry import ConfigError
from marconi.integrations.common.bench import select_requests
from marconi.integrations.vllm.emulate.engine import VllmAlignEngine
from marconi.integrations.vllm.layout import (VllmLayout, checkpoint_position, is_checkpoint_valid,
                                                      layout_for_spec, prefill_checkpoint_alignment_for)
from marconi.integrations.vllm.emulate.request import RequestState
from marconi.integrations.vllm.emulate.scheduler import VllmAlignScheduler, emulate_closed_loop
from marconi.integrations.vllm.policy import ATTENTION, MAMBA
from marconi.integrations.vllm.replay.run import model_dir

B = 256
KINDS = (MAMBA, MAMBA, ATTENTION)
SPEC = PRESETS["nemotron-h-8b"]


def _engine(num_blocks: int, checkpoint: int | None, eviction: str = "lru", **options: object) -> VllmAlignEngine:
    layout = VllmLayout(block_size=B, num_blocks=num_blocks, group_kinds=KINDS, max_num_batched_tokens=4096,
                        prefill_checkpoint_alignment=checkpoint, **options)
    return VllmAlignEngine(layout, SPEC, eviction=eviction, alpha=0.5)


def _tokens(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 32000, n).astype(np.int32)


def test_vllms_checkpoint_rules() -> None:
    assert checkpoint_position(1000, B) == 768 and checkpoint_position(1024, B) == 768
    assert checkpoint_position(100, B) == 0
    assert is_checkpoint_valid(0, 1000, 768, B, B, 1)
    assert not is_checkpoint_valid(0, 1000, 768, B, B, None)          # no checkpoint blocks (GDN, CPU fix)
    assert not is_checkpoint_valid(768, 1000, 768, B, B, 1)           # the chunk starts at the boundary
    assert is_checkpoint_valid(0, 400, 256, B, B, 1)                  # into column cdiv(400, B) - 2 = 0
    assert not is_checkpoint_valid(256, 400, 256, B, B, 1)
    assert not is_checkpoint_valid(300, 1000, 768, B, B, 1)           # a start off the hash grid
    assert is_checkpoint_valid(512, 1000, 768, B, B, 1) and is_checkpoint_valid(256, 600, 512, B, B, 1)


def test_mamba2_models_get_vllms_checkpoint_alignment() -> None:
    nemotron = ModelSpec.from_hf_config(model_dir("nemotron-h-8b") / "config.json", name="n")
    qwen = ModelSpec.from_hf_config(model_dir("qwen3-next-80b-a3b") / "config.json", name="q")
    assert prefill_checkpoint_alignment_for(nemotron) == 1 and prefill_checkpoint_alignment_for(qwen) is None
    assert layout_for_spec(nemotron, num_blocks=10).prefill_checkpoint_alignment is None    # opt-in
    with pytest.raises(ConfigError, match="prefill_checkpoint_alignment"):
        VllmLayout(block_size=B, num_blocks=10, group_kinds=KINDS, prefill_checkpoint_alignment=0)


def test_the_last_chunk_runs_unsplit_and_caches_the_same_state() -> None:
    """P = 1000: split, [0, 768) then [768, 1000); with the checkpoint one chunk, two blocks per
    Mamba group in that step (columns 2 and 3), column 2 keyed at 768 — the state the split
    prefill caches. A longer sibling hits 768 either way."""
    prompt = _tokens(1, 1000)
    sibling = np.concatenate([prompt, _tokens(2, 300)])
    hits, steps = {}, {}
    for checkpoint in (None, 1):
        engine = _engine(40, checkpoint)
        sched = VllmAlignScheduler(engine)
        a = sched.add(prompt, _tokens(3, 4))
        sched.step()
        steps[checkpoint] = a.state.num_computed_tokens
        if checkpoint:
            for gid in engine.mamba_ids:
                blocks = engine.managers[gid].req_to_blocks[a.state.rid]
                assert [b is engine.pool.null for b in blocks] == [True, True, False, False]
                assert blocks[2].key is not None and blocks[2].depth == 768 and blocks[3].key is None
        while sched.has_requests:
            sched.step()
            sched.check_invariants()
        b = sched.add(sibling, _tokens(4, 2))
        while sched.has_requests:
            sched.step()
        hits[checkpoint] = b.record.hit_len
    assert steps == {None: 768, 1: 1000}
    assert hits == {None: 768, 1: 768}


def test_the_admission_gate_counts_the_checkpoint_block() -> None:
    """The full-sequence gate asks one more block per Mamba group of a request whose prefill
    can checkpoint, so on a tight pool two such requests are not admitted together."""
    prompts = [_tokens(10, 1000), _tokens(11, 1000)]
    for checkpoint, together in ((None, True), (1, False)):
        engine = _engine(14, checkpoint)
        state = RequestState(0, prompts[0], 1000, B)
        need = engine.blocks_needed(state, state.num_tokens, None, 0, admission=True)
        assert need == 4 + len(engine.mamba_ids) * (2 if checkpoint else 1)
        assert not engine.managers[engine.mamba_ids[0]].checkpoints     # the gate records nothing
        sched = VllmAlignScheduler(engine)
        for p in prompts:
            sched.add(p, _tokens(12, 2))
        sched.step()
        assert (len(sched.running) == 2) is together


@pytest.mark.parametrize("checkpoint", [None, 1])
@pytest.mark.parametrize("eviction", ["lru", "marconi"])
def test_concurrency_one_is_the_sequential_engine_with_checkpoints(checkpoint: int | None, eviction: str) -> None:
    spec = ModelSpec.from_hf_config(model_dir("nemotron-h-8b") / "config.json", name="nemotron-h-8b")
    requests = select_requests("swe-sample", max_input_len=8192, num_requests=20).requests
    layout = layout_for_spec(spec, num_blocks=40, block_size=1152, max_num_batched_tokens=8192,
                             prefill_checkpoint_alignment=checkpoint)
    sequential = VllmAlignEngine(layout, spec, eviction=eviction)
    expected = [sequential.run(r.input_tokens, np.asarray(r.output_tokens, dtype=np.int32)) for r in requests]
    looped = VllmAlignEngine(layout, spec, eviction=eviction)
    result = emulate_closed_loop(looped, requests, concurrency=1)
    assert result.records == expected and looped.pool.stats == sequential.pool.stats
    assert sequential.pool.stats.num_evicted > 0 and sequential.hits > 0


def test_checkpoints_keep_the_invariants_under_contention() -> None:
    rng = np.random.default_rng(21)
    shared = _tokens(20, 600)
    requests = [SimpleNamespace(session_id=i % 5, input_tokens=np.concatenate([shared, _tokens(100 + i, int(rng.integers(50, 1500)))]),
                                output_tokens=_tokens(200 + i, int(rng.integers(1, 400)))) for i in range(20)]
    for r in requests:
        r.input_len = len(r.input_tokens)
    for eviction in ("lru", "marconi"):
        result = emulate_closed_loop(_engine(24, 1, eviction), requests, concurrency=6, check=True)
        assert sum(result.num_preemptions) > 0 and result.hits > 0


def test_a_resumed_request_resumes_from_a_state_past_its_prompt() -> None:
    """vLLM bounds the Mamba lookup by the request's hashes, outputs included: a preempted request
    whose junction state (cached before its preemption) lies past its prompt resumes from it."""
    engine = _engine(20, None)
    tokens = _tokens(30, 700)
    state = RequestState(0, tokens, 300, B)       # a 300-token prompt that has produced 400 outputs
    state.num_tokens = 700
    for gid in range(len(KINDS)):                 # the state and KVs at 512, as a junction leaves them
        for depth in (256, 512):
            block = engine.pool.get_new_blocks(1)[0]
            engine.pool.insert_block_hash(block, state.hash_at(depth), gid, depth, None)
            engine.pool.free_blocks([block])
    _, hit, kv_hit = engine.get_computed_blocks(state)
    assert (hit, kv_hit) == (512, 512)
