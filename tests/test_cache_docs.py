"""docs/cache-api.md names only what exists: attributes, keyword arguments and protocol methods.

The page once promised ``result.inserted_len``, ``result.admitted_checkpoints`` and an admission
method ``final_checkpoints`` that the code never had; this test reads the page's code blocks and
backticked names and looks each one up in the code.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import numpy as np
import pytest

from marconi.core.admission import AdmissionContext, AdmissionPolicy, FinalPlan, MarconiAdmission, MatchResult
from marconi.core.cache import CachedPrefix, InsertResult, PayloadOps, PrefixCache, RequestHandle
from marconi.core.eviction import LRU, EvictionPolicy, FlopAware
from marconi.core.stats import CacheStats
from marconi.core.model import ModelSpec, get_model
from marconi.sparse.admission import SparseDPAdmission

DOC = Path(__file__).resolve().parents[1] / "docs" / "cache-api.md"

# what each variable name on the page stands for
OBJECTS = {
    "cache": PrefixCache, "handle": RequestHandle, "handle.match": MatchResult, "prefix": CachedPrefix,
    "result": InsertResult, "cache.stats": CacheStats, "spec": ModelSpec, "ctx": AdmissionContext,
}
CALLS = {"PrefixCache": PrefixCache.__init__, "cache.begin": PrefixCache.begin, "cache.finish": PrefixCache.finish,
         "cache.insert_prefill": PrefixCache.insert_prefill, "FinalPlan": FinalPlan}


def _code_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def _has(cls: type, name: str) -> bool:
    if name in getattr(cls, "__dataclass_fields__", {}) or name in getattr(cls, "_fields", ()):
        return True
    if hasattr(cls, name) or name in getattr(cls, "__annotations__", {}):
        return True
    # attributes set in __init__: look at a real instance
    return cls is PrefixCache and hasattr(PrefixCache("paper-7b", 1e11), name)


def _attribute_uses(text: str) -> set[tuple[str, str]]:
    uses = set()
    names = sorted(OBJECTS, key=len, reverse=True)  # "handle.match.x" before "handle.x"
    pattern = re.compile(r"(?<![\w.])(" + "|".join(re.escape(n) for n in names) + r")\.(\w+)")
    for code in _code_blocks(text) + re.findall(r"`([^`]+)`", text):
        for base, attr in pattern.findall(code):
            uses.add((base, attr))
    return uses


def _keyword_uses(text: str) -> set[tuple[str, str]]:
    uses = set()
    for code in _code_blocks(text) + re.findall(r"`([^`]+)`", text):
        for call, inside in re.findall(r"(PrefixCache|cache\.begin|cache\.finish|cache\.insert_prefill|FinalPlan)"
                                       r"\(((?:[^()]|\([^()]*\))*)\)", code, flags=re.S):
            for kw in re.findall(r"(?:^|[,\s(])(\w+)\s*=(?!=)", inside):
                uses.add((call, kw))
    return uses


def _protocol_methods(text: str) -> set[tuple[str, str]]:
    uses = set()
    for code in _code_blocks(text):
        for cls, body in re.findall(r"class (\w+)\(Protocol\):\n((?:    .*\n?)+)", code):
            uses.update((cls, m) for m in re.findall(r"def (\w+)\(", body))
    return uses


def test_the_checker_catches_the_names_the_page_once_got_wrong():
    stale = ("```python\nresult.inserted_len, result.admitted_checkpoints, result.cached\n"
             "class AdmissionPolicy(Protocol):\n    def final_checkpoints(self, ctx, total_len) -> FinalPlan\n```")
    attrs = {(b, a) for b, a in _attribute_uses(stale) if not _has(OBJECTS[b], a)}
    assert attrs == {("result", "inserted_len"), ("result", "admitted_checkpoints")}
    protocols = {"AdmissionPolicy": MarconiAdmission, "PayloadOps": PayloadOps}
    assert {(c, m) for c, m in _protocol_methods(stale) if not hasattr(protocols[c], m)} == \
        {("AdmissionPolicy", "final_checkpoints")}


def test_every_attribute_the_page_uses_exists():
    uses = _attribute_uses(DOC.read_text())
    assert ("cache", "finish_checkpoints") in uses and ("result", "admitted") in uses  # the parser sees them
    missing = sorted(f"{base}.{attr}" for base, attr in uses if not _has(OBJECTS[base], attr))
    assert not missing, f"docs/cache-api.md names attributes the code lacks: {missing}"


def test_every_keyword_the_page_passes_is_accepted():
    uses = _keyword_uses(DOC.read_text())
    assert ("PrefixCache", "prefill_chunk_len") in uses and ("cache.finish", "states") in uses
    missing = []
    for call, kw in uses:
        target = CALLS[call]
        params = target._fields if call == "FinalPlan" else inspect.signature(target).parameters
        if kw not in params:
            missing.append(f"{call}({kw}=...)")
    assert not missing, f"docs/cache-api.md passes keywords the code does not take: {sorted(missing)}"


@pytest.mark.parametrize("admission, eviction", [(MarconiAdmission(), LRU()), (SparseDPAdmission(), FlopAware())])
def test_every_protocol_method_the_page_lists_exists(admission, eviction):
    protocols = {"AdmissionPolicy": type(admission), "PayloadOps": PayloadOps, "EvictionPolicy": type(eviction)}
    uses = _protocol_methods(DOC.read_text())
    assert {c for c, _ in uses} == set(protocols)
    missing = sorted(f"{c}.{m}" for c, m in uses if not hasattr(protocols[c], m))
    assert not missing, f"docs/cache-api.md lists protocol methods the code lacks: {missing}"
    assert all(hasattr(AdmissionPolicy, m) for c, m in uses if c == "AdmissionPolicy")
    assert all(hasattr(EvictionPolicy, m) for c, m in uses if c == "EvictionPolicy")


def test_the_eviction_protocol_fields_the_page_lists_exist():
    """The page's ``EvictionPolicy`` block names fields as well as methods: each is on the protocol
    and on every built-in policy."""
    (body,) = re.findall(r"class EvictionPolicy\(Protocol\):\n((?:    .*\n?)+)", DOC.read_text())
    fields = re.findall(r"^    (\w+): ", body, flags=re.M)
    assert "evicts_inner_nodes" in fields
    for name in fields:
        assert name in EvictionPolicy.__annotations__, name
        for policy in (LRU(), FlopAware(alpha=1.0)):
            assert hasattr(policy, name), (type(policy).__name__, name)


def test_the_page_walkthrough_runs():
    """The page's step-by-step calls, run on a simulation cache."""
    cache = PrefixCache(get_model("paper-7b"), 1e11, admission="marconi", eviction="lru", clock=None,
                        payloads=None, prefill_chunk_len=None)
    inp = np.arange(100, dtype=np.int32)
    cache.process(inp, np.arange(1000, 1010))
    handle = cache.begin(np.concatenate((inp[:60], np.arange(5000, 5020))))
    assert handle.prefill_checkpoints == (60,) and handle.branch_len == 60
    prefix = cache.cached_prefix(handle)
    assert (prefix.length, prefix.kv, prefix.ssm) == (0, [], None)
    wanted = cache.finish_checkpoints(handle, np.arange(7000, 7004))
    result = cache.finish(handle, np.arange(7000, 7004))
    assert result.admitted == wanted == (60, 84) and result.cached and result.inserted_tokens == 24
    with cache.lock:
        cache.check_invariants()
