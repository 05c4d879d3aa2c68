"""What Marconi's CPU-tier policy reads from the chunk tree's branches (``ChunkTreePolicy``), without vLLM.

**Cold insertion** (``marconi_cold_insert``): a request's head (the first node it stores) hangs
from a branch point; heads that later requests reuse warm the branch point, heads forgotten unreused
cool it. Under a branch point gone cold, a request's own tail (its deepest node's chunks) enters
below every other chunk's recency, so it goes first among candidates; a reuse warms the point again.
**Second chance** (``marconi_second_chance``): a node with evidence of reuse (a second distinct way
through it, or a tier hit that ended at its state), when picked as victim, is refreshed once
instead; a hit's chance is withdrawn by a deeper hit on the same path unless the node branched. Both switches reach the policy from vLLM's config, the
environment and the emulation's system name, and bad values are refused by name.
"""

from __future__ import annotations

import pytest

from marconi.core.model import get_model
from marconi.core.registry import ConfigError
from marconi.integrations.vllm.emulate.tier import ReqContext, TierManager
from marconi.integrations.vllm.policy import ATTENTION, MAMBA
from marconi.integrations.vllm.tier_settings import (ENV_COLD_INSERT, ENV_GROUP_KINDS, ENV_MODEL, ENV_SECOND_CHANCE,
                                                     TierSettings)
from marconi.integrations.vllm.tier_tree import HIT_TRUST_CAP, ChunkTreePolicy, make_offload_key

SPEC = get_model("nemotron-h-8b")
KINDS = (MAMBA, ATTENTION)
TPC = 1152


def _request(mgr: TierManager, rid: int, chain: list[str], states: bool = False) -> tuple[bytes, bytes]:
    """One request over the nodes ``chain`` (shared names share chunks): the attention chunk of every
    node and the state at the last (at every node with ``states``), offered and stored (what is
    held and offered again is the request's reuse: a state reused is a tier hit ending there), then
    the request's end. Returns the last node's (KV, state) keys."""
    ctx = ReqContext(rid)
    keys = []
    for i, name in enumerate(chain, start=1):
        for group in ((1, 0) if states or i == len(chain) else (1,)):
            key = make_offload_key(name.encode(), group)
            ctx.set_offload_key_position(key, i * TPC)
            keys.append(key)
    stored = mgr.prepare_store(keys, ctx)
    assert stored is not None
    mgr.complete_store(stored)
    mgr.on_request_finished(ctx)
    return keys[-2], keys[-1]


def _tier(capacity: int, cold_insert: bool, second_chance: bool = False) -> tuple[ChunkTreePolicy, TierManager]:
    settings = TierSettings(KINDS, SPEC, TPC, cold_insert=cold_insert, second_chance=second_chance)
    policy = ChunkTreePolicy(capacity, settings)
    return policy, TierManager(capacity, policy)


def _cool_the_prompt(mgr: TierManager) -> int:
    """A shared prompt (p1, p2), one user under it (u0), then unrelated one-offs until u0's head is
    evicted unreused: the prompt's branch point goes cold. Returns the next request id."""
    _request(mgr, 0, ["p1", "p2", "u0"])
    _request(mgr, 1, ["p1", "p2", "u1"])          # u1's head hangs from p2
    rid = 2
    while mgr.policy.get(make_offload_key(b"u1", 1)) is not None:
        _request(mgr, rid, [f"x{rid}"])
        rid += 1
    return rid


@pytest.mark.parametrize("cold_insert", [True, False])
def test_a_tail_under_a_branch_whose_heads_went_unused_enters_cold(cold_insert: bool) -> None:
    """After u1 left unreused, the next user's tail under the prompt (u2: its KV and its state) takes
    recency stamps below every other chunk's, and the next victim is from it; without cold
    insertion it is as recent as any request's end, and the victim is the oldest one-off."""
    policy, mgr = _tier(12, cold_insert)
    rid = _cool_the_prompt(mgr)
    kv, state = _request(mgr, rid, ["p1", "p2", "u2"])
    others = [k for k in policy.idle_keys() if k not in (kv, state)]
    if cold_insert:
        assert policy.recency(kv) < 0 and policy.recency(state) < 0
        assert max(policy.recency(kv), policy.recency(state)) < min(map(policy.recency, others))
    else:
        assert policy.recency(kv) > 0 and policy.recency(state) > 0
    mgr.check_invariants()
    ((victim, _),) = policy.evict(1, set())         # the policy's own pick (the manager not told)
    assert (victim in (kv, state)) == cold_insert
    policy.check_invariants()


def test_a_reused_head_warms_its_branch_point_again() -> None:
    """Under the cold prompt, u2 enters cold; a second request over u2 reuses its head, which warms
    the prompt's branch point, so the next user's tail (u3) enters warm, as recent as its end."""
    policy, mgr = _tier(12, True)
    rid = _cool_the_prompt(mgr)
    kv, _ = _request(mgr, rid, ["p1", "p2", "u2"])
    assert policy.recency(kv) < 0
    kv, _ = _request(mgr, rid + 1, ["p1", "p2", "u2", "u2b"])     # reuses u2: refreshed, and p2 warms
    assert policy.recency(make_offload_key(b"u2", 1)) > 0
    kv3, state3 = _request(mgr, rid + 2, ["p1", "p2", "u3"])
    assert policy.recency(kv3) > 0 and policy.recency(state3) > 0
    policy.check_invariants()


def _lose(mgr: TierManager, name: str, rid: int) -> int:
    """Unrelated one-offs until node ``name`` is evicted (its head forgotten unreused). Returns the
    next request id."""
    while mgr.policy.get(make_offload_key(name.encode(), 1)) is not None:
        _request(mgr, rid, [f"x{rid}"])
        rid += 1
    return rid


def test_a_head_that_entered_cold_and_comes_back_warms_its_branch_point_back() -> None:
    """Under the cold prompt u2 enters cold and is lost unreused; a later request stores u2 again (a
    session calling again after its call was evicted): the cold prediction was wrong, the point
    warms back, and that request's own tail (u2b) enters warm, as does the next new user's (u3).
    u1, which entered warm and was lost, coming back the same way proves nothing about the
    prediction: the point stays at 0 and its tail enters cold."""
    policy, mgr = _tier(12, True)
    rid = _cool_the_prompt(mgr)
    kv, _ = _request(mgr, rid, ["p1", "p2", "u2"])
    assert policy.recency(kv) < 0                               # entered cold
    rid = _lose(mgr, "u2", rid + 1)
    assert policy.branch_memory()["lost_heads"] == 1
    kv, state = _request(mgr, rid, ["p1", "p2", "u2", "u2b"])
    assert policy.recency(kv) > 0 and policy.recency(state) > 0
    assert policy.branch_memory()["lost_heads"] == 0
    kv, state = _request(mgr, rid + 1, ["p1", "p2", "u3"])
    assert policy.recency(kv) > 0 and policy.recency(state) > 0
    policy.check_invariants()

    policy, mgr = _tier(12, True)
    rid = _cool_the_prompt(mgr)                                  # u1 entered warm, then was lost
    assert policy.branch_memory()["lost_heads"] == 0
    kv, state = _request(mgr, rid, ["p1", "p2", "u1", "u1b"])
    assert policy.recency(kv) < 0 and policy.recency(state) < 0
    policy.check_invariants()


def test_a_request_whose_head_has_no_known_parent_predicts_nothing() -> None:
    """Chains from the root (no branch point) never enter cold, however many go unused."""
    policy, mgr = _tier(6, True)
    for rid in range(30):
        kv, state = _request(mgr, rid, [f"solo{rid}", f"solo{rid}:tail"])
        assert policy.recency(kv) > 0 and policy.recency(state) > 0
    policy.check_invariants()


def _shared_prefix_then_one_off(mgr: TierManager) -> None:
    """A prefix ending in a state (p1, p2), two users that branch from it (u0, then u1: p2's second
    distinct child), then a one-off request (x), the newest."""
    _request(mgr, 0, ["p1", "p2"])
    _request(mgr, 1, ["p1", "p2", "u0"])
    _request(mgr, 2, ["p1", "p2", "u1"])
    _request(mgr, 3, ["x"])


@pytest.mark.parametrize("second_chance", [True, False])
def test_a_branch_point_outlives_one_round_of_younger_leaves(second_chance: bool) -> None:
    """The users passed through the prefix's KV, not its state, so by recency alone the prefix's state
    goes right after the first user's tail (the prefix is then useless) and the one-off outlives it.
    With a second chance the pick of the prefix's state refreshes the node instead: both users' tails
    go, then the one-off, before any of the prefix."""
    policy, mgr = _tier(12, cold_insert=False, second_chance=second_chance)
    _shared_prefix_then_one_off(mgr)
    users = {make_offload_key(f"u{i}".encode(), g) for i in (0, 1) for g in (0, 1)}
    one_off = {make_offload_key(b"x", g) for g in (0, 1)}
    state = make_offload_key(b"p2", 0)
    victims = [key for key, _ in policy.evict(6, set())]
    if second_chance:
        assert set(victims[:4]) == users and set(victims[4:]) == one_off
    else:
        assert victims[2] == state and not one_off & set(victims)
    policy.check_invariants()


def _victims(chains: list[list[str]], n: int, second_chance: bool = True) -> list[str]:
    """The first ``n`` victims (``"node/kv"``, ``"node/state"``) after requests over ``chains``, each
    with a state at every node, then two one-off requests (x, y), the newest."""
    policy, mgr = _tier(16, cold_insert=False, second_chance=second_chance)
    for rid, chain in enumerate(chains + [["x"], ["y"]]):
        _request(mgr, rid, chain, states=True)
    victims = policy.evict(n, set())
    policy.check_invariants()
    return [key[:-4].decode() + ("/kv" if key[-1] == 1 else "/state") for key, _ in victims]


@pytest.mark.parametrize("second_chance", [True, False])
def test_a_state_a_hit_ended_at_outlives_one_round_of_younger_leaves(second_chance: bool) -> None:
    """s1 then s1, s2: the second request's hit ends at s1's state (ARC's "seen twice"). With a second
    chance the pick of s1's state refreshes the node: the leaves s2, x and y go first; by recency
    alone s1 goes right after s2."""
    victims = _victims([["s1"], ["s1", "s2"]], 6, second_chance)
    if second_chance:
        assert victims == ["s2/kv", "s2/state", "x/kv", "x/state", "y/kv", "y/state"]
    else:
        assert victims == ["s2/kv", "s2/state", "s1/kv", "s1/state", "x/kv", "x/state"]


def test_a_deeper_hit_on_the_path_withdraws_the_chance_a_hit_gave() -> None:
    """The chain grows (s1; s1, s2; s1, s2, s3, as a session's turns): the third request's hit ends at
    s2 and s1's chance from the second hit is withdrawn, so s1's state goes before the one-offs.
    After a prefix asked three times (r; r; r: the third hit ends where the second did, trust +1),
    s2 takes a chance and outlives them; on its own, the chain's deeper hit has taken the trust to
    -1, so s2's hit grants nothing and the chain goes by recency."""
    chain = [["s1"], ["s1", "s2"], ["s1", "s2", "s3"]]
    assert _victims([["r"]] * 3 + chain, 6) == ["s3/kv", "s3/state", "s1/state", "x/kv", "x/state", "y/kv"]
    assert _victims(chain, 8) == ["s3/kv", "s3/state", "s2/kv", "s2/state", "s1/kv", "s1/state", "x/kv", "x/state"]


def test_a_node_that_branched_keeps_its_chance_past_a_deeper_hit() -> None:
    """p's state served a hit that stopped there (p, p), then one that went on to a (p, a): two ways
    through p, so p branched, and the deeper hit at a (p, a, a2) leaves p's chance (and a takes one:
    the repeat at p paid for the pass). Without the first way (no p, p) the chance was a hit's alone,
    and the deeper hit withdraws it; that pass with no repeat before it takes the trust to -1, so a's
    hit grants nothing and the whole chain goes by recency."""
    assert _victims([["p"], ["p"], ["p", "a"], ["p", "a", "a2"]], 6) == [
        "a2/kv", "a2/state", "x/kv", "x/state", "y/kv", "y/state"]
    assert _victims([["p"], ["p", "a"], ["p", "a", "a2"]], 8) == [
        "a2/kv", "a2/state", "a/kv", "a/state", "p/kv", "p/state", "x/kv", "x/state"]


def _trust_then_victims(before: list[list[str]]) -> tuple[int, list[str]]:
    """Requests over ``before``, then s1; s1, s2 (a hit ends at s1's state); then two one-offs x, y.
    Returns the hit trust after s1's hit, and the victims among s1, s2, x and y when every chunk goes
    (the tier holds everything: no eviction before)."""
    policy, mgr = _tier(256, cold_insert=False, second_chance=True)
    rid = 0
    for chain in before:
        _request(mgr, rid, chain, states=True)
        rid += 1
    _request(mgr, rid, ["s1"], states=True)
    _request(mgr, rid + 1, ["s1", "s2"], states=True)
    trust = policy.hit_trust
    _request(mgr, rid + 2, ["x"], states=True)
    _request(mgr, rid + 3, ["y"], states=True)
    victims = policy.evict(policy.num_evictable(), set())
    policy.check_invariants()
    names = [key[:-4].decode() + ("/kv" if key[-1] == 1 else "/state") for key, _ in victims]
    return trust, [n for n in names if n.split("/")[0] in ("s1", "s2", "x", "y")]


def _growing(turns: int, name: str = "g") -> list[list[str]]:
    """One session's calls: each extends the last by a node (an agent loop)."""
    return [[f"{name}{j}" for j in range(1, t + 1)] for t in range(1, turns + 1)]


def test_hits_stop_granting_chances_where_every_hit_passes_the_last_and_a_repeat_brings_them_back() -> None:
    """A growing chain's hits each end one node deeper than the last: each passes the node where
    the last ended, so the trust falls by one per call and stops at -HIT_TRUST_CAP; s1's hit then
    grants nothing, and s1's state goes by recency, before the one-offs. Prefixes asked again
    exactly (r; r; r ...) raise it one per repeat; once it is back at 0, s1's hit earns its chance
    again and s1 outlives x and y. Without the chain, the trust stays 0 and s1 has its chance."""
    assert _trust_then_victims([]) == (0, ["s2/kv", "s2/state", "x/kv", "x/state", "y/kv", "y/state",
                                           "s1/kv", "s1/state"])
    chain = _growing(HIT_TRUST_CAP + 4)
    trust, victims = _trust_then_victims(chain)
    assert trust == -HIT_TRUST_CAP
    assert victims == ["s2/kv", "s2/state", "s1/kv", "s1/state", "x/kv", "x/state", "y/kv", "y/state"]
    repeats = [["r"]] * (HIT_TRUST_CAP + 2)       # stored, a first hit, then HIT_TRUST_CAP repeats: back to 0
    trust, victims = _trust_then_victims(chain + repeats)
    assert trust == 0
    assert victims[-2:] == ["s1/kv", "s1/state"]


def test_a_chance_a_hit_already_holds_survives_the_trust_falling() -> None:
    """The trust decides grants, not the chances held: s1's chance, granted while hits were trusted,
    still saves it after a growing chain takes the trust negative."""
    policy, mgr = _tier(256, cold_insert=False, second_chance=True)
    _request(mgr, 0, ["s1"], states=True)
    _request(mgr, 1, ["s1", "s2"], states=True)
    for rid, chain in enumerate(_growing(HIT_TRUST_CAP + 4), start=2):
        _request(mgr, rid, chain, states=True)
    assert policy.hit_trust == -HIT_TRUST_CAP
    victims = [key[:-4].decode() for key, _ in policy.evict(policy.num_evictable(), set())]
    assert victims.index("s1") > victims.index("g1")      # refreshed once: after the chain's oldest
    policy.check_invariants()


def test_what_the_branches_leave_behind_is_bounded() -> None:
    """1,100 prefixes, each reused by a user (whose head is then evicted unreused: its branch point
    cools) and by a second user (the prefix branches: a chance, granted as a hit's is); then 1,100
    prefixes each asked twice (a hit ends at it), and 1,100 points with five users each (the later
    ones enter cold and are lost): the six
    tables stop at 4 × capacity + 1,024 entries, forgetting the oldest, while the policy keeps serving."""
    capacity = 4
    policy, mgr = _tier(capacity, cold_insert=True, second_chance=True)
    rid = 0
    for i in range(1100):
        for chain in ([f"p{i}"], [f"p{i}", f"p{i}:a"], [f"p{i}", f"p{i}:b"]):
            _request(mgr, rid, chain)
            rid += 1
    for i in range(1100):
        for chain in ([f"q{i}"], [f"q{i}"]):
            _request(mgr, rid, chain)
            rid += 1
    for i in range(1100):                          # five users under each point: later ones enter cold, and go
        for user in "abcde":
            _request(mgr, rid, [f"c{i}", f"c{i}:{user}"])
            rid += 1
    bound = 4 * capacity + 1024
    memory = policy.branch_memory()
    assert memory == {"warmth": bound, "cold_heads": memory["cold_heads"], "lost_heads": bound,
                      "first_kids": bound, "chances": bound, "hit_ends": bound}, memory
    assert memory["cold_heads"] <= bound
    policy.check_invariants()
    mgr.check_invariants()


def test_the_switches_reach_the_policy_and_bad_values_are_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """``marconi_cold_insert`` and ``marconi_second_chance`` (on by default), their environment
    variables and the emulation's ``tier_cold_insert=`` / ``tier_second_chance=`` set them; a value
    that is not a switch, or the emulation's switch without Marconi's tier policy, is refused
    naming what to change."""
    from marconi.sim.systems import make_system

    extra = {"marconi_group_kinds": "mamba,attention", "marconi_model": "nemotron-h-8b"}
    monkeypatch.setenv(ENV_GROUP_KINDS, "mamba,attention")
    monkeypatch.setenv(ENV_MODEL, "nemotron-h-8b")
    for field, key, var in (("cold_insert", "marconi_cold_insert", ENV_COLD_INSERT),
                            ("second_chance", "marconi_second_chance", ENV_SECOND_CHANCE)):
        assert getattr(TierSettings.from_extra_config(extra), field) is True
        for value, expected in (("false", False), ("off", False), (0, False), (True, True), ("1", True)):
            assert getattr(TierSettings.from_extra_config({**extra, key: value}), field) is expected
        with pytest.raises(ConfigError, match=key):
            TierSettings.from_extra_config({**extra, key: "sometimes"})
        monkeypatch.setenv(var, "0")
        assert getattr(TierSettings.from_env(), field) is False
        monkeypatch.setenv(var, "maybe")
        with pytest.raises(ConfigError, match=var):
            TierSettings.from_env()
        monkeypatch.delenv(var)

    base = "vllm-align:blocks=60,cpu_tier=300MB,tier_policy=marconi"
    for suffix, cold, chance in (("", True, True), (",tier_cold_insert=0", False, True),
                                 (",tier_second_chance=0", True, False)):
        system = make_system(base + suffix)
        assert suffix[1:] in system.describe()["admission"]
        policy = system.build("nemotron-h-8b", 0).engine.tier.manager.policy
        worlds = [w.policy for w in policy.chooser.worlds if isinstance(w.policy, ChunkTreePolicy)]
        for p in [policy, *worlds]:                 # every world of the adaptive default too
            assert (p.settings.cold_insert, p.settings.second_chance) == (cold, chance)
    for switch in ("tier_cold_insert=0", "tier_second_chance=0"):
        with pytest.raises(ConfigError, match="tier_policy=marconi"):
            make_system(f"vllm-align:cpu_tier=1GB,tier_policy=arc,{switch}")
