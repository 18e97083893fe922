"""DiskFree: RabbitMQ's disk_free_limit as flow control's stop, with its margin."""

from __future__ import annotations

import pytest

from mpbroker.config import DiskFreeLimit, MiB, parse_disk_free_limit
from mpbroker.flow import DiskFree

GiB_ = 1024 * MiB


@pytest.mark.parametrize(
    ("text", "limit"),
    [
        ("64MiB", DiskFreeLimit(bytes=64 * MiB)),
        ("67108864", DiskFreeLimit(bytes=67108864)),
        ("5%", DiskFreeLimit(share=0.05)),
        (" 2.5 % ", DiskFreeLimit(share=0.025)),
        ("0", DiskFreeLimit()),
    ],
)
def test_a_limit_is_a_size_or_a_share_of_the_filesystem(text: str, limit: DiskFreeLimit) -> None:
    assert parse_disk_free_limit(text) == limit


@pytest.mark.parametrize("text", ["lots", "100%", "-5%", "5 %%", ""])
def test_other_texts_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_disk_free_limit(text)


def test_producers_stop_below_the_limit_and_go_again_only_past_a_margin() -> None:
    disk = DiskFree(DiskFreeLimit(bytes=64 * MiB))
    total = 10 * GiB_
    assert disk.update(100 * MiB, total) is None
    assert disk.update(63 * MiB, total) is True and disk.stopped
    assert disk.update(64 * MiB, total) is None  # at the limit: not yet (a tenth more)
    assert disk.update(70 * MiB, total) is None
    assert disk.update(71 * MiB, total) is False and not disk.stopped


def test_a_share_is_taken_of_the_filesystem_and_the_margin_is_at_least_1_mib() -> None:
    disk = DiskFree(DiskFreeLimit(share=0.05))
    assert disk.update(4 * MiB, 100 * MiB) is True  # limit 5 MiB
    assert disk.update(5 * MiB + MiB // 2, 100 * MiB) is None  # margin: 1 MiB, not 0.5
    assert disk.update(6 * MiB, 100 * MiB) is False


def test_a_limit_of_0_never_stops() -> None:
    disk = DiskFree(DiskFreeLimit())
    assert disk.update(0, 100) is None and not disk.stopped
