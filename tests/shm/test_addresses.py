"""Connections per client address: each gateway counts in its own row, everyone adds up the
column of an address; a restarted gateway clears its row."""

from __future__ import annotations

import os
import stat

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpbroker.shm import AddressCounts, SegmentNotFoundError, segment_name, shm_path
from mpbroker.shm._addresses import BUCKETS, bucket


def test_counts_add_up_over_the_gateways_and_a_cleared_row_drops_out(instance: str) -> None:
    name = segment_name(instance, "addresses")
    counts = AddressCounts.create(name, 3)
    other = AddressCounts.attach(name)  # another gateway's handle on the same segment
    try:
        assert stat.S_IMODE(os.stat(shm_path(name)).st_mode) == 0o600
        assert other.rows == 3
        counts.add(0, "10.0.0.1", 2)
        other.add(2, "10.0.0.1", 1)
        other.add(1, "10.0.0.2", 5)
        assert counts.total("10.0.0.1") == other.total("10.0.0.1") == 3
        other.add(2, "10.0.0.1", -1)
        assert counts.total("10.0.0.1") == 2
        counts.clear(0)
        assert counts.total("10.0.0.1") == 0
        assert counts.total("10.0.0.2") == 5
    finally:
        other.close()
        counts.close()
        counts.unlink()


def test_attach_without_the_segment_is_an_error(instance: str) -> None:
    with pytest.raises(SegmentNotFoundError):
        AddressCounts.attach(segment_name(instance, "addresses"))


@settings(max_examples=50)
@given(st.lists(st.ip_addresses().map(str), min_size=1, max_size=20))
def test_an_address_is_never_counted_short(addresses: list[str]) -> None:
    """Sharing a bucket may count other addresses in, never an address's own out."""
    assert all(0 <= bucket(a) < BUCKETS for a in addresses)
    expected = {a: addresses.count(a) for a in addresses}
    per_bucket: dict[int, int] = {}
    for a in addresses:
        per_bucket[bucket(a)] = per_bucket.get(bucket(a), 0) + 1
    for a, n in expected.items():
        assert per_bucket[bucket(a)] >= n
