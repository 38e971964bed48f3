"""The cache form of feature rows (streamnb.features.rows.rows_to_bytes): the C
``gap_rows`` and the numpy/msgpack code it stands for, each against msgpack's own packing
of the documented form ``[2, n_tokens, first bucket, gaps as <u2]`` (the oracle) and read
back by ``Row.from_bytes``."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from streamnb.features import rows as rows_module
from streamnb.features.rows import Row, rows_to_bytes
from tests.helpers.c_steps import c_or_reference


@pytest.fixture(params=["C", "numpy"])
def gap_path(request, monkeypatch):
    return c_or_reference(request, monkeypatch, rows_module, "GAP_ROWS")


def oracle(row: Row) -> bytes | None:
    """msgpack.packb of the gaps form, None where a row takes the map form."""
    idx = row.indices.astype(np.int64)
    gaps = np.diff(idx)
    if idx.size == 0 or idx[0] < 0 or row.n_tokens < 0 or ((gaps <= 0) | (gaps >= 1 << 16)).any():
        return None
    return msgpack.packb([2, row.n_tokens, int(idx[0]), gaps.astype("<u2").tobytes()],
                         use_bin_type=True)


def random_rows(rng: np.random.Generator, n: int) -> list[Row]:
    out = []
    for _ in range(n):
        k = int(rng.choice([0, 1, 2, 40, 300, 2500, 40000]))
        top = int(rng.choice([50, 70_000, 1 << 20, (1 << 31) - 1]))
        idx = np.unique(rng.integers(0, top, size=k)).astype(np.int32)
        n_tokens = int(rng.choice([0, 3, 127, 128, 255, 256, 65535, 65536, 1 << 32, 1 << 40]))
        out.append(Row(indices=idx, values=np.ones(idx.size), n_tokens=n_tokens, binary=True))
    return out


def test_rows_are_packed_as_msgpack_packs_the_gaps_form(gap_path):
    rng = np.random.default_rng(52)
    for _ in range(40):
        rows = random_rows(rng, int(rng.integers(1, 30)))
        got = rows_to_bytes(rows)
        for row, data in zip(rows, got, strict=True):
            want = oracle(row)
            if want is not None:
                assert data == want
            else:  # the map form, which reads back as the row
                assert msgpack.unpackb(data, raw=False)["type"] == "row"
            assert Row.from_bytes(data) == row


def test_rows_that_do_not_fit_the_gaps_form_take_the_map_form(gap_path):
    rows = [Row(indices=np.array([5, 5 + (1 << 16)], dtype=np.int32), values=np.ones(2), n_tokens=2),
            Row(indices=np.array([], dtype=np.int32), values=np.ones(0), n_tokens=0),
            Row(indices=np.array([-3, 4], dtype=np.int32), values=np.ones(2), n_tokens=2),
            Row(indices=np.array([7], dtype=np.int32), values=np.ones(1), n_tokens=1)]
    got = rows_to_bytes(rows)
    assert [oracle(r) is None for r in rows] == [True, True, True, False]
    for data in got[:3]:
        assert msgpack.unpackb(data, raw=False)["type"] == "row"
    assert got[3] == b"\x94\x02\x01\x07\xc4\x00"  # [2, 1, 7, b""], by hand
    assert Row.from_bytes(got[0]) == rows[0] and Row.from_bytes(got[3]) == rows[3]


def test_a_long_row_takes_a_bin_16_header(gap_path):
    idx = np.arange(0, 3 * 200, 3, dtype=np.int32)  # 199 gaps of 3: 398 bytes
    data = rows_to_bytes([Row(indices=idx, values=np.ones(idx.size), n_tokens=1000, binary=True)])[0]
    assert data[:7] == bytes([0x94, 0x02, 0xcd, 0x03, 0xe8, 0x00, 0xc5]) and data[7:9] == (398).to_bytes(2, "big")
    assert data[9:11] == b"\x03\x00" and len(data) == 9 + 398


def test_a_step_down_the_width_of_int32_is_no_gap(gap_path):
    # (2**31 - 1 to -2**31: a difference whose low 32 bits read as a gap of 1)
    row = Row(indices=np.array([2**31 - 1, -2**31], dtype=np.int32), values=np.ones(2), n_tokens=2)
    assert oracle(row) is None
    assert msgpack.unpackb(rows_to_bytes([row])[0], raw=False)["type"] == "row"
