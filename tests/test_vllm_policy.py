"""The plugin's eviction decision (marconi.integrations.vllm.policy) and its configuration, without vLLM."""

from __future__ import annotations

import numpy as np
import pytest

from marconi.choosers.family import parse_rules
from marconi.core.candidates import flop_efficiency
from marconi.core.eviction import EvictionRule
from marconi.core.model import ModelSpec, get_model
from marconi.core.registry import ConfigError
from marconi.integrations.common.alpha import FixedAlpha, RequestObservation
from marconi.integrations.vllm.config import PluginConfig
from marconi.integrations.vllm.layout import layout_for_spec, pool_capacity_bytes
from marconi.integrations.vllm.models import PRESETS
from marconi.integrations.vllm.policy import ATTENTION, MAMBA, BlockEvictionState, block_rule, parent_depth
from marconi.integrations.vllm.shadow import PoolShadowAlpha

SPEC = get_model("paper-7b")
B = 16
KINDS = (MAMBA, MAMBA, ATTENTION)        # two Mamba groups, one attention group (vLLM's order)


def _state(alpha: float = 0.0, num_blocks: int = 64) -> BlockEvictionState:
    return BlockEvictionState(SPEC, KINDS, num_blocks, B, FixedAlpha(alpha))


class Chain:
    """Cache a chain of blocks like vLLM does: attention blocks for every block, states where asked."""

    def __init__(self, state: BlockEvictionState, name: str, start_id: int) -> None:
        self.state, self.name, self.next_id = state, name, start_id
        self.attn: dict[int, int] = {}     # depth -> block id
        self.mamba: dict[int, list[int]] = {}

    def prefix(self, depth: int) -> str:
        return f"{self.name}:{depth}"

    def add(self, num_blocks: int, states: tuple[int, ...] = (), shared_with: "Chain | None" = None,
            shared_depth: int = 0) -> "Chain":
        for i in range(1, num_blocks + 1):
            depth = i * B
            if shared_with is not None and depth <= shared_depth:
                continue
            parent = parent_depth(depth, B)
            if shared_with is not None and parent and parent <= shared_depth:
                parent_prefix = shared_with.prefix(parent)
            else:
                parent_prefix = self.prefix(parent) if parent else None
            self.attn[depth] = self._cache(self.prefix(depth), 2, depth, parent_prefix)
            if depth in states:
                self.mamba[depth] = [self._cache(self.prefix(depth), g, depth, parent_prefix) for g in (0, 1)]
        return self

    def _cache(self, prefix: str, group: int, depth: int, parent: str | None) -> int:
        block = self.next_id
        self.next_id += 1
        self.state.cached(block, prefix, group, depth, parent)
        return block

    def release_all(self) -> None:
        """Free the chain's blocks tail first (vLLM's free order)."""
        for depth in sorted(self.attn, reverse=True):
            for block in self.mamba.get(depth, []):
                self.state.released(block)
            self.state.released(self.attn[depth])


def test_only_chain_ends_and_states_are_candidates() -> None:
    st = _state()
    chain = Chain(st, "a", 1).add(4, states=(32, 64))
    chain.release_all()
    cand = {b for b in range(64) if st.candidate[b] and st.free_cached[b]}
    # The attention leaf (depth 64) and the states are candidates; inner attention blocks are not.
    assert chain.attn[64] in cand
    assert all(b in cand for b in chain.mamba[32] + chain.mamba[64])
    assert not any(chain.attn[d] in cand for d in (16, 32, 48))
    st.check_invariants()


def test_alpha_zero_evicts_least_recently_released_candidate() -> None:
    st = _state(alpha=0.0)
    old = Chain(st, "old", 1).add(2, states=(32,))
    new = Chain(st, "new", 20).add(2, states=(32,))
    old.release_all()
    new.release_all()
    victim = st.next_victim()
    assert victim is not None and victim.block_id in (old.attn[32], *old.mamba[32])
    # the most recently released candidate of the old chain goes first... (ties: least recent)
    assert victim.block_id == min((old.attn[32], *old.mamba[32]), key=lambda b: st.release_seq[b])


def test_large_alpha_keeps_the_deep_prefix() -> None:
    """A deep prefix saves more FLOPs per byte: with a large alpha it outlives a fresher shallow one."""
    st = _state(alpha=100.0)
    deep = Chain(st, "deep", 1).add(16, states=(256,))
    shallow = Chain(st, "shallow", 40).add(1, states=(16,))
    deep.release_all()
    shallow.release_all()
    assert flop_efficiency(SPEC, 256, B, True, "total") > flop_efficiency(SPEC, 16, B, True, "total")
    victim = st.next_victim()
    assert victim.block_id in (shallow.attn[16], *shallow.mamba[16])


def test_duplicates_orphans_and_dead_kv_are_worthless() -> None:
    st = _state(alpha=1.0)
    chain = Chain(st, "a", 1).add(3, states=(32,))        # KVs at 48 lie past the last state: dead
    chain.release_all()
    assert st.flop_eff[chain.attn[48]] == 0.0 and st.candidate[chain.attn[48]]
    assert st.next_victim().reason == "dead"
    # A second block under an existing hash (vLLM does not deduplicate) is a dead duplicate.
    st.cached(60, chain.prefix(32), 2, 32, chain.prefix(16))
    st.released(60)
    assert st.flop_eff[60] == 0.0 and st.candidate[60]
    # Dropping one Mamba group's state orphans the other: nothing can hit there any more.
    st.taken(chain.mamba[32][0])
    st.uncached(chain.mamba[32][0], chain.prefix(32), 0)
    assert st.flop_eff[chain.mamba[32][1]] == 0.0
    st.check_invariants()


def test_branch_point_state_is_kept_while_two_children_continue() -> None:
    """Paper §4.2: a node with two children is never a candidate; one child left, it is."""
    st = _state()
    trunk = Chain(st, "t", 1).add(2, states=(32,))
    left = Chain(st, "l", 10).add(4, states=(64,), shared_with=trunk, shared_depth=32)
    right = Chain(st, "r", 30).add(4, states=(64,), shared_with=trunk, shared_depth=32)
    for chain in (trunk, left, right):
        chain.release_all()
    assert not st.candidate[trunk.mamba[32][0]]
    for depth in sorted(right.attn, reverse=True):        # evict the right branch entirely
        for block in right.mamba.get(depth, []) + [right.attn[depth]]:
            st.taken(block)
            st.uncached(block, right.prefix(depth), 2 if block == right.attn[depth] else right.mamba[depth].index(block))
    assert st.candidate[trunk.mamba[32][0]]
    st.check_invariants()


def test_taken_blocks_are_never_victims_and_empty_pool_has_none() -> None:
    st = _state()
    chain = Chain(st, "a", 1).add(1, states=(16,))
    assert st.next_victim() is None                          # cached but in use: not free
    chain.release_all()
    for block in (chain.attn[16], *chain.mamba[16]):
        st.taken(block)
    assert st.next_victim() is None


def test_alpha_sources() -> None:
    with pytest.raises(ConfigError):
        FixedAlpha(-1)
    with pytest.raises(ConfigError):
        FixedAlpha(float("nan"))
    src = FixedAlpha(2.5)
    event = RequestObservation(np.arange(100), np.arange(3), 64, 0)
    src.observe(event)
    assert (src.alpha(), src.efficiency(), event.input_len) == (2.5, None, 100)


class _CountingSource:
    def __init__(self, spec: object, config: object) -> None:
        self.seen = 0

    def alpha(self) -> float:
        return float(self.seen)

    def efficiency(self) -> str | None:
        return None

    def observe(self, event: RequestObservation) -> None:
        assert len(event.prompt_token_ids) == event.input_len > 0
        self.seen += 1


def test_plugin_config_from_env_and_alpha_source_factory() -> None:
    assert PluginConfig.from_env({}).policy is None
    cfg = PluginConfig.from_env({"MARCONI_VLLM_POLICY": "Marconi", "MARCONI_VLLM_ALPHA": "0.5",
                                 "MARCONI_VLLM_EFFICIENCY": "marginal"})
    assert (cfg.policy, cfg.alpha, cfg.efficiency) == ("marconi", 0.5, "marginal")
    assert PluginConfig.from_env(cfg.to_env()) == cfg
    for bad in ({"MARCONI_VLLM_POLICY": "fifo"}, {"MARCONI_VLLM_ALPHA": "x"}, {"MARCONI_VLLM_ALPHA": "-1"},
                {"MARCONI_VLLM_EFFICIENCY": "x"}, {"MARCONI_VLLM_ALPHA_SOURCE": "nocolon"},
                {"MARCONI_VLLM_MAMBA2_CPU_FIX": "maybe"}):
        with pytest.raises(ConfigError):
            PluginConfig.from_env(bad)
    src = PluginConfig(policy="marconi", alpha_source=f"{__name__}:_CountingSource").make_alpha_source(SPEC)
    src.observe(RequestObservation(np.arange(10), (), 0, 0))
    assert src.alpha() == 1.0
    with pytest.raises(ConfigError, match="cannot load"):
        PluginConfig(policy="marconi", alpha_source="no.such.module:f").make_alpha_source(SPEC)
    with pytest.raises(ConfigError, match="lacks efficiency"):
        PluginConfig(policy="marconi", alpha_source=f"{__name__}:_NoEfficiency").make_alpha_source(SPEC)


class _NoEfficiency:
    def __init__(self, spec: object, config: object) -> None:
        pass

    def alpha(self) -> float:
        return 0.0

    def observe(self, event: RequestObservation) -> None:
        pass


def test_plugin_config_adaptive() -> None:
    """MARCONI_VLLM_ALPHA=adaptive: adaptive Marconi's source, its family from
    MARCONI_VLLM_ADAPTIVE_RULES; round-trips through the environment; clashes are errors."""
    cfg = PluginConfig.from_env({"MARCONI_VLLM_POLICY": "marconi", "MARCONI_VLLM_ALPHA": "Adaptive"})
    assert cfg.adaptive and cfg.alpha == "adaptive" and cfg.adaptive_rules == "default"
    assert PluginConfig.from_env(cfg.to_env()) == cfg
    assert isinstance(cfg.make_alpha_source(SPEC), PoolShadowAlpha)
    assert cfg.make_alpha_source(SPEC) is not cfg.make_alpha_source(SPEC)        # stateful: one per pool
    ruled = PluginConfig.from_env({"MARCONI_VLLM_POLICY": "marconi", "MARCONI_VLLM_ALPHA": "adaptive",
                                   "MARCONI_VLLM_ADAPTIVE_RULES": "lru/a1m"})
    assert [r.label() for r in ruled.make_alpha_source(SPEC).rules] == ["lru", "a1m"]
    assert PluginConfig.from_env(ruled.to_env()) == ruled
    for bad, match in (({"MARCONI_VLLM_ALPHA": "adaptive", "MARCONI_VLLM_EFFICIENCY": "marginal"}, "choose the efficiency"),
                       ({"MARCONI_VLLM_ALPHA": "adaptive", "MARCONI_VLLM_ALPHA_SOURCE": "m:f"}, "keep one"),
                       ({"MARCONI_VLLM_ALPHA": "adaptive", "MARCONI_VLLM_ADAPTIVE_RULES": "lru/a1mi"}, "no counterpart"),
                       ({"MARCONI_VLLM_ALPHA": "adaptive", "MARCONI_VLLM_ADAPTIVE_RULES": "lru/x"}, "a<alpha>"),
                       ({"MARCONI_VLLM_ALPHA": "0.5", "MARCONI_VLLM_ADAPTIVE_RULES": "lru/a1m"}, "needs"),
                       ({"MARCONI_VLLM_ALPHA": "adaptiv"}, "number >= 0 or adaptive")):
        with pytest.raises(ConfigError, match=match):
            PluginConfig.from_env({"MARCONI_VLLM_POLICY": "marconi", **bad})
    for policy in ("", "lru"):        # adaptive without Marconi's eviction would silently be stock vLLM
        with pytest.raises(ConfigError, match="MARCONI_VLLM_POLICY=marconi"):
            PluginConfig.from_env({"MARCONI_VLLM_POLICY": policy, "MARCONI_VLLM_ALPHA": "adaptive"})


def test_block_rules_of_the_adaptive_family() -> None:
    """lru -> alpha 0; aXm -> alpha X, marginal; aX -> alpha X, whole-prefix; touch and candidates
    change nothing in the pool (one signal, one candidate notion); inverse-age recency at alpha > 0
    has no index form, and tail cuts none at all."""
    assert [block_rule(r) for r in parse_rules("default")] == [(0.0, None), (0.5, "marginal"), (2.0, "marginal")]
    assert block_rule(EvictionRule.from_label("a1")) == (1.0, "total")
    assert block_rule(EvictionRule.from_label("a0")) == (0.0, None)
    assert block_rule(EvictionRule.from_label("a2lp")) == (2.0, "total")
    assert block_rule(EvictionRule.from_label("a0.5ml")) == (0.5, "marginal")
    assert block_rule(EvictionRule.from_label("a0i")) == (0.0, None)
    with pytest.raises(ConfigError, match="no counterpart"):
        block_rule(EvictionRule.from_label("a1mi"))
    for label in ("lrut", "a0.5mt"):
        with pytest.raises(ConfigError, match="cannot cut dead tails"):
            block_rule(EvictionRule.from_label(label))


class _Switch:
    """A source whose rule the test sets."""

    def __init__(self) -> None:
        self.rule: tuple[float, str | None] = (0.0, None)

    def alpha(self) -> float:
        return self.rule[0]

    def efficiency(self) -> str | None:
        return self.rule[1]

    def observe(self, event: RequestObservation) -> None:
        self.rule = (100.0, event.output_token_ids[0] and "marginal" or "total")


def test_the_sources_efficiency_decides_at_each_eviction() -> None:
    """A deep prefix saves the most FLOPs of its whole prefix per byte (total) but the fewest of its
    own block per byte (marginal): switching the variant flips the victim, without rebuilding."""
    source = _Switch()
    st = BlockEvictionState(SPEC, KINDS, 64, B, source)
    deep = Chain(st, "deep", 1).add(16, states=(256,))
    shallow = Chain(st, "shallow", 40).add(1, states=(16,))
    shallow.release_all()
    deep.release_all()                       # the deep chain is the more recent: LRU evicts the shallow one
    shallow_ids = {shallow.attn[16], *shallow.mamba[16]}
    deep_ids = {deep.attn[256], *deep.mamba[256]}
    assert st.next_victim().block_id in shallow_ids                     # alpha 0
    assert st.finished(RequestObservation([1], [0], 0, 0)) == (100.0, "total")
    assert st.next_victim().block_id in shallow_ids
    assert st.finished(RequestObservation([1], [0], 0, 0)) is None      # no change, nothing to trace
    assert st.finished(RequestObservation([1], [1], 0, 0)) == (100.0, "marginal")
    assert st.next_victim().block_id in deep_ids
    assert np.array_equal(st.flop_eff, st.flop_eff_of("total"))         # the configured variant
    st.check_invariants()


def test_adaptive_alpha_follows_the_shadows_live_rule() -> None:
    """The source feeds finished requests to a size-only adaptive-Marconi cache of the pool's bytes
    and answers with its live rule, mapped to blocks; on a contended agent trace it switches."""
    from marconi.core.cache import PrefixCache
    from marconi.workloads import build_workload

    spec = ModelSpec.from_hf_config({"model_type": "qwen3_next", **PRESETS["qwen3_next-tiny"][1],
                                     "torch_dtype": "bfloat16"}, name="qwen3_next-tiny")
    source = PoolShadowAlpha()
    assert (source.alpha(), source.efficiency()) == (0.0, None)          # lru before any request
    st = BlockEvictionState(spec, (MAMBA, MAMBA, MAMBA, ATTENTION), 100, 384, source)
    capacity = pool_capacity_bytes(spec, 100, 384)
    assert capacity == 99 * layout_for_spec(spec, num_blocks=100, block_size=384).block_bytes
    assert source.cache is not None and source.cache.capacity_bytes == capacity
    twin = PrefixCache(spec, capacity, "marconi", "regret")              # the regret selector, by name
    seen = set()
    for req in list(build_workload("swe-sample:max_input_len=8192"))[:60]:
        changed = st.finished(RequestObservation(req.input_tokens, req.output_tokens, 0, 0))
        twin.process(req.input_tokens, req.output_tokens)
        assert source.rule == twin.eviction.rule
        assert (source.alpha(), source.efficiency()) == block_rule(twin.eviction.rule)
        assert changed is None or changed == (source.alpha(), source.efficiency() or "total")
        seen.add(source.rule.label())
    assert len(seen) >= 2, "the shadow never switched: the test trace is not contended enough"
    assert source.tuning_record()["rule_switches"] == twin.chooser.tuning_record()["rule_switches"]
    with pytest.raises(ConfigError, match="one block pool"):
        source.bind(st)
    with pytest.raises(ConfigError, match="cannot be built"):
        BlockEvictionState(spec, (MAMBA, MAMBA, MAMBA, ATTENTION), 2, 16, PoolShadowAlpha())


def test_invariants_hold_under_random_event_sequences() -> None:
    rng = np.random.default_rng(0)
    st = _state(alpha=1.0, num_blocks=200)
    live: dict[int, tuple[str, int]] = {}
    free: set[int] = set()
    next_id = 1
    for step in range(600):
        op = rng.integers(0, 4)
        if op == 0 or not live:                          # cache a block under a random prefix
            depth = int(rng.integers(1, 6)) * B
            group = int(rng.integers(0, 3))
            prefix = f"p{rng.integers(0, 3)}:{depth}"
            parent = f"p{rng.integers(0, 3)}:{depth - B}" if depth > B else None
            st.cached(next_id, prefix, group, depth, parent)
            live[next_id] = (prefix, group)
            next_id += 1
        elif op == 1:                                     # release a live block
            block = int(rng.choice(list(live)))
            if block not in free:
                st.released(block)
                free.add(block)
        elif op == 2 and free:                            # evict the chosen victim
            victim = st.next_victim()
            assert victim is not None and victim.block_id in free
            st.taken(victim.block_id)
            free.discard(victim.block_id)
            prefix, group = live.pop(victim.block_id)
            st.uncached(victim.block_id, prefix, group)
        elif op == 3 and free:                            # a hit takes a free block back
            block = int(rng.choice(sorted(free)))
            st.taken(block)
            free.discard(block)
        st.check_invariants([(b, p, g) for b, (p, g) in live.items()])
    assert set(np.flatnonzero(st.free_cached).tolist()) == free


def test_efficiency_is_the_cores_flop_efficiency_at_the_blocks_depth() -> None:
    for variant in ("total", "marginal"):
        st = BlockEvictionState(SPEC, KINDS, 64, B, FixedAlpha(1.0), variant)
        chain = Chain(st, "a", 1).add(3, states=(48,))
        expected = flop_efficiency(SPEC, 48, B, True, variant)   # marginal: the block's own 16 tokens
        assert st.flop_eff[chain.attn[48]] == expected
        assert all(st.flop_eff[b] == expected for b in chain.mamba[48])
    assert flop_efficiency(SPEC, 48, B, True, "total") != flop_efficiency(SPEC, 48, B, True, "marginal")
