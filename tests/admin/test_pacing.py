"""How often a worker publishes: its interval, unless snapshots take too much of its time."""

from __future__ import annotations

from mpbroker.admin import stats_period_ms
from mpbroker.admin._pacing import MAX_SHARE


def test_a_cheap_snapshot_comes_every_interval() -> None:
    assert stats_period_ms(500, 0.3) == 500
    assert stats_period_ms(500, 500 * MAX_SHARE) == 500


def test_a_costly_snapshot_is_put_off_so_it_takes_at_most_its_share() -> None:
    assert stats_period_ms(500, 60.0) == 1200  # 60 ms every 1.2 s: 5 %
    assert stats_period_ms(500, 60.0, share=0.1) == 600
    assert stats_period_ms(500, 25.01) == 501  # rounded up, never below the share
