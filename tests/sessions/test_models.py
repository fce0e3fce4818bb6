"""Token id packing and the value objects of the turn tree."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessions.models import MAX_TOKEN_ID, NewTurn, Session, pack_token_ids, unpack_token_ids


@given(st.lists(st.integers(min_value=0, max_value=MAX_TOKEN_ID), max_size=300))
def test_pack_round_trips_any_uint32(token_ids: list[int]) -> None:
    packed = pack_token_ids(token_ids)
    assert len(packed) == 4 * len(token_ids)
    assert unpack_token_ids(packed) == tuple(token_ids)


def test_pack_is_little_endian_uint32_beyond_uint16() -> None:
    packed = pack_token_ids([1, 65535, 65536, 151_643, MAX_TOKEN_ID])
    assert packed[:4] == b"\x01\x00\x00\x00"
    assert packed[8:12] == b"\x00\x00\x01\x00"  # 65536 does not fit in 16 bits
    assert struct.unpack("<5I", packed) == (1, 65535, 65536, 151_643, MAX_TOKEN_ID)
    assert unpack_token_ids(packed) == (1, 65535, 65536, 151_643, MAX_TOKEN_ID)


@pytest.mark.parametrize("bad", [-1, MAX_TOKEN_ID + 1, True, 1.0, "3"])
def test_pack_rejects_non_uint32(bad: object) -> None:
    with pytest.raises(ValueError, match="uint32"):
        pack_token_ids([1, bad])  # type: ignore[list-item]


def test_unpack_rejects_ragged_bytes() -> None:
    with pytest.raises(ValueError, match="multiple of 4"):
        unpack_token_ids(b"\x00\x01\x02")


def test_new_turn_validates_role_and_token_ids() -> None:
    assert NewTurn("tool", [5]).token_ids == [5]
    with pytest.raises(ValueError, match="role"):
        NewTurn("root", [1])
    with pytest.raises(ValueError, match="role"):
        NewTurn("narrator", [1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="uint32"):
        NewTurn("user", [-5])


def test_session_etag_and_head() -> None:
    session = Session(
        id="s", tenant="t", model="m", created_ms=0, version=7, root_turn_id="r",
        branches={"main": "a", "b1": "r"},
    )  # fmt: skip
    assert session.etag == '"v7"'
    assert session.head() == "a"
    assert session.head("b1") == "r"
    with pytest.raises(KeyError):
        session.head("nope")
