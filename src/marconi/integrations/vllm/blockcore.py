"""The core of :class:`~marconi.integrations.vllm.policy.BlockEvictionState`: the pool's events, its
per-block verdicts and the victim index, in two implementations that make the same choices.

* :class:`PyBlockCore`, here: the specification, in Python.
* ``_blockcore.BlockCore``: the same in C (``_blockcore.c``, built by ``pip install -e .`` where a C
  compiler and Python's headers exist). One victim's bookkeeping costs ~10 µs in Python against
  vLLM's whole LRU eviction of ~1.7 µs; the compiled core is what brings it within reach
  (``docs/vllm-at-scale.md``).

:func:`new_core` returns the compiled core when it is built, else this one; ``MARCONI_BLOCK_CORE``
chooses: ``auto`` (default), ``python``, or ``c`` (ImportError naming the build when it is absent).
``tests/test_vllm_block_core.py`` replays random event streams through both and compares every
victim, every row and every snapshot.

The interface (both): ``core(group_is_attn, num_blocks, num_variants, effs_of)``, where
``effs_of(depth)`` gives a prefix's FLOP efficiency per variant (exact floats: they key the index's
levels); the events ``cached``, ``uncached``, ``released``, ``taken``; ``victim(alpha, variant)``
-> ``(block id, reason id)`` or None, changing nothing; ``evict(alpha, variant, count)``, up to
``count`` victims each taken and unkeyed before the next is picked (one call per allocation, not
three per victim); ``reason`` (the live list of reason ids);
``len()`` (free cached blocks); ``clear``; ``keys_of``, ``prefix_info``; and for views and checks
``rows``, ``snapshot``, ``members``, ``check_index``. No vLLM or numpy.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Hashable, Sequence

from marconi.core.registry import ConfigError
from marconi.integrations.vllm.victim_index import CANDIDATES, OTHERS, VictimIndex

__all__ = ["BLOCK_CORE_ENV", "KV_LEAF", "KV_INNER", "STATE", "DEAD", "PyBlockCore", "compiled_core", "new_core"]

#: The variable that chooses the core: ``auto`` (compiled when built), ``python`` or ``c``.
BLOCK_CORE_ENV = "MARCONI_BLOCK_CORE"
KV_LEAF, KV_INNER, STATE, DEAD = range(4)     # reason ids (policy.REASONS indexes them)

Verdict = tuple[bool, tuple[float, ...], int]       # (candidate, efficiency per variant, reason)
Verdicts = tuple[Verdict, Verdict, Verdict]         # a depth's valued ones: attention leaf, state, state kept


def compiled_core() -> type | None:
    """The compiled core's class, or None when the extension was not built."""
    try:
        from marconi.integrations.vllm._blockcore import BlockCore
    except ImportError:
        return None
    return BlockCore


def new_core(group_is_attn: Sequence[bool], num_blocks: int, num_variants: int,
             effs_of: Callable[[int], tuple[float, ...]]) -> Any:
    """A core for a pool of ``num_blocks`` blocks, chosen by ``MARCONI_BLOCK_CORE`` (module
    docstring). ConfigError for another value; ImportError for ``c`` without the extension."""
    choice = os.environ.get(BLOCK_CORE_ENV, "auto").strip().lower() or "auto"
    if choice not in ("auto", "python", "c"):
        raise ConfigError(f"{BLOCK_CORE_ENV}={choice!r}: use auto, python or c")
    compiled = None if choice == "python" else compiled_core()
    if compiled is None and choice == "c":
        raise ImportError(f"{BLOCK_CORE_ENV}=c but marconi.integrations.vllm._blockcore is not built: reinstall with "
                          "a C compiler and Python's headers (`pip install -e .`), or unset the variable")
    return (compiled or PyBlockCore)(tuple(group_is_attn), num_blocks, num_variants, effs_of)


class _Prefix:
    """One prefix hash: its parent prefix, depth, the cached blocks of each group (a shared empty
    frozenset for a group holding none: most prefixes hold one group), how many state (Mamba) and
    attention groups hold a block, and its valued verdicts (shared per depth)."""

    __slots__ = ("parent", "depth", "blocks", "n_state", "n_attn", "valued")

    def __init__(self, parent: Hashable | None, depth: int, num_groups: int, valued: Verdicts) -> None:
        self.parent = parent
        self.depth = depth
        self.blocks: list[set[int] | frozenset[int]] = [_EMPTY] * num_groups
        self.n_state = 0
        self.n_attn = 0
        self.valued = valued


class PyBlockCore:
    """The free cached blocks of one pool and their verdicts, in Python: the specification.

    Events in vLLM's order, O(log n) each: :meth:`cached`, :meth:`uncached`, :meth:`released`,
    :meth:`taken`. Prefix hashes may be any hashable values; block ids are ``0 .. num_blocks-1``.
    """

    def __init__(self, group_is_attn: Sequence[bool], num_blocks: int, num_variants: int,
                 effs_of: Callable[[int], tuple[float, ...]]) -> None:
        self._is_attn = tuple(bool(a) for a in group_is_attn)
        self._num_groups = len(self._is_attn)
        self._num_attn_groups = sum(self._is_attn)
        self._num_state_groups = self._num_groups - self._num_attn_groups
        self.num_blocks = int(num_blocks)
        self._effs_of = effs_of
        self._no_effs = (0.0,) * num_variants
        self._inner: Verdict = (False, self._no_effs, KV_INNER)        # attention below a child's attention
        self._worthless: Verdict = (True, self._no_effs, DEAD)         # a duplicate, or nothing a hit can use
        self._unkeyed: Verdict = (False, self._no_effs, DEAD)          # no hash at all
        self._prefixes: dict[Hashable, _Prefix] = {}
        # Per prefix hash, how many cached child prefixes hold an attention block (a child names its
        # parent when cached; the parent need not be cached): what a judgement asks of the children.
        self._kv_children: dict[Hashable, int] = {}
        self._block_keys: dict[int, list[tuple[Hashable, int]]] = {}   # block id -> its (prefix, group)s
        self._release_seq = [0] * self.num_blocks
        # Per block its verdict: one shared tuple per depth and kind, so a row write is one pointer
        # and "unchanged" one identity test.
        self._verdict: list[Verdict] = [self._unkeyed] * self.num_blocks
        self._reason: list[int] = [DEAD] * self.num_blocks
        # Prefixes whose blocks' rows are stale: cached() marks them (a request caches a chain of
        # blocks in one call, each the parent of the next, so eager refreshes would judge every
        # prefix twice) and _flush judges them once, before anything reads a row or the index.
        self._dirty: set[Hashable] = set()
        self._index = VictimIndex(num_blocks, num_variants)
        self._free_seq = [0] * self.num_blocks       # release number where free and cached, else 0
        self._seq = 0
        self._valued_by_depth: dict[int, Verdicts] = {}

    @property
    def reason(self) -> list[int]:
        if self._dirty:
            self._flush()
        return self._reason

    def __len__(self) -> int:
        return len(self._index)

    # ------------------------------------------------------------------ events
    def cached(self, block_id: int, prefix: Hashable, group_id: int, depth: int, parent: Hashable | None) -> None:
        """``block_id`` now answers lookups for ``prefix`` in group ``group_id``."""
        node = self._prefixes.get(prefix)
        if node is None:
            valued = self._valued_by_depth.get(depth)
            if valued is None:
                valued = self._valued(depth)
            node = self._prefixes[prefix] = _Prefix(parent, depth, self._num_groups, valued)
        ids = node.blocks[group_id]
        dirty = self._dirty
        if ids:
            ids.add(block_id)            # a second copy: the group's blocks become duplicates
        else:
            node.blocks[group_id] = {block_id}
            if self._is_attn[group_id]:
                node.n_attn += 1
                # The parent's blocks depend on this prefix only through "does it hold KVs".
                if node.n_attn == 1 and node.parent is not None:
                    kv_children = self._kv_children
                    kv_children[node.parent] = kv_children.get(node.parent, 0) + 1
                    dirty.add(node.parent)
            else:
                node.n_state += 1
        keys = self._block_keys.get(block_id)
        if keys is None:
            self._block_keys[block_id] = [(prefix, group_id)]
        else:
            keys.append((prefix, group_id))
        dirty.add(prefix)

    def uncached(self, block_id: int, prefix: Hashable, group_id: int) -> None:
        """``block_id`` no longer answers lookups for ``prefix`` (evicted or re-keyed)."""
        # The hot path of every eviction: only the blocks whose judgement can change are judged again
        # (the block itself; its group's copies when it was one of two; every block of the prefix
        # when "holds every state" or "holds every attention group" stops holding; the parent's
        # blocks when the prefix's last attention block goes).
        keys = self._block_keys.get(block_id)
        key = (prefix, group_id)
        if keys is None or key not in keys:
            return
        keys.remove(key)
        node = self._prefixes[prefix]
        blocks = node.blocks
        ids = blocks[group_id]
        refresh_all = refresh_parent = False
        if block_id in ids:
            ids.discard(block_id)
            if not ids:
                blocks[group_id] = _EMPTY
                if self._is_attn[group_id]:
                    refresh_all = node.n_attn == self._num_attn_groups      # the states' verdict reads it
                    node.n_attn -= 1
                    if not node.n_attn and node.parent is not None:
                        refresh_parent = True
                        kv_children = self._kv_children
                        left = kv_children[node.parent] - 1
                        if left:
                            kv_children[node.parent] = left
                        else:
                            del kv_children[node.parent]
                else:
                    refresh_all = node.n_state == self._num_state_groups    # every verdict reads it
                    node.n_state -= 1
        if keys:
            self._refresh_block(block_id)
        else:                       # still free, but now a block without a hash: no member, no value
            del self._block_keys[block_id]
            self._free_seq[block_id] = 0
            self._index.discard(block_id)
            self._verdict[block_id] = self._unkeyed
            self._reason[block_id] = DEAD
        if not node.n_attn and not node.n_state:
            del self._prefixes[prefix]
        elif refresh_all:
            self._refresh_node(node, prefix)
        elif len(ids) == 1:         # the copy left alone is no duplicate any more
            self._refresh_node(node, prefix, group_id)
        if refresh_parent:
            self._refresh_prefix(node.parent)

    def released(self, block_id: int) -> None:
        """A cached block entered the free queue: it is a candidate from now, recency = now."""
        if self._dirty:
            self._flush()
        self._seq += 1
        self._release_seq[block_id] = self._free_seq[block_id] = seq = self._seq
        verdict = self._verdict[block_id]
        self._index.place(block_id, CANDIDATES if verdict[0] else OTHERS, verdict[1], seq)

    def taken(self, block_id: int) -> None:
        """A block left the free queue (hit or allocation)."""
        self._free_seq[block_id] = 0
        self._index.discard(block_id)

    def victim(self, alpha: float, variant: int) -> tuple[int, int] | None:
        """``(block id, reason id)`` of the index's victim under ``(alpha, variant)``, or None."""
        if not len(self._index):
            return None
        if self._dirty:
            self._flush()
        block = self._index.victim(alpha, variant)
        return block, self._reason[block]

    def evict(self, alpha: float, variant: int, count: int) -> list[tuple[int, int]]:
        """Up to ``count`` victims, one after another: each is :meth:`victim`'s pick, then
        :meth:`taken` and :meth:`uncached` for each of its keys in order, before the next is picked
        (its parent may be the next leaf). ``[(block id, reason id)]``; fewer when none is left."""
        out = []
        for _ in range(count):
            picked = self.victim(alpha, variant)
            if picked is None:
                break
            out.append(picked)
            block = picked[0]
            self.taken(block)
            for prefix, group in self.keys_of(block):
                self.uncached(block, prefix, group)
        return out

    def clear(self) -> None:
        """Every hash dropped (release numbers kept)."""
        self._prefixes.clear()
        self._kv_children.clear()
        self._block_keys.clear()
        self._verdict = [self._unkeyed] * self.num_blocks
        self._reason = [DEAD] * self.num_blocks
        self._dirty.clear()
        self._free_seq = [0] * self.num_blocks
        self._index.clear()

    # ------------------------------------------------------------------ reads
    def keys_of(self, block_id: int) -> tuple[tuple[Hashable, int], ...]:
        return tuple(self._block_keys.get(block_id, ()))

    def prefix_info(self, prefix: Hashable) -> tuple[int, Hashable | None]:
        node = self._prefixes[prefix]
        return node.depth, node.parent

    def rows(self) -> tuple[list[int], list[int], list[Verdict]]:
        """``(free_seq, release_seq, verdicts)`` per block, as new lists (judgements flushed)."""
        if self._dirty:
            self._flush()
        return list(self._free_seq), list(self._release_seq), list(self._verdict)

    def snapshot(self) -> tuple[dict, dict, dict]:
        """``(prefixes, kv_children, block_keys)``: ``{prefix: (parent, depth, [sorted block ids per
        group], n_state, n_attn)}``, ``{prefix: count}``, ``{block: [(prefix, group), ...]}``."""
        if self._dirty:
            self._flush()
        prefixes = {p: (n.parent, n.depth, [sorted(ids) for ids in n.blocks], n.n_state, n.n_attn)
                    for p, n in self._prefixes.items()}
        assert all(isinstance(ids, set) and ids for n in self._prefixes.values() for ids in n.blocks if ids), \
            "an empty group set kept"
        assert all(n.valued is self._valued_by_depth[n.depth] for n in self._prefixes.values()), \
            "verdicts of another depth"
        assert self._reason == [v[2] for v in self._verdict], "reason rows drifted"
        return prefixes, dict(self._kv_children), {b: list(k) for b, k in self._block_keys.items()}

    def members(self) -> dict[int, tuple[int, tuple[float, ...], int]]:
        if self._dirty:
            self._flush()
        return dict(self._index.members())

    def check_index(self) -> None:
        self._index.check_invariants()

    # ------------------------------------------------------------------ bookkeeping
    def _flush(self) -> None:
        """Judge the blocks of every prefix cached() marked (each once), as eagerly as before."""
        dirty, self._dirty = self._dirty, set()
        for prefix in dirty:
            self._refresh_prefix(prefix)

    def _refresh_prefix(self, prefix: Hashable) -> None:
        node = self._prefixes.get(prefix)
        if node is not None:
            self._refresh_node(node, prefix)

    def _verdicts(self, node: _Prefix, prefix: Hashable) -> tuple[Verdict, Verdict]:
        """The verdicts of ``node``'s attention blocks and of its state blocks, each the only copy in
        its group, from the node's counts (``policy.judge`` is the definition from the sets)."""
        kv_children = self._kv_children.get(prefix, 0)
        valued = node.valued
        if node.n_state != self._num_state_groups:              # not every state: nothing a hit can use
            return (self._inner if kv_children else self._worthless), self._worthless
        attn = self._inner if kv_children else valued[0]
        if node.n_attn != self._num_attn_groups:
            return attn, self._worthless
        return attn, (valued[1] if kv_children <= 1 else valued[2])

    def _refresh_node(self, node: _Prefix, prefix: Hashable, only_group: int = -1) -> None:
        """Bring the rows (and the index) of ``node``'s blocks, or of group ``only_group``'s, up to date."""
        attn, state = self._verdicts(node, prefix)
        is_attn, block_keys = self._is_attn, self._block_keys
        verdicts, reasons, free_seq = self._verdict, self._reason, self._free_seq
        for group_id, ids in enumerate(node.blocks):
            if not ids or (only_group >= 0 and group_id != only_group):
                continue
            verdict = (attn if is_attn[group_id] else state) if len(ids) == 1 else self._worthless
            for block_id in ids:
                if verdicts[block_id] is verdict:
                    continue            # unchanged: the rows and the index already say so
                if len(block_keys[block_id]) > 1:                 # its deepest key decides
                    self._refresh_block(block_id)
                    continue
                verdicts[block_id] = verdict
                reasons[block_id] = verdict[2]
                seq = free_seq[block_id]
                if seq:                 # a member (not free: no member, see taken and uncached)
                    self._index.place(block_id, CANDIDATES if verdict[0] else OTHERS, verdict[1], seq)

    def _refresh_block(self, block_id: int) -> None:
        keys = self._block_keys.get(block_id)
        if not keys:
            verdict = self._unkeyed
        else:
            # A block holds one primary hash; partial (sub-block) entries are extra lookup keys on the
            # same block. Rank it by its deepest key: that is the prefix its contents complete.
            prefix, group_id = keys[0] if len(keys) == 1 else max(keys, key=lambda k: self._prefixes[k[0]].depth)
            node = self._prefixes[prefix]
            if len(node.blocks[group_id]) > 1:
                verdict = self._worthless
            else:
                attn, state = self._verdicts(node, prefix)
                verdict = attn if self._is_attn[group_id] else state
        if verdict is self._verdict[block_id]:
            return                  # unchanged: the rows and the index already say so
        self._verdict[block_id] = verdict
        self._reason[block_id] = verdict[2]
        seq = self._free_seq[block_id]
        if seq:                     # a member (not free: no member, see taken and uncached)
            self._index.place(block_id, CANDIDATES if verdict[0] else OTHERS, verdict[1], seq)

    def _valued(self, depth: int) -> Verdicts:
        """The verdicts of a block holding something a hit can use at ``depth`` (shared per depth)."""
        effs = tuple(self._effs_of(depth))
        valued = self._valued_by_depth[depth] = ((True, effs, KV_LEAF), (True, effs, STATE), (False, effs, STATE))
        return valued


_EMPTY: frozenset[int] = frozenset()          # a group of a prefix holding no block
