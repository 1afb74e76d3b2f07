"""Linear quantile regression: the line ``latency = intercept + slope * batch size`` that minimises the pinball
(check) loss at quantile ``q``, as Clipper's quantile-regression batching controller fits the p99 latency.

The pinball loss ``rho_q(r) = r * (q - [r < 0])`` is minimised by iteratively reweighted least squares (the
majorise-minimise scheme of Hunter and Lange, 2000): with ``|r| <= r**2 / (2 |r_k|) + |r_k| / 2`` each step
solves ``X'WX b = X'Wy + (2q - 1) X'1`` with weights ``1 / (|r_k| + eps)``, which never increases the loss.
Two parameters and ~1,000 samples: a few dozen 2x2 solves, so numpy alone is enough (the batcher runs in the
model container, where no optimisation library is installed)."""

from __future__ import annotations

import numpy as np


def pinball_loss(residuals: np.ndarray, q: float) -> float:
    """The mean check loss of residuals (observed minus fitted) at quantile ``q``."""
    return float(np.mean(np.maximum(q * residuals, (q - 1) * residuals)))


def quantile_line(
    x: np.ndarray, y: np.ndarray, q: float = 0.99, iterations: int = 200, tolerance: float = 1e-10
) -> tuple[float, float]:
    """(intercept, slope) of the linear ``q``-quantile regression of ``y`` on ``x``."""
    if not 0 < q < 1:
        raise ValueError("the quantile must be in (0, 1)")
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if len(x) < 2 or np.ptp(x) == 0:
        raise ValueError("a line needs samples at two or more batch sizes")
    design = np.column_stack([np.ones_like(x), x])
    scale = float(np.mean(np.abs(y - np.mean(y)))) or 1.0
    eps = 1e-6 * scale  # keeps the weights finite where a residual is (nearly) zero
    beta = np.linalg.lstsq(design, y, rcond=None)[0]
    loss = pinball_loss(y - design @ beta, q)
    tilt = (2 * q - 1) * design.sum(axis=0)
    for _ in range(iterations):
        w = 1.0 / (np.abs(y - design @ beta) + eps)
        wd = design * w[:, None]
        candidate = np.linalg.solve(design.T @ wd, wd.T @ y + tilt)
        new_loss = pinball_loss(y - design @ candidate, q)
        beta = candidate
        if loss - new_loss <= tolerance * max(loss, 1e-300):
            break
        loss = new_loss
    return float(beta[0]), float(beta[1])
