"""The plugin's pick of plain (hashless) free blocks: the first ``want`` in vLLM's queue order, as a
scan from the head finds them, whichever end of the queue they lie at (vLLM-free: a linked list of
stand-in blocks with vLLM's ``prev_free_block``/``next_free_block`` links)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from marconi.integrations.vllm.plugin import first_plain_blocks


class _Block:
    """A stand-in block that counts the reads of its hash (``reads``: the ids read, in order)."""

    reads: list[int] = []

    def __init__(self, block_id: int, block_hash: bytes | None) -> None:
        self.block_id, self._hash = block_id, block_hash

    @property
    def block_hash(self) -> bytes | None:
        _Block.reads.append(self.block_id)
        return self._hash


def _queue(hashed: list[bool]) -> tuple[SimpleNamespace, list[_Block]]:
    blocks = [_Block(i, b"h" if h else None) for i, h in enumerate(hashed)]
    head, tail = SimpleNamespace(block_hash=None), SimpleNamespace(block_hash=None)
    chain = [head, *blocks, tail]
    for a, b in zip(chain, chain[1:]):
        a.next_free_block, b.prev_free_block = b, a
    head.prev_free_block = tail.next_free_block = None
    return SimpleNamespace(fake_free_list_head=head, fake_free_list_tail=tail), blocks


def _from_head(blocks: list[_Block], want: int) -> list[int]:
    return [b.block_id for b in blocks if b._hash is None][:want]


@pytest.mark.parametrize("seed", range(4))
def test_the_pick_is_a_scan_from_the_heads(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(400):
        n = rng.randrange(1, 40)
        where = rng.choice(["tail", "head", "anywhere", "ends"])
        if where == "tail":
            hashed = [i < n - rng.randrange(n + 1) for i in range(n)]
        elif where == "head":
            hashed = [i >= rng.randrange(n + 1) for i in range(n)]
        elif where == "ends":
            k = rng.randrange(n + 1)
            hashed = [not (i < k // 2 or i >= n - (k - k // 2)) for i in range(n)]
        else:
            hashed = [rng.random() < 0.7 for _ in range(n)]
        plain = hashed.count(False)
        if not plain:
            continue
        queue, blocks = _queue(hashed)
        for want in {1, plain, rng.randrange(1, plain + 1)}:
            got = [b.block_id for b in first_plain_blocks(queue, want, plain, n)]
            assert got == _from_head(blocks, want), (hashed, want)
            # an overcount of the plain blocks only makes the walk longer, never the pick different
            over = [b.block_id for b in first_plain_blocks(queue, want, plain + rng.randrange(1, 5), n)]
            assert over == got


def test_plain_blocks_at_the_tail_are_found_without_walking_the_queue() -> None:
    queue, blocks = _queue([True] * 1000 + [False] * 3)
    _Block.reads.clear()
    got = first_plain_blocks(queue, 2, 3, len(blocks))
    assert [b.block_id for b in got] == [1000, 1001]
    assert len(_Block.reads) <= 8, len(_Block.reads)         # a scan from the head alone reads 1,002
