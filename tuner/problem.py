"""What every part of the tuner names: GEMM problems (parsing ``MxNxK``, the documented default
set) and a kernel config's identity (``config_key``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from kernels.layout import DEFAULT_LAYOUT, LAYOUTS, problem_label, shape_text

_SHAPE = re.compile(r"^\s*(-?\d+(?:\s*[xX×]\s*-?\d+){2,3})\s*(?::\s*(\w+))?\s*$")


class ShapeError(ValueError):
    """A ``--shape`` text that is not ``MxNxK`` (or ``BxMxNxK``) with an optional ``:layout``."""


@dataclass(frozen=True)
class Problem:
    m: int
    n: int
    k: int
    dtype: str = "fp32"
    layout: str = DEFAULT_LAYOUT  # how A and B are stored (kernels/layout.py)
    general_alpha_beta: bool = True
    batch: int = 1  # GEMMs of this shape in one call (a strided batch)

    @property
    def shape(self) -> str:
        """``MxNxK``, or ``BxMxNxK`` for a batch (study names hold it, with the layout apart)."""
        return shape_text(self.m, self.n, self.k, self.batch)

    @property
    def label(self) -> str:
        """What ``--shape`` takes and tables show: the shape, then ``:layout`` unless "nn"."""
        return problem_label(self.m, self.n, self.k, self.layout, self.batch)

    def __str__(self) -> str:
        return self.label


# The default set: square small and large, a K-heavy small-MN shape (split-K territory),
# a tall-skinny shape, and one whose sizes are multiples of nothing useful.
DEFAULT_SHAPES: tuple[Problem, ...] = (
    Problem(1024, 1024, 1024),
    Problem(4096, 4096, 4096),
    Problem(256, 256, 16384),
    Problem(16384, 128, 1024),
    Problem(1023, 1025, 999),
)

SHAPE_FORMS = ("MxNxK with positive integers, e.g. 1024x1024x1024; BxMxNxK for a batch of B, e.g. 128x512x512x64; "
               f"either followed by :LAYOUT, one of {', '.join(LAYOUTS)} (A's letter then B's: "
               "n stored as used, t stored transposed), e.g. 4096x3072x1024:nt")


def parse_shape(text: str) -> Problem:
    """``"1024x512x256"`` → Problem(1024, 512, 256); ``"128x512x512x64:nt"`` → a batch of 128
    in layout nt; anything else raises ShapeError naming what is allowed."""
    match = _SHAPE.match(text)
    if match is None:
        raise ShapeError(f"bad shape {text!r}: expected {SHAPE_FORMS}")
    sizes = [int(part) for part in re.split(r"\s*[xX×]\s*", match.group(1).strip())]
    names = ("B", "M", "N", "K") if len(sizes) == 4 else ("M", "N", "K")
    bad = [f"{name}={value}" for name, value in zip(names, sizes) if value <= 0]
    if bad:
        raise ShapeError(
            f"bad shape {text!r}: {', '.join(bad)}; every size must be a positive integer"
        )
    layout = match.group(2) or DEFAULT_LAYOUT
    if layout not in LAYOUTS:
        raise ShapeError(f"bad shape {text!r}: layout {layout!r} is not one of {', '.join(LAYOUTS)} "
                         "(A's letter then B's: n stored as used, t stored transposed)")
    batch = sizes[0] if len(sizes) == 4 else 1
    m, n, k = sizes[-3:]
    return Problem(m, n, k, layout=layout, batch=batch)


ConfigKey = tuple[tuple[str, int], ...]


def config_key(config: Mapping[str, int]) -> ConfigKey:
    """A hashable, order-independent identity of a config (``dict[str, int]``)."""
    return tuple(sorted((name, int(value)) for name, value in config.items()))
