"""Which kernel families a requested precision admits (kernels.PRECISIONS, Family.precision), and
which stored configs this installation can run on a GPU architecture."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import kernels

PRECISION_NAMES = tuple(kernels.PRECISIONS)  # ("ffma", "fp32")


def check_precision(precision: object, what: str = "precision") -> str:
    if not isinstance(precision, str) or precision not in kernels.PRECISIONS:
        raise ValueError(f"{what} must be one of {', '.join(map(repr, PRECISION_NAMES))}, got {precision!r} "
                         "('ffma': FP32 FFMA kernels only; 'fp32': also FP32-accurate tensor-core emulation)")
    return precision


def allowed_families(precision: str) -> dict[str, kernels.Family]:
    """The installed families whose arithmetic the precision admits. A family that declares no
    precision (or an unknown one) is admitted by none: running it could break the promise."""
    classes = kernels.PRECISIONS[check_precision(precision)]
    return {name: f for name, f in kernels.FAMILIES.items() if getattr(f, "precision", None) in classes}


@functools.cache  # hashing reads every family's CUDA source; once per process is enough
def installed_hashes(precision: str) -> dict[str, str]:
    """source_hash → family name of the installed families the precision admits."""
    return {f.source_hash: name for name, f in allowed_families(precision).items()}


def refusal(family: str, config: Mapping[str, int], arch: str) -> str | None:
    """Why this installation cannot run a stored config on `arch` (the family not installed, a
    value it no longer offers, a constraint, the architecture), or None where it can."""
    fam = kernels.FAMILIES.get(family)
    if fam is None:
        return f"family {family!r} is not installed"
    reasons = fam.refusals(dict(config), arch)
    return f"{family} refuses the stored config on {arch}: {'; '.join(reasons)}" if reasons else None


def runnable_on(arch: str | None) -> Callable[[str, Mapping[str, int]], bool] | None:
    """A (family, config) filter for the sources: the configs this installation runs on `arch`
    (None where the architecture is not known: every config)."""
    if arch is None:
        return None
    return lambda family, config: refusal(family, config, arch) is None
