"""The least-squares fit of B = t_rcv + n*m*t_fltr + r*t_tx, on synthetic data."""

from __future__ import annotations

import random

import pytest

from mpbroker.loadgen.model import Fit, ModelPoint, fit, solve

T_RCV, T_FLTR, T_TX = 40e-6, 1.6e-7, 12e-6


def _b(n: int, m: int, r: int) -> float:
    return T_RCV + n * m * T_FLTR + r * T_TX


def _grid(replications: tuple[int, ...]) -> list[ModelPoint]:
    return [
        ModelPoint(n, m, r, _b(n, m, r))
        for r in replications
        for m in (1, 5)
        for n in (1, 10, 100, 1000, 10_000)
        if r <= n
    ]


def test_exact_data_gives_the_parameters_back() -> None:
    result = fit(_grid((1, 4, 10)))
    assert result.t_rcv == pytest.approx(T_RCV, rel=1e-6)
    assert result.t_fltr == pytest.approx(T_FLTR, rel=1e-6)
    assert result.t_tx == pytest.approx(T_TX, rel=1e-6)
    assert result.rms_error == pytest.approx(0.0, abs=1e-9)
    assert result.folded_r is None
    assert result.predict(500, 3, 2) == pytest.approx(_b(500, 3, 2))


def test_one_replication_grade_folds_t_tx_into_t_rcv() -> None:
    result = fit(_grid((3,)))
    assert result.t_tx is None and result.folded_r == 3
    assert result.t_rcv == pytest.approx(T_RCV + 3 * T_TX, rel=1e-6)
    assert result.t_fltr == pytest.approx(T_FLTR, rel=1e-6)


def test_noisy_data_gives_close_parameters() -> None:
    rng = random.Random(7)
    points = [
        ModelPoint(p.n, p.m, p.r, p.seconds * rng.uniform(0.97, 1.03)) for p in _grid((1, 10)) * 3
    ]
    result = fit(points)
    assert result.t_fltr == pytest.approx(T_FLTR, rel=0.05)
    assert result.t_rcv == pytest.approx(T_RCV, rel=0.3)
    assert result.t_tx == pytest.approx(T_TX, rel=0.3)
    assert 0.0 < result.rms_error < 0.03


def test_a_flat_throughput_fits_zero_filter_cost() -> None:
    points = [ModelPoint(n, 1, 1, 25e-6) for n in (1, 10, 100, 1000, 10_000)]
    result = fit(points)
    assert result.t_fltr == pytest.approx(0.0, abs=1e-15)
    assert result.t_rcv == pytest.approx(25e-6)
    assert result.rms_error == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize(
    ("points", "message"),
    [
        ([], "no points"),
        ([ModelPoint(10, 1, 1, 1e-5)], "1 points cannot determine 2"),
        ([ModelPoint(10, 1, 1, 1e-5), ModelPoint(5, 2, 1, 2e-5)], "same n \\* m"),
        (
            [ModelPoint(1, 1, 1, 1e-5), ModelPoint(10, 1, 2, 2e-5)],
            "2 points cannot determine 3",
        ),
    ],
)
def test_points_that_determine_nothing(points: list[ModelPoint], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fit(points)


def test_relative_errors_keep_the_small_points_in_the_fit() -> None:
    # Flat at 20 us up to 1000 components, then 2 ms at 10,000: a straight line through
    # the last point alone would need a negative t_rcv.
    points = [ModelPoint(n, 1, 1, 20e-6) for n in (1, 10, 100, 1000)]
    points.append(ModelPoint(10_000, 1, 1, 2e-3))
    result = fit(points)
    assert result.t_rcv == pytest.approx(20e-6, rel=0.05)
    assert result.t_fltr > 0
    with pytest.raises(ValueError, match="positive"):
        fit([*points, ModelPoint(5, 1, 1, 0.0)])


def test_collinear_columns_are_singular() -> None:
    # r grows exactly with n*m: t_fltr and t_tx cannot be told apart.
    points = [ModelPoint(n, 1, n, _b(n, 1, n)) for n in (1, 2, 3, 4)]
    with pytest.raises(ValueError, match="singular"):
        fit(points)


def test_solve() -> None:
    assert solve([[2.0, 1.0], [1.0, 3.0]], [3.0, 5.0]) == pytest.approx([0.8, 1.4])
    with pytest.raises(ValueError, match="singular"):
        solve([[1.0, 2.0], [2.0, 4.0]], [1.0, 2.0])


def test_fit_is_a_value() -> None:
    assert Fit(1.0, 2.0, None, 3, 0.5, 1).predict(2, 3, 4) == 1.0 + 2 * 3 * 2.0
