"""What every part of the tuner names: GEMM problems (parsing ``MxNxK``, the documented default
set) and a kernel config's identity (``config_key``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

_SHAPE = re.compile(r"^\s*(-?\d+)\s*[xX×]\s*(-?\d+)\s*[xX×]\s*(-?\d+)\s*$")


class ShapeError(ValueError):
    """A ``--shape`` text that is not three positive integers ``MxNxK``."""


@dataclass(frozen=True)
class Problem:
    m: int
    n: int
    k: int
    dtype: str = "fp32"
    layout: str = "row-major"
    general_alpha_beta: bool = True

    @property
    def shape(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"

    def __str__(self) -> str:
        return self.shape


# The default set: square small and large, a K-heavy small-MN shape (split-K territory),
# a tall-skinny shape, and one whose sizes are multiples of nothing useful.
DEFAULT_SHAPES: tuple[Problem, ...] = (
    Problem(1024, 1024, 1024),
    Problem(4096, 4096, 4096),
    Problem(256, 256, 16384),
    Problem(16384, 128, 1024),
    Problem(1023, 1025, 999),
)


def parse_shape(text: str) -> Problem:
    """``"1024x512x256"`` → Problem(1024, 512, 256); anything else raises ShapeError."""
    match = _SHAPE.match(text)
    if match is None:
        raise ShapeError(
            f"bad shape {text!r}: expected MxNxK with three positive integers, e.g. 1024x1024x1024"
        )
    m, n, k = (int(group) for group in match.groups())
    bad = [f"{name}={value}" for name, value in (("M", m), ("N", n), ("K", k)) if value <= 0]
    if bad:
        raise ShapeError(
            f"bad shape {text!r}: {', '.join(bad)}; every size must be a positive integer"
        )
    return Problem(m, n, k)


ConfigKey = tuple[tuple[str, int], ...]


def config_key(config: Mapping[str, int]) -> ConfigKey:
    """A hashable, order-independent identity of a config (``dict[str, int]``)."""
    return tuple(sorted((name, int(value)) for name, value in config.items()))
