"""How many workers of each kind: 0 = one per usable CPU, as many as fit, and the
partitions a data dir was made with."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpbroker.config import Config, replace_settings
from mpbroker.memory import check, fit_workers

KEYS = ("broker.gateways", "broker.p2p_workers", "broker.pubsub_workers", "replay.workers")


def zeros(max_memory: str = "256MiB") -> Config:
    config = replace_settings(Config(), "broker", gateways=0, p2p_workers=0, pubsub_workers=0)
    config = replace_settings(config, "replay", workers=0)
    return replace_settings(config, "memory", max_memory=max_memory)


def counts(config: Config) -> tuple[int, int, int, int]:
    b = config.broker
    return (b.gateways, b.p2p_workers, b.pubsub_workers, config.replay.workers)


def test_zero_is_one_per_usable_cpu_when_it_fits() -> None:
    fitted = fit_workers(zeros("2GiB"), cpus=4)
    assert counts(fitted.config) == (4, 4, 4, 4)
    assert [c.setting for c in fitted.counts] == list(KEYS)
    assert all(c.why == "0: one per usable CPU (4)" for c in fitted.counts)
    assert fitted.notes == ()


def test_replay_workers_are_at_most_one_per_pubsub_worker() -> None:
    config = replace_settings(zeros("2GiB"), "broker", pubsub_workers=2)
    fitted = fit_workers(config, cpus=4)
    assert counts(fitted.config) == (4, 4, 2, 2)
    replay = fitted.counts[3]
    assert replay.why == "0: one per usable CPU (4), at most one per pubsub worker (2)"


def test_what_does_not_fit_is_trimmed_replay_and_pipelines_first() -> None:
    # 256 MiB holds two gateways and one pipeline of each kind, not two of each.
    fitted = fit_workers(zeros(), cpus=2)
    assert counts(fitted.config) == (2, 1, 1, 1)
    assert check(fitted.config) is None
    assert len(fitted.notes) == 3
    assert fitted.notes[0] == (
        "p2p workers: 1 of 2: more would not fit in memory.max_memory = 256 MiB "
        "(broker.p2p_workers = 0); a new data dir keeps this count"
    )
    assert fitted.counts[1].why.endswith(
        "trimmed to 1 of 2: more would not fit in memory.max_memory = 256 MiB"
    )


def test_as_many_gateways_as_fit_on_a_large_machine() -> None:
    config = replace_settings(Config(), "broker", gateways=0)
    fitted = fit_workers(config, cpus=64)
    gateways = fitted.config.broker.gateways
    assert 1 <= gateways < 64 and check(fitted.config) is None
    more = replace_settings(fitted.config, "broker", gateways=gateways + 1)
    assert check(more) is not None  # the most that fit
    assert fitted.notes == (
        f"gateways: {gateways} of 64: more would not fit in memory.max_memory = 256 MiB "
        "(broker.gateways = 0)",
    )


def test_explicit_counts_are_never_changed() -> None:
    config = replace_settings(Config(), "broker", gateways=64)
    fitted = fit_workers(config, cpus=2)
    assert fitted.config == config and fitted.notes == ()
    assert [c.why for c in fitted.counts] == ["set", "the default", "the default", "the default"]


def test_zero_keeps_the_partitions_the_data_dir_was_made_with() -> None:
    fitted = fit_workers(zeros("2GiB"), cpus=4, pinned=(3, 1))
    assert counts(fitted.config) == (4, 3, 1, 1)
    assert fitted.counts[1].why == "0: the 3 the data dir's stores were made with"
    # Pinned counts are not trimmed: the data dir needs them.
    assert counts(fit_workers(zeros(), cpus=2, pinned=(1, 1)).config)[1:3] == (1, 1)


@given(cpus=st.integers(1, 16), memory=st.sampled_from(["128MiB", "256MiB", "1GiB", "4GiB"]))
def test_every_count_resolves_to_at_least_one_and_at_most_the_cpus(cpus: int, memory: str) -> None:
    fitted = fit_workers(zeros(memory), cpus=cpus)
    assert all(1 <= n <= cpus for n in counts(fitted.config))
    assert fitted.config.replay.workers <= fitted.config.broker.pubsub_workers
    if check(fitted.config) is not None:
        assert counts(fitted.config) == (1, 1, 1, 1)  # nothing left to trim


@pytest.mark.parametrize("cpus", [1, 2])
def test_defaults_are_unchanged(cpus: int) -> None:
    fitted = fit_workers(Config(), cpus=cpus)
    assert counts(fitted.config) == (cpus, 1, 1, 1)
