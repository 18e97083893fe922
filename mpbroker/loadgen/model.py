"""The service-time model of Henjes et al. and its least-squares fit (pure).

Henjes, Menth and Himmler, "Impact of Complex Filters on the Message Throughput of the
ActiveMQ JMS Server" (ITC 2007), model the time a JMS server needs per received message as

    B = t_rcv + n * m * t_fltr + r * t_tx

for ``n`` subscribers with filters of ``m`` components each, ``r`` of which select the message
(each selected copy costs ``t_tx`` to send); the throughput is ``1 / B`` messages per second.
:func:`fit` finds ``t_rcv``, ``t_fltr`` and ``t_tx`` from measured points by least squares on
relative errors (each point weighted by ``1 / B``): the measured times span three orders of
magnitude, and plain least squares would let the slowest point decide everything (and give a
negative ``t_rcv`` where the cost is not quite linear). With one replication grade only,
``t_rcv`` and ``r * t_tx`` cannot be told apart: the fit then gives their sum as ``t_rcv``
and leaves ``t_tx`` out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PAPER_ACTIVEMQ", "Fit", "ModelPoint", "fit", "solve"]


@dataclass(frozen=True, slots=True)
class ModelPoint:
    """One measurement: ``n`` subscribers, ``m`` components each, replication ``r``, and
    the measured time per message ``seconds`` (1 / throughput, or CPU per message)."""

    n: int
    m: int
    r: int
    seconds: float


@dataclass(frozen=True, slots=True)
class Fit:
    """Fitted parameters in seconds (``t_tx`` None when the points had one ``r`` only)."""

    t_rcv: float
    t_fltr: float
    t_tx: float | None
    #: Points fitted, and the root mean square of the model's relative errors on them.
    points: int
    rms_error: float
    #: The replication grade folded into ``t_rcv`` when ``t_tx`` could not be fitted.
    folded_r: int | None = None

    def predict(self, n: int, m: int, r: int) -> float:
        """The model's seconds per message at ``n``, ``m``, ``r``."""
        b = self.t_rcv + n * m * self.t_fltr
        if self.t_tx is not None:
            b += r * self.t_tx
        return b


#: What the issue quotes from the paper for ActiveMQ 4.0: the cost of one filter component
#: per message, in seconds, with the throughput falling linearly in ``n``.
PAPER_ACTIVEMQ = {"t_fltr": 1.6e-7}


def solve(matrix: list[list[float]], vector: list[float]) -> list[float]:
    """Solve the square system ``matrix @ x = vector`` (Gaussian elimination with partial
    pivoting); ``ValueError`` if it is singular."""
    size = len(vector)
    rows = [[*row, value] for row, value in zip(matrix, vector, strict=True)]
    scale = max((abs(v) for row in matrix for v in row), default=0.0) or 1.0
    for col in range(size):
        pivot = max(range(col, size), key=lambda r: abs(rows[r][col]))
        if abs(rows[pivot][col]) <= 1e-12 * scale:
            raise ValueError("singular system: the points do not determine the parameters")
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for r in range(col + 1, size):
            factor = rows[r][col] / rows[col][col]
            for c in range(col, size + 1):
                rows[r][c] -= factor * rows[col][c]
    x = [0.0] * size
    for r in range(size - 1, -1, -1):
        x[r] = (rows[r][size] - sum(rows[r][c] * x[c] for c in range(r + 1, size))) / rows[r][r]
    return x


def fit(points: Sequence[ModelPoint]) -> Fit:
    """Least-squares ``t_rcv``, ``t_fltr`` (per component and subscriber) and ``t_tx``.

    ``ValueError`` when the points cannot determine them: fewer points than parameters, or
    a single value of ``n * m``.
    """
    if not points:
        raise ValueError("no points to fit")
    replications = {p.r for p in points}
    with_tx = len(replications) > 1
    columns = 3 if with_tx else 2
    if len(points) < columns:
        raise ValueError(f"{len(points)} points cannot determine {columns} parameters")
    if len({p.n * p.m for p in points}) < 2:
        raise ValueError("every point has the same n * m: t_fltr is not determined")

    if any(p.seconds <= 0 for p in points):
        raise ValueError("every measured time must be positive")

    def row(p: ModelPoint) -> list[float]:
        # Divided by the measurement: the residuals are relative errors.
        return [v / p.seconds for v in (1.0, float(p.n * p.m), float(p.r))[:columns]]

    # Normal equations. The columns differ by orders of magnitude (1 against n*m up to
    # 10^5), so each is scaled to unit size first and the solution scaled back.
    raw = [row(p) for p in points]
    norms = [math.sqrt(sum(r[c] ** 2 for r in raw)) or 1.0 for c in range(columns)]
    scaled = [[r[c] / norms[c] for c in range(columns)] for r in raw]
    ata = [[sum(r[i] * r[j] for r in scaled) for j in range(columns)] for i in range(columns)]
    aty = [sum(r[i] for r in scaled) for i in range(columns)]  # the targets are all 1
    solution = [x / norms[c] for c, x in enumerate(solve(ata, aty))]
    t_rcv, t_fltr = solution[0], solution[1]
    t_tx = solution[2] if with_tx else None
    folded = None if with_tx else next(iter(replications))
    result = Fit(t_rcv, t_fltr, t_tx, len(points), 0.0, folded)
    errors = [result.predict(p.n, p.m, p.r) / p.seconds - 1.0 for p in points]
    rms = math.sqrt(sum(e * e for e in errors) / len(errors))
    return Fit(t_rcv, t_fltr, t_tx, len(points), rms, folded)
