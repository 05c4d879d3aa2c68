"""Checks of the tier policy (marconi.integrations.vllm.tier), run inside vLLM's environment.

``python cases.py [CASE ...]`` runs the named cases (all by default) and prints one JSON object:
case name -> ``"ok"`` or the failure's traceback; ``tests/test_vllm_tier_policy.py`` runs it once
and asserts each case. Kept out of ``tests/*.py`` because it reads vLLM's manager internals
(``_policy``, ``_get_num_free_chunks``, ``_num_evictable_cache_chunks``), as vLLM's own tests do.
"""

from __future__ import annotations

import json
import os
import random
import sys
import traceback
from dataclasses import replace

from vllm.v1.kv_offload.base import ReqContext, get_offload_block_hash, get_offload_group_idx, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus

from marconi.core.eviction import EvictionRule
from marconi.core.model import get_model
from marconi.core.registry import ConfigError
from marconi.integrations.vllm import tier
from marconi.integrations.vllm.tier import MarconiCachePolicy, TierSettings

C = 1152                                   # tokens per chunk
KINDS = ("attention", "mamba", "mamba")    # group 0: KVs; groups 1, 2: the state
SPEC = get_model("nemotron-h-8b")
MODULE = "marconi.integrations.vllm.tier"


def settings(rule: str = "a0.5") -> TierSettings:
    return TierSettings(KINDS, SPEC, C, EvictionRule.from_label(rule))


def node_keys(name: bytes, depth_chunks: int, state: bool) -> list:
    keys = [make_offload_key(name, 0)]
    if state:
        keys += [make_offload_key(name, 1), make_offload_key(name, 2)]
    return keys


class Driver:
    """Feeds a policy as vLLM's manager would: store misses, inserts, completions, request ends."""

    def __init__(self, policy: MarconiCachePolicy) -> None:
        self.policy = policy
        self.next_id = 0

    def request(self, chain: list[bytes], states: set[int], *, finish: bool = True) -> ReqContext:
        """Store ``chain`` (hashes of chunks 1..n) with states after the chunks in ``states`` (1-based)."""
        ctx = ReqContext(req_id=f"r{self.next_id}")
        self.next_id += 1
        keys = []
        for i, h in enumerate(chain, start=1):
            for key in node_keys(h, i, i in states):
                ctx.set_offload_key_position(key, i * C)
                keys.append(key)
        new = [k for k in keys if self.policy.get(k) is None]
        self.policy.on_store_miss(new, ctx)
        for key in new:
            chunk = ChunkStatus(self.next_id * 100 + len(self.policy.classify()))
            chunk.ref_cnt = 0
            self.policy.insert(key, chunk)
        if finish:
            self.finish(ctx, keys)
        return ctx

    def finish(self, ctx: ReqContext, keys: list) -> None:
        groups: dict[int, list] = {}
        for key in keys:
            groups.setdefault(get_offload_group_idx(key), []).append(key)
        self.policy.on_request_finished(tuple(tuple(v) for _, v in sorted(groups.items())), set(keys), set(), ctx)


# --------------------------------------------------------------------------- the tree's logic
def case_dead_kv_tail_goes_first() -> None:
    p = MarconiCachePolicy(16, settings())
    d = Driver(p)
    d.request([b"a1", b"a2", b"a3"], {2})            # a3's KV lies past the deepest state
    d.request([b"b1"], {1})                          # more recent, valuable
    stand = p.classify()
    assert stand[make_offload_key(b"a3", 0)] == "dead", stand
    assert stand[make_offload_key(b"a1", 0)] == "other", "an inner KV chunk is no candidate"
    assert p.usable_depths() == [C, 2 * C], p.usable_depths()
    (victim, _), = p.evict(1, set())
    assert victim == make_offload_key(b"a3", 0), victim
    assert p.eviction_counts["dead-kv"] == 1
    p.check_invariants()


def case_state_without_its_kv_is_dead() -> None:
    p = MarconiCachePolicy(16, settings())
    d = Driver(p)
    d.request([b"a1", b"a2"], {2})
    d.request([b"b1"], {1})
    p.remove(make_offload_key(b"a2", 0))             # (a failed store) the KV at the state is gone
    stand = p.classify()
    assert stand[make_offload_key(b"a2", 1)] == "dead" and stand[make_offload_key(b"a2", 2)] == "dead", stand
    assert stand[make_offload_key(b"a1", 0)] == "dead", "no state reachable below a1 any more"
    p.remove(make_offload_key(b"b1", 2))             # half a state: the other half is dead too
    assert p.classify()[make_offload_key(b"b1", 1)] == "dead"
    victims = {k for k, _ in p.evict(4, set())}
    assert victims == {make_offload_key(b"a2", 1), make_offload_key(b"a2", 2), make_offload_key(b"a1", 0),
                       make_offload_key(b"b1", 1)}, victims
    p.check_invariants()


def case_branch_point_state_kept_while_two_children_continue() -> None:
    p = MarconiCachePolicy(32, settings())
    d = Driver(p)
    d.request([b"s", b"x1"], {1, 2})
    d.request([b"s", b"y1"], {1, 2})
    stand = p.classify()
    assert stand[make_offload_key(b"s", 1)] == "other", "a state with two KV children is no candidate"
    assert stand[make_offload_key(b"s", 0)] == "other"
    assert stand[make_offload_key(b"x1", 0)] == "candidate" and stand[make_offload_key(b"x1", 1)] == "candidate"
    victims = [k for k, _ in p.evict(2, set())]
    assert all(k[:2] in (b"x1", b"y1") for k in victims), victims


def case_running_request_kv_is_not_dead_until_it_ends() -> None:
    p = MarconiCachePolicy(16, settings())
    d = Driver(p)
    ctx = d.request([b"a1", b"a2"], set(), finish=False)   # KV first, its state comes next step
    assert p.classify()[make_offload_key(b"a2", 0)] != "dead"
    d.finish(ctx, node_keys(b"a1", 1, False) + node_keys(b"a2", 2, False))
    assert p.classify()[make_offload_key(b"a2", 0)] == "dead"


def case_alpha_keeps_the_deep_prefix() -> None:
    """Same tree, same order: LRU's rule evicts the older deep state, a large α the shallow one."""
    picks = {}
    for rule in ("lru", "a5"):
        p = MarconiCachePolicy(64, settings(rule))
        d = Driver(p)
        d.request([b"d1", b"d2", b"d3", b"d4", b"d5", b"d6"], {6})   # deep, older
        d.request([b"s1"], {1})                                       # shallow, recent
        picks[rule] = p.evict(1, set())[0][0][:2]
    assert picks == {"lru": b"d6", "a5": b"s1"}, picks


def case_evict_is_atomic() -> None:
    p = MarconiCachePolicy(16, settings())
    d = Driver(p)
    d.request([b"a1"], {1})
    before = p.classify()
    protected = {make_offload_key(b"a1", 0)}
    assert p.evict(3, protected) is None
    assert p.classify() == before and p.eviction_counts == dict.fromkeys(tier.REASONS, 0)
    assert p.evict(0, set()) == []
    p.check_invariants()


def case_refusals_name_the_key() -> None:
    def refused(fn, *words):
        try:
            fn()
        except ConfigError as exc:
            assert all(w in str(exc) for w in words), (str(exc), words)
            return
        raise AssertionError(f"no ConfigError (expected {words})")

    refused(lambda: TierSettings(("attention", "attention"), SPEC), "eviction_policy", "'lru' or 'arc'")
    refused(lambda: TierSettings.from_extra_config({}, spec=SPEC), "marconi_group_kinds")
    refused(lambda: TierSettings.from_extra_config({"marconi_group_kinds": "attention,mamba"}), "marconi_model")
    refused(lambda: TierSettings.from_extra_config({"marconi_group_kinds": "attention,mamba", "marconi_rule": "a1mt"},
                                                   spec=SPEC), "marconi_rule", "cannot cut dead tails")
    refused(lambda: TierSettings.from_extra_config({"marconi_group_kinds": "attention,mamba", "marconi_rule": "b1"},
                                                   spec=SPEC), "marconi_rule")
    refused(lambda: TierSettings.from_extra_config({"marconi_group_kinds": "attention,mamba", "marconi_host_gbps": 0},
                                                   spec=SPEC), "marconi_host_gbps")
    refused(lambda: TierSettings.from_extra_config({"marconi_group_kinds": "attention,mamba", "marconi_alpha": 1},
                                                   spec=SPEC), "marconi_alpha", "marconi_rule")
    extra = {"marconi_group_kinds": "attention,mamba", "marconi_rule": "a2m", "marconi_host_gbps": 32}
    s = TierSettings.from_extra_config(extra, spec=SPEC)
    assert (s.alpha, s.efficiency, s.host_gbps, s.group_kinds) == (2.0, "marginal", 32.0, ("attention", "mamba")), s
    env = {k: v for k, v in os.environ.items() if not k.startswith("MARCONI_TIER_")}
    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(env)
        refused(lambda: CPUOffloadingManager(4, cache_policy="MarconiCachePolicy", cache_policy_module_path=MODULE),
                tier.ENV_GROUP_KINDS, "kv_connector_extra_config")
        import vllm
        version, vllm.__version__ = vllm.__version__, "0.40.0"
        try:
            refused(lambda: MarconiCachePolicy(4), "0.40.0", "eviction_policy")
        finally:
            vllm.__version__ = version
    finally:
        os.environ.clear()
        os.environ.update(saved)
    p = MarconiCachePolicy(4, settings())
    refused(lambda: p.insert(make_offload_key(b"x", 7), ChunkStatus(0)), "marconi_group_kinds")


def case_load_cost_clips_worthless_hits() -> None:
    s = settings()
    cheap = replace(s, host_gbps=1e-3)            # a link so slow that no hit pays for its load
    assert MarconiCachePolicy(4, cheap)._eff(C) == 0.0   # noqa: SLF001 (the policy's own helper)
    assert MarconiCachePolicy(4, s)._eff(C) > 0.0


def case_incremental_standing_equals_a_fresh_pass() -> None:
    """evict() updates the tree's standing victim by victim (the node and its ancestors); after
    every removal it must equal a pass from scratch over the chunks left."""
    rng = random.Random(7)
    for trial in range(20):
        p = MarconiCachePolicy(10_000, settings())
        d = Driver(p)
        for chain, states, *_ in _workload(trial, 25):
            d.request(chain, states, finish=rng.random() < 0.8)
        view = tier._Judgement(p)
        keys = list(p.classify())
        cached = {k: view.category(k) for k in keys}     # what evict() keeps, refreshed as it does
        rng.shuffle(keys)
        for key in keys[: len(keys) // 2]:
            del cached[key]
            for other in view.remove(key):
                cached[other] = view.category(other)
            p.remove(key)
            fresh = tier._Judgement(p)
            assert cached == {k: fresh.category(k) for k in p.classify()}, trial
            p.check_invariants()


# --------------------------------------------------------------------------- the randomised driver
def _workload(seed: int, num_requests: int) -> list[tuple[list[bytes], set[int], int, int, bool]]:
    """Requests over a random prefix tree: (chain, state positions, store delay, load delay, store fails)."""
    rng = random.Random(seed)
    roots = [[f"t{t}-{i}".encode() for i in range(1, 9)] for t in range(6)]
    out = []
    for r in range(num_requests):
        base = rng.choice(roots)
        keep = rng.randint(1, len(base))
        tail = [f"q{r}-{i}".encode() for i in range(rng.randint(0, 3))]
        chain = base[:keep] + tail
        states = {len(chain)} | {i for i in range(1, len(chain)) if rng.random() < 0.25}
        out.append((chain, states, rng.randint(0, 3), rng.randint(0, 3), rng.random() < 0.05))
    return out


def drive(policy_name: str, module: str | None, seed: int, num_chunks: int, num_requests: int) -> dict:
    """Run the workload through vLLM's CPUOffloadingManager; check ref counts and free chunks after
    every step. Returns the eviction sequence and the chunks loaded."""
    m = CPUOffloadingManager(num_chunks, cache_policy=policy_name, cache_policy_module_path=module)
    policy = m._policy
    held: dict[bytes, int] = {}        # key -> expected ref_cnt (-1 pending store, else active loads)
    pending: list[tuple[int, str, ReqContext, list, bool]] = []   # (due step, kind, ctx, keys, fail)
    evicted: list[bytes] = []
    loaded_chunks = 0

    def check(step: int) -> None:
        for key, ref in held.items():
            chunk = policy.get(key)
            assert chunk is not None, f"step {step}: held chunk {key!r} lost"
            assert chunk.ref_cnt == ref, f"step {step}: {key!r} ref_cnt {chunk.ref_cnt}, expected {ref}"
        ids = [policy.get(k).chunk_id for k in held]
        assert len(set(ids)) == len(ids) and all(0 <= i < num_chunks for i in ids), f"step {step}: chunk ids"
        assert m._get_num_free_chunks() == num_chunks - len(held), f"step {step}: free chunks"
        assert m._num_evictable_cache_chunks == sum(r == 0 for r in held.values()), f"step {step}: evictable"
        if hasattr(policy, "check_invariants"):
            policy.check_invariants()

    def complete(step: int) -> None:
        nonlocal pending
        due = [p for p in pending if p[0] <= step]
        pending = [p for p in pending if p[0] > step]
        for _, kind, ctx, keys, fail in due:
            if kind == "load":
                m.complete_load(keys, ctx)
                for k in keys:
                    held[k] -= 1
            else:
                m.complete_store(keys, ctx, success=not fail)
                for k in keys:
                    if fail:
                        del held[k]
                    else:
                        held[k] = 0

    for step, (chain, states, store_delay, load_delay, fail) in enumerate(_workload(seed, num_requests)):
        complete(step)
        ctx = ReqContext(req_id=f"r{step}")
        m.on_new_request(ctx)
        keys_at = {}
        for i, h in enumerate(chain, start=1):
            keys_at[i] = [make_offload_key(h, 0)] + ([make_offload_key(h, 1), make_offload_key(h, 2)]
                                                     if i in states else [])
            for key in keys_at[i]:
                ctx.set_offload_key_position(key, i * C)
        # the deepest hit: every KV chunk up to d ready and the whole state at d ready
        hit = 0
        for d in range(1, len(chain) + 1):
            if m.lookup(make_offload_key(chain[d - 1], 0), ctx).name != "HIT":
                break
            if all(m.lookup(make_offload_key(chain[d - 1], g), ctx).name == "HIT" for g in (1, 2)):
                hit = d
        if hit:
            load = [make_offload_key(h, 0) for h in chain[:hit]] + [make_offload_key(chain[hit - 1], g) for g in (1, 2)]
            m.prepare_load(load, ctx)
            for k in load:
                held[k] += 1
            loaded_chunks += len(load)
            pending.append((step + load_delay, "load", ctx, load, False))
        offer = [k for i in range(hit + 1, len(chain) + 1) for k in keys_at[i]]
        out = m.prepare_store(offer, ctx) if offer else None
        if out is not None:
            for k in out.evicted_keys:
                assert held.pop(k) == 0, f"step {step}: evicted a pinned chunk"
                assert k not in offer, f"step {step}: evicted a chunk of the offer"
            evicted.extend(out.evicted_keys)
            for k in out.keys_to_store:
                held[k] = -1
            if out.keys_to_store:
                pending.append((step + store_delay, "store", ctx, list(out.keys_to_store), fail))
        m.on_request_finished(ctx)
        check(step)
    complete(num_requests + 10)
    check(num_requests + 10)
    return {"evicted": [k.hex() for k in evicted], "loaded_chunks": loaded_chunks}


def case_randomised_driver_differs_from_lru() -> None:
    differ = 0
    totals = {"lru": 0, "marconi": 0}
    for seed in range(4):
        lru = drive("lru", None, seed, 24, 150)
        marconi = drive("MarconiCachePolicy", MODULE, seed, 24, 150)
        totals["lru"] += lru["loaded_chunks"]
        totals["marconi"] += marconi["loaded_chunks"]
        assert lru["evicted"] and marconi["evicted"], "the tier never filled: no eviction to compare"
        differ += lru["evicted"] != marconi["evicted"]
    assert differ == 4, f"Marconi's evictions equal LRU's in {4 - differ} of 4 runs"
    print(json.dumps({"loaded_chunks": totals}), file=sys.stderr)


# --------------------------------------------------------------------------- vLLM's own factory path
def case_store_threshold_filter_equals_the_emulation() -> None:
    """vLLM's ``store_threshold`` (a chunk is stored once offered that many times, counted over the
    last ``max_tracker_size`` keys) against the emulation's TierManager, call for call: random offers
    over a small key space, a tracker small enough to age keys out, stores that land a call late."""
    from marconi.integrations.vllm.emulate.tier import LRUPolicy, ReqContext as EmuContext, TierManager

    for seed in range(3):
        rng = random.Random(seed)
        vllm_m = CPUOffloadingManager(6, cache_policy="lru", store_threshold=2, max_tracker_size=10)
        emu_m = TierManager(6, LRUPolicy(6), store_threshold=2, max_tracker_size=10)
        space = [make_offload_key(f"k{i}".encode(), g) for i in range(9) for g in (0, 1)]
        late: tuple[list, list, ReqContext] | None = None
        stored = skipped = 0
        for step in range(300):
            ctx, ectx = ReqContext(req_id=f"r{step}"), EmuContext(step)
            vllm_m.on_new_request(ctx)
            offer = rng.sample(space, rng.randint(1, 4))
            out = vllm_m.prepare_store(offer, ctx)
            emu = emu_m.prepare_store(offer, ectx)
            got = None if out is None else list(out.keys_to_store)
            assert got == emu, f"seed {seed} step {step}: vLLM stores {got}, the emulation {emu}"
            assert out is None or list(out.evicted_keys) == emu_m.evicted[len(emu_m.evicted) - len(out.evicted_keys):]
            if late is not None:                       # the previous call's store lands now
                vllm_m.complete_store(late[0], late[2])
                emu_m.complete_store(late[1])
            late = (got or [], emu or [], ctx)
            stored += len(got or [])
            vllm_m.on_request_finished(ctx)
            emu_m.on_request_finished(ectx)
            held = {k for k in space if vllm_m._policy.get(k) is not None}
            assert held == {k for k in space if emu_m.policy.get(k) is not None}, f"seed {seed} step {step}: held"
            assert dict(vllm_m.counts) == dict(emu_m.counts), f"seed {seed} step {step}: the trackers differ"
        skipped = emu_m.stores_skipped
        assert stored and skipped, f"seed {seed}: stored {stored}, skipped {skipped}: the filter was not exercised"
        assert len(vllm_m.counts) == 10, "the tracker never filled: aging was not exercised"


def _engine(model_dir: str, extra: dict, num_blocks: int = 64):
    """vLLM's EngineCore (stub executor, no weights) with the OffloadingConnector configured by ``extra``."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.core import EngineCore

    from marconi.integrations.vllm.replay.engine import StubExecutor

    ktc = KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both", kv_connector_extra_config=extra)
    args = EngineArgs(model=model_dir, skip_tokenizer_init=True, enable_prefix_caching=True,
                      enable_chunked_prefill=True, max_model_len=8192, dtype="bfloat16", num_gpu_blocks_override=num_blocks,
                      max_num_batched_tokens=2048, load_format="dummy", enforce_eager=True, kv_transfer_config=ktc)
    executor = type("StubExecutor", (StubExecutor,), {"available_bytes": 1 << 40, "gpu_memory_bytes": None,
                                                        "tensor_parallel": 1, "weight_bytes_per_param": None})
    return EngineCore(args.create_engine_config(), executor, log_stats=True)


TIER = {"cpu_bytes_to_use": 8 << 30, "eviction_policy": "MarconiCachePolicy", "cache_policy_module_path": MODULE}


def case_loads_through_vllms_connector_from_extra_config_alone() -> None:
    """A plain vLLM process: the connector's spec builds vLLM's CPUOffloadingManager, whose
    CachePolicyFactory loads the policy by module path; the policy learns the rest from vLLM."""
    from vllm.v1.kv_cache_interface import MambaSpec

    from marconi.integrations.vllm.replay.run import model_dir

    saved = {name: os.environ.pop(name, None) for name in (tier.ENV_GROUP_KINDS, tier.ENV_MODEL)}
    try:                                                  # nothing from the environment
        core = _engine(str(model_dir("nemotron-h-8b")), dict(TIER))
    finally:
        os.environ.update({k: v for k, v in saved.items() if v is not None})
    manager = core.scheduler.connector.connector_scheduler.manager
    assert type(manager) is CPUOffloadingManager, type(manager)
    policy = manager._policy
    assert type(policy) is MarconiCachePolicy, type(policy)
    groups = core.scheduler.kv_cache_config.kv_cache_groups
    expected = tuple("mamba" if isinstance(g.kv_cache_spec, MambaSpec) else "attention" for g in groups)
    assert policy.settings.group_kinds == expected and expected.count("mamba") == 6, policy.settings.group_kinds
    assert policy.settings.tokens_per_chunk == 1152, policy.settings.tokens_per_chunk
    assert policy.settings.spec.num_ssm_layers == get_model("nemotron-h-8b").num_ssm_layers
    assert policy.cache_capacity == manager._num_chunks > 0
    # the default, marconi_rule 'adaptive': the family's first rule live, the chooser's worlds beside it
    assert tier.DEFAULT_RULE == "adaptive" and policy.chooser is not None
    assert policy.settings.family and policy.settings.rule == policy.settings.family[0]
    core.shutdown()


def case_reset_cache_makes_a_running_requests_scratch_stale() -> None:
    """vLLM's reset_cache clears the policy while a request runs: the request's KV, offered again
    after it, is held open until the request ends (not dead), as before the reset."""
    manager = CPUOffloadingManager(64, cache_policy="MarconiCachePolicy", cache_policy_module_path=MODULE)
    h1, h2 = b"\x01" * 16, b"\x02" * 16
    ctx = ReqContext(req_id="A")
    keys = node_keys(h1, 1, True) + [make_offload_key(h2, 0)]
    for key in keys:
        ctx.set_offload_key_position(key, C if get_offload_block_hash(key) == h1 else 2 * C)
    tail = keys[-1]
    for _ in range(2):                  # before the reset, then re-offered after it
        out = manager.prepare_store(keys, ctx)
        manager.complete_store(out.keys_to_store, ctx)
        assert manager._policy.classify()[tail] != "dead", manager._policy.classify()
        manager.reset_cache()
    out = manager.prepare_store(keys, ctx)
    manager.complete_store(out.keys_to_store, ctx)
    assert manager._policy.classify()[tail] != "dead", "a running request's KV judged dead after reset_cache"
    manager.on_request_finished(ctx)
    assert manager._policy.classify()[tail] == "dead", "the KV past the deepest state lives on after its request"


def case_a_store_retried_after_failing_for_room_learns_its_depth() -> None:
    """vLLM calls on_store_miss once per key per request: a store that failed for room and is retried
    after another request's store must still give its new node its depth (it had none until the
    request ended)."""
    def node_depth(fail_first: bool):
        manager = CPUOffloadingManager(7, cache_policy="MarconiCachePolicy", cache_policy_module_path=MODULE)
        a, c, y, z = b"\x0a" * 16, b"\x0c" * 16, b"\x0b" * 16, b"\x0d" * 16

        def request(name: str, chain: list, states: set):
            ctx = ReqContext(req_id=name)
            keys = [k for i, h in enumerate(chain, 1) for k in node_keys(h, i, i in states)]
            for key in keys:
                ctx.set_offload_key_position(key, (chain.index(get_offload_block_hash(key)) + 1) * C)
            manager.on_new_request(ctx)
            return ctx, keys

        for name, h in (("X", a), ("Y", y)):
            ctx, keys = request(name, [h], {1})
            out = manager.prepare_store(keys, ctx)
            manager.complete_store(out.keys_to_store, ctx)
            manager.on_request_finished(ctx)
        r, r_keys = request("R", [a, c], {2})
        manager.prepare_load(node_keys(a, 1, True), r)          # R's hit on a: pinned
        if fail_first:
            loader, _ = request("L", [], set())
            manager.prepare_load(node_keys(y, 1, True), loader)  # and Y's: no room for R's store
            assert manager.prepare_store(r_keys[1:], r) is None
            manager.complete_load(node_keys(y, 1, True), loader)
        zc, z_keys = request("Z", [z], set())                    # another request stores in between
        out = manager.prepare_store(z_keys, zc)
        manager.complete_store(out.keys_to_store, zc)
        out = manager.prepare_store(r_keys[1:], r)
        manager.complete_store(out.keys_to_store, r)
        return manager._policy._nodes[c].depth

    assert node_depth(False) == 2 * C
    assert node_depth(True) == 2 * C, "a retried store's node has no depth until its request ends"


def case_connector_refuses_group_kinds_unlike_vllms() -> None:
    """A 'marconi_group_kinds' that is not vLLM's groups is refused when the engine starts, naming
    the key; vLLM's own groups, given, load."""
    from marconi.integrations.vllm.replay.run import model_dir

    path = str(model_dir("nemotron-h-8b"))
    try:
        _engine(path, {**TIER, "marconi_group_kinds": ["attention", "mamba"]})
    except ConfigError as exc:
        assert "marconi_group_kinds" in str(exc) and "vLLM's KV cache groups" in str(exc), str(exc)
    else:
        raise AssertionError("a marconi_group_kinds unlike vLLM's groups was served")
    core = _engine(path, dict(TIER))
    kinds = list(core.scheduler.connector.connector_scheduler.manager._policy.settings.group_kinds)
    core.shutdown()
    core = _engine(path, {**TIER, "marconi_group_kinds": kinds})
    assert list(core.scheduler.connector.connector_scheduler.manager._policy.settings.group_kinds) == kinds
    core.shutdown()


def case_connector_refuses_a_model_without_states() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
                  "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "vocab_size": 32000, "max_position_embeddings": 8192,
                  "torch_dtype": "bfloat16"}
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config, f)
        try:
            _engine(tmp, dict(TIER), num_blocks=2048)
        except ConfigError as exc:
            assert "eviction_policy" in str(exc) and "'lru' or 'arc'" in str(exc), str(exc)
        else:
            raise AssertionError("an attention-only model was served")


CASES = {name[len("case_"):]: fn for name, fn in sorted(globals().items()) if name.startswith("case_")}


def main(argv: list[str]) -> int:
    os.environ.setdefault(tier.ENV_GROUP_KINDS, ",".join(KINDS))
    os.environ.setdefault(tier.ENV_MODEL, "nemotron-h-8b")
    results = {}
    for name in argv or list(CASES):
        try:
            CASES[name]()
            results[name] = "ok"
        except BaseException:       # noqa: BLE001 — reported per case, the runner asserts
            results[name] = traceback.format_exc()
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
