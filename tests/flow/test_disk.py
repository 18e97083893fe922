"""DiskFree: RabbitMQ's disk_free_limit as flow control's stop, with its margins; and the
arithmetic of the most one append of a store may take (append_need, append_margin)."""

from __future__ import annotations

import pytest

from mpbroker.config import Config, DiskFreeLimit, KiB, MiB, parse_disk_free_limit, replace_settings
from mpbroker.flow import DiskFree, SqliteFiles, append_margin, append_need, commit_pages
from mpbroker.flow._disk import pages_for_rows

GiB_ = 1024 * MiB
FILES = SqliteFiles(
    page_bytes=4096,
    checkpoint_pages=1000,
    new_segment_pages=24,
    message_overhead=256,
    pending_overhead=256,
)
FRAME = 4096 + 24


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


def test_the_stop_keeps_the_margin_above_the_limit_and_the_release_a_tenth_more() -> None:
    disk = DiskFree(DiskFreeLimit(bytes=64 * MiB), margin=20 * MiB)
    total = 10 * GiB_
    assert disk.stop_point(total) == 84 * MiB
    assert disk.update(84 * MiB, total) is None
    assert disk.update(84 * MiB - 1, total) is True
    assert disk.update(90 * MiB, total) is None  # a tenth of the limit more: 90.4 MiB
    assert disk.update(91 * MiB, total) is False
    assert DiskFree(DiskFreeLimit(), margin=20 * MiB).stop_point(total) == 0


def test_an_append_has_room_while_the_limit_holds_after_it_and_the_others_writes() -> None:
    disk = DiskFree(DiskFreeLimit(bytes=64 * MiB), margin=30 * MiB, reserved=20 * MiB)
    total = 10 * GiB_
    assert disk.room_for(5 * MiB, 89 * MiB, total)
    assert not disk.room_for(5 * MiB, 89 * MiB - 1, total)
    # Stopped or not: what is on its way is written while it fits.
    disk.update(80 * MiB, total)
    assert disk.stopped and disk.room_for(1 * MiB, 85 * MiB, total)
    assert DiskFree(DiskFreeLimit(), reserved=20 * MiB).room_for(5 * MiB, 0, total)


def test_rows_that_fit_a_page_count_twice_their_bytes_and_larger_ones_their_overflow() -> None:
    assert pages_for_rows([], 4096) == 0
    assert pages_for_rows([100] * 41, 4096) == 3  # 4100 bytes: twice that is 3 pages
    assert pages_for_rows([4061], 4096) == 2  # the largest row kept whole on a leaf
    # 1 MiB: SQLite keeps 489 + (1 MiB - 489) % 4092 = 1024 bytes on the leaf (twice that
    # is a page), and 1 MiB - 1024 bytes on 256 overflow pages of 4092.
    assert pages_for_rows([MiB], 4096) == 257
    # Whatever the rows, never more than twice their bytes in pages, plus one.
    for size in (4062, 4100, 6000, 8200, 20_000, 100_000):
        assert pages_for_rows([size] * 10, 4096) <= 2 * size * 10 // 4096 + 1


def test_a_commit_rewrites_pages_for_each_place_it_inserts_at() -> None:
    assert commit_pages([100] * 41, places=1, page_bytes=4096) == 3 + 3 + 8
    assert commit_pages([100] * 41, places=5, page_bytes=4096) == 3 + 15 + 8


def test_an_append_takes_its_commits_twice_a_checkpoint_each_and_a_new_segment() -> None:
    new_segment = 2 * 24 * FRAME + 2 * 32 * KiB
    assert append_need([100], FILES) == (1000 + 200) * FRAME + new_segment
    assert append_need([100, 10], FILES) == (2000 + 220) * FRAME + new_segment


def test_the_margin_of_an_append_follows_the_group_commit_settings() -> None:
    config = Config()
    queue = append_margin(config, FILES, topic=False)
    topic = append_margin(config, FILES, topic=True)
    # The defaults (1 MiB frames, 128 KiB and 256 messages a commit), as the docs say.
    assert (queue, topic) == (7_407_376, 11_931_136)
    assert topic - queue > 1000 * FRAME  # the registry's checkpoint
    bigger_commits = replace_settings(config, "store", commit_max_bytes=512 * KiB)
    assert append_margin(bigger_commits, FILES, topic=False) > queue + 2 * 384 * KiB * 2
    bigger_frames = replace_settings(config, "stomp", max_frame_bytes=4 * MiB)
    assert append_margin(bigger_frames, FILES, topic=False) > queue + 2 * 3 * MiB
    one_by_one = replace_settings(config, "store", group_commit=False)
    smaller = append_margin(one_by_one, FILES, topic=False)
    assert (smaller - 2 * 24 * FRAME - 2 * 32 * KiB) // FRAME == 1000 + 2 * (257 + 6 + 8)
