"""What "correct" means for every family: relative error against a float64 reference."""
from __future__ import annotations

import math

import numpy as np

BASE_TOLERANCE = 1e-5


def tolerance(k: int) -> float:
    """Bound on ||out - ref|| / ||ref|| for FP32 FFMA accumulation over K terms.

    Rounding error of a K-term float32 dot product grows like sqrt(K) * 2^-24 for random data, so
    the 1e-5 bound holds as is up to K = 4096 and grows with sqrt(K / 4096) beyond (2e-5 at K = 16384).
    """
    return BASE_TOLERANCE * max(1.0, math.sqrt(k / 4096))


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    """||out - ref|| / ||ref|| in float64; NaN or Inf anywhere in out gives inf (never passes)."""
    out64 = out.astype(np.float64, copy=False)
    if not np.isfinite(out64).all():
        return math.inf
    denom = float(np.linalg.norm(ref))
    diff = float(np.linalg.norm(out64 - ref))
    return diff / denom if denom > 0 else diff
