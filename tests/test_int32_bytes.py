"""Token ids as int32 bytes: the compiled loop (``_ids.c``) against its Python specification.

The adaptive shadow converts every finished request's new ids through ``int32_bytes`` (inline and on
the replay process's wire), so a difference here would change the shadow's tokens and with them its
choices. Both are held to ``struct.pack`` (the bytes) and to each other (the exceptions, type and
message).
"""

from __future__ import annotations

import struct
import sys

import numpy as np
import pytest

from marconi.integrations.common.prefix_delta import (
    INT32_BYTES_COMPILED,
    PrefixTokens,
    int32_bytes,
    int32_bytes_python,
    packed_ids,
)

LO, HI = -(1 << 31), (1 << 31) - 1


def test_the_compiled_loop_is_built() -> None:
    assert INT32_BYTES_COMPILED, "marconi.integrations.common._ids is not built: `pip install -e .` needs gcc"
    assert int32_bytes is not int32_bytes_python


@pytest.mark.parametrize("seed", range(4))
def test_both_give_struct_bytes(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for n in (0, 1, 7, 1152, 9000):
        ids = rng.integers(0, 1 << 31, size=n).tolist()
        want = struct.pack(f"{n}i", *ids)
        assert int32_bytes_python(ids) == want
        assert int32_bytes(ids) == want
        assert int32_bytes(tuple(ids)) == want
        assert np.frombuffer(int32_bytes(ids), dtype=np.int32).tolist() == ids


@pytest.mark.parametrize("seed", range(2))
def test_a_start_packs_the_tail_as_a_slice_would(seed: int) -> None:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 1 << 31, size=3000).tolist()
    for start in (0, 1, 1151, 2999, 3000, 3001, 1 << 40):
        want = struct.pack(f"{len(ids[start:])}i", *ids[start:])
        for pack in (int32_bytes_python, int32_bytes):
            assert pack(ids, start) == want == pack(tuple(ids), start), (pack, start)
            assert pack(ids, np.int64(min(start, 5))) == pack(ids[min(start, 5):])       # any integer start
        assert packed_ids(ids, start) == want


def test_only_the_tail_is_read_and_its_errors_name_the_whole_list_index() -> None:
    ids = [2.5, 1 << 40, 7, 8]                    # bad ids before the start are not read
    for pack in (int32_bytes_python, int32_bytes):
        assert pack(ids, 2) == struct.pack("2i", 7, 8)
        with pytest.raises(OverflowError, match=f"^token id {1 << 40} at 1 is outside int32$"):
            pack(ids, 1)
        with pytest.raises(ValueError, match="^start must be >= 0, got -1$"):
            pack([1, 2], -1)
        with pytest.raises(TypeError):
            pack([1, 2], 1.0)                     # type: ignore[arg-type]
    assert packed_ids([1, 2.5, 3], 1) == [2.5, 3]      # not packable: the tail itself, for the reader's error
    assert packed_ids([1, 2.5], 0) == [1, 2.5]


def test_edges_and_integer_kinds() -> None:
    ids = [LO, -1, 0, 1, HI, True, np.int64(7), np.uint16(65535), np.int32(-5)]
    want = struct.pack(f"{len(ids)}i", *ids)
    assert int32_bytes_python(ids) == want == int32_bytes(ids)
    assert np.frombuffer(int32_bytes(ids), dtype=np.int32).tolist() == [LO, -1, 0, 1, HI, 1, 7, 65535, -5]


def test_ints_on_both_sides_of_one_digit() -> None:
    # the compiled loop reads an int of one digit (under 2**30 in magnitude, sys.int_info) in place and
    # gives any other to CPython: both sides of that boundary, and ints made at run time (not cached)
    shift = sys.int_info.bits_per_digit
    ids = [(1 << shift) - 1, 1 << shift, -((1 << shift) - 1), -(1 << shift), (1 << shift) + 1, -(1 << shift) - 1,
           int("0"), int("-0"), int("255"), int("256"), int("-5"), int("-6"), HI - 1, LO + 1]
    want = struct.pack(f"{len(ids)}i", *ids)
    assert int32_bytes_python(ids) == want == int32_bytes(ids)
    assert int32_bytes(ids, 3) == want[12:]


class _Index:
    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


@pytest.mark.parametrize("ids, error, message", [
    ([1, 2, 2.5], TypeError, "token id 2.5 at 2 is not an integer"),
    ([1, "3"], TypeError, "token id '3' at 1 is not an integer"),
    ([None], TypeError, "token id None at 0 is not an integer"),
    ([np.float32(1.0)], TypeError, "token id np.float32(1.0) at 0 is not an integer"),
    ([0, HI + 1], OverflowError, f"token id {HI + 1} at 1 is outside int32"),
    ([LO - 1], OverflowError, f"token id {LO - 1} at 0 is outside int32"),
    ([1, 1 << 70], OverflowError, f"token id {1 << 70} at 1 is outside int32"),
    ([1, 2, _Index(1 << 40)], OverflowError, f"token id {1 << 40} at 2 is outside int32"),
    ([1, np.int64(1 << 40)], OverflowError, f"token id {1 << 40} at 1 is outside int32"),
    (np.arange(3), TypeError, "token ids must be a list or tuple, got ndarray"),
    (range(3), TypeError, "token ids must be a list or tuple, got range"),
])
def test_both_refuse_alike(ids: object, error: type, message: str) -> None:
    if isinstance(ids, list) and any(isinstance(x, np.floating) for x in ids) and np.__version__ < "2":
        message = message.replace("np.float32(1.0)", "1.0")          # numpy 1's repr
    for pack in (int32_bytes_python, int32_bytes):
        with pytest.raises(error) as info:
            pack(ids)                                     # type: ignore[arg-type]
        assert str(info.value) == message, pack


def test_a_custom_index_is_read_once_and_exactly() -> None:
    ids = [_Index(5), 6, _Index(HI)]
    assert int32_bytes(ids) == int32_bytes_python(ids) == struct.pack("3i", 5, 6, HI)


def test_a_list_changed_by_an_index_is_refused_not_read_past_its_end() -> None:
    ids: list = []

    class Shrinking:
        def __index__(self) -> int:
            ids.clear()
            return 1

    ids.extend([Shrinking(), 2, 3])
    with pytest.raises(RuntimeError, match="changed size"):
        int32_bytes(ids)


def test_the_wire_and_the_inline_arrays_use_it() -> None:
    ids = list(range(100, 1300))
    assert packed_ids(ids) == struct.pack(f"{len(ids)}i", *ids)
    assert packed_ids([1, 2.5]) == [1, 2.5]                 # not packable: passed on for the reader's error
    prompt, output = PrefixTokens().arrays(ids, [7, 8], [], 0)
    assert prompt.dtype == np.int32 and prompt.tolist() == ids and output.tolist() == [7, 8]
    assert not prompt.flags.writeable                        # the bytes' own memory, not a copy
