"""How a kernel family declares itself: tunable parameters, constraints, launch geometry."""
from __future__ import annotations

import hashlib
import itertools
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from kernels.layout import MAX_BATCH_GRID, check_batch, transposed

Config = Mapping[str, int]

FAMILY_DIR = Path(__file__).parent / "families"

# Every kernel of every family has this signature, so the launcher (and the GPU child process of
# the tuner) needs nothing family-specific beyond a list of Launch records. A launch that lists
# tensor maps passes them, encoded for the call's pointers, as further by-value parameters.
KERNEL_SIGNATURE = (
    "int M, int N, int K, float alpha, const float* __restrict__ A, int lda, "
    "const float* __restrict__ B, int ldb, float beta, float* __restrict__ C, int ldc, "
    "float* __restrict__ workspace, const float* __restrict__ bias, long long stride_a, "
    "long long stride_b, long long stride_c, int splits, int raster"
)

# Shared memory a block may opt in to, per architecture (bytes); used by constraints so that a
# config the GPU cannot launch is rejected before it is compiled.
MAX_SHARED_PER_BLOCK = {"sm_80": 163 * 1024, "sm_86": 99 * 1024, "sm_89": 99 * 1024, "sm_90": 227 * 1024}


def arch_of(compute_capability: str) -> str:
    """The architecture name of a compute capability as the driver reports it: "9.0" -> "sm_90"."""
    major, _, minor = str(compute_capability).partition(".")
    if not (major.isdigit() and minor.isdigit()):
        raise ValueError(f"compute capability must look like '9.0', got {compute_capability!r}")
    return f"sm_{major}{minor}"


_ACCEPTED: dict[tuple[type, str], list[dict[str, int]]] = {}

# Arithmetic classes (Family.precision) and, per precision a caller may ask for
# (gemmtune.matmul(precision=...), /api/best?precision=...), the classes it admits.
# "ffma": plain FP32 fused multiply-adds on CUDA cores. "fp32-tc": FP32-accurate emulation on
# tensor cores (operands split into TF32 parts, 3xTF32, or into scaled FP16 parts where the data's
# range allows and TF32 parts where not, decided on the device: f16x3): same float64 error bound
# in the tests, different rounding order. Plain TF32 or FP16 (or anything less accurate) has no
# class here.
PRECISIONS: dict[str, tuple[str, ...]] = {"ffma": ("ffma",), "fp32": ("ffma", "fp32-tc")}


class ConfigError(ValueError):
    """An unknown family, parameter or value, or a missing parameter."""


@dataclass(frozen=True)
class Param:
    name: str
    values: tuple[int, ...]
    doc: str
    # Passed to the kernel when it is launched (the `splits` and `raster` arguments), not
    # compiled into its program: configs that differ only in such values share one CUBIN.
    launch_time: bool = False
    # For a parameter added to a family later: the value that configs stored before it existed
    # ran with, so that they are read as that (warm starts, pack refreshes); None where there
    # were none.
    before: int | None = None
    # Whether its values change the order in which each output's products are summed (slices of
    # K, a tensor-core partial's flushes, warps taking turns over K), and so the rounding error:
    # bench/accuracy.py --variants measures each value.
    sums: bool = False


@dataclass(frozen=True)
class Constraint:
    reason: str
    holds: Callable[[Config], bool]


@dataclass(frozen=True)
class TensorMap:
    """A tiled view for the bulk tensor copy engine (TMA), encoded per call by the launcher
    (cuTensorMapEncodeTiled) and passed by value after the common kernel arguments. Its elements
    are FP32, or FP16 for a workspace view that a family's pre-pass wrote (`element`).

    base "workspace": the view starts `offset` bytes into the workspace, with `strides` given.
    base "a" / "b": the view is the call's A or B as stored, with its batch entries as the last
    dimension (strides: its leading dimension and batch stride); TMA needs a 16-byte aligned
    address and strides, so where the operand is not, `fallback` (a workspace view of an aligned
    copy, which the family's own pre-pass makes under the same rule) is used instead.
    """

    base: str
    dims: tuple[int, ...]          # extents in elements, innermost first
    box: tuple[int, ...]           # the tile one copy moves, innermost first
    strides: tuple[int, ...] = ()  # bytes between consecutive indices of dims[1:] (workspace)
    offset: int = 0                # bytes from the workspace base
    swizzle: int = 128             # shared-memory swizzle span in bytes: 0, 32, 64 or 128
    fallback: "TensorMap | None" = None
    element: str = "f32"           # "f32" or "f16"

    def __post_init__(self) -> None:
        if self.element not in ("f32", "f16"):
            raise ValueError(f"TensorMap element must be 'f32' or 'f16', got {self.element!r}")
        if self.element != "f32" and self.base != "workspace":
            raise ValueError("an FP16 TensorMap views the workspace (a pre-pass's copy); A and B are FP32")


@dataclass(frozen=True)
class Launch:
    """One kernel launch: plain data, picklable, shipped to the GPU process."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    tensor_maps: tuple[TensorMap, ...] = ()
    splits: int = 1  # the kernel's `splits` and `raster` arguments (Family.launch_values)
    raster: int = 1
    # The kernel waits in-kernel for the kernel before it (common.cuh's follow_previous_grid), so
    # it is launched to start while that one still runs (programmatic dependent launch, sm_90).
    follows: bool = False
    # The kernel writes nothing but the workspace copies that the sequence's tensor maps fall
    # back to where TMA cannot read an operand in place: the launcher skips it for a call whose
    # operands every map reads in place (kernels.runtime.maps_read_in_place).
    only_for_fallbacks: bool = False


_INCLUDE = re.compile(r'^#include "([\w.]+)"$', re.M)


def _expand_includes(file_name: str, read: list[str]) -> str:
    read.append(file_name)
    text = (FAMILY_DIR / file_name).read_text()
    return _INCLUDE.sub(lambda m: _expand_includes(m.group(1), read), text)


def _stamps(files: tuple[str, ...]) -> tuple[int, ...]:
    return tuple((FAMILY_DIR / f).stat().st_mtime_ns for f in files)


# Per family file: the files its text was read from, their modification times, the text and its
# sha256. A tuner names every candidate's program by the source hash, thousands of times a study
# (a read and a hash each: 2-5 ms of the main thread per trial); kept until a file changes, so
# an edited kernel is never compiled under its old hash.
_SOURCES: dict[str, tuple[tuple[str, ...], tuple[int, ...], str, str]] = {}


def expanded_source(file_name: str) -> tuple[str, str]:
    """A family file's CUDA text with our own `#include "x.cuh"` headers expanded in place, and
    its sha256."""
    kept = _SOURCES.get(file_name)
    if kept is not None:
        files, stamps, text, digest = kept
        try:
            if _stamps(files) == stamps:
                return text, digest
        except OSError:
            pass
    read: list[str] = []
    text = _expand_includes(file_name, read)
    files = tuple(read)
    digest = hashlib.sha256(text.encode()).hexdigest()
    _SOURCES[file_name] = (files, _stamps(files), text, digest)
    return text, digest


def div_up(a: int, b: int) -> int:
    return -(-a // b)


def check_dims(m: int, n: int, k: int) -> None:
    for name, v in (("M", m), ("N", n), ("K", k)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")


class Family:
    """A rung of the optimization ladder. Subclasses set the class attributes and geometry."""

    name: str
    rung: int
    description: str
    source_file: str
    params: tuple[Param, ...]
    constraints: tuple[Constraint, ...] = ()
    kernel_name = "gemm"
    # The family's arithmetic: one of PRECISIONS["fp32"]. Deliberately no default: a family that
    # does not say is offered under no precision (and tests/test_kernels_space.py fails).
    precision: str
    # Configs measured to be good somewhere (which GPU and shape: beside each family's list).
    # A tuner with no history for a problem measures these first, as Triton's autotuner starts
    # from its declared configs; the search then goes on from them.
    starting_points: tuple[dict[str, int], ...] = ()
    # Architectures the family runs on (None: any that MAX_SHARED_PER_BLOCK knows); a config
    # asked for on another one is rejected with this family's reason.
    architectures: tuple[str, ...] | None = None
    architecture_reason = ""
    # Every kernel of the family's sequence waits for its predecessor in-kernel (Launch.follows):
    # only families that run on sm_90 alone, where the wait exists.
    follows_previous = False

    @property
    def summation_params(self) -> tuple[str, ...]:
        """The parameters that change the order of each output's sums (``Param.sums``)."""
        return tuple(p.name for p in self.params if p.sums)

    def offered_on(self, arch: str) -> bool:
        """Whether the family runs on `arch` at all (else every config is rejected)."""
        return self.architectures is None or arch in self.architectures

    def target(self, arch: str) -> str:
        """The NVRTC target for a device of architecture `arch` (sm_90a for wgmma/setmaxnreg)."""
        return arch

    # --- geometry, overridden per family ---------------------------------------------------
    def threads(self, c: Config) -> int:
        raise NotImplementedError

    def shared_bytes(self, c: Config) -> int:
        """Dynamic shared memory per block (static shared memory comes from ptxas)."""
        return 0

    def tiles(self, c: Config, m: int, n: int) -> tuple[int, int]:
        """Output tile of one block (rows, cols)."""
        raise NotImplementedError

    def splits(self, c: Config) -> int:
        return 1

    def launch_values(self, c: Config) -> dict[str, int]:
        """The launch-time arguments every kernel of the config's program takes: slices of K
        and block-order group height (1 where the family has no RASTER parameter)."""
        return {"splits": self.splits(c), "raster": int(c["RASTER"]) if "RASTER" in c else 1}

    def launches(self, c: Config, m: int, n: int, k: int, layout: str = "nn", batch: int = 1) -> list[Launch]:
        """The launch sequence for a (batch of) m×n×k problem(s) in ``layout`` (kernels.layout):
        the GEMM's grid is (tiles, 1, batch × splits), the split-K reduction's (m·n / 256, batch)."""
        self.validate(c)
        check_dims(m, n, k)
        transposed(layout)
        check_batch(batch)
        tm, tn = self.tiles(c, m, n)
        blocks = div_up(m, tm) * div_up(n, tn)
        values = self.launch_values(c)
        if batch * values["splits"] > MAX_BATCH_GRID:
            raise ValueError(f"batch {batch} x {values['splits']} split-K slices exceeds one launch's "
                             f"{MAX_BATCH_GRID} grid z-blocks; launch the batch in parts")
        main = Launch(self.kernel_name, (blocks, 1, batch * values["splits"]), (self.threads(c), 1, 1),
                      self.shared_bytes(c), follows=self.follows_previous, **values)
        if values["splits"] == 1:
            return [main]
        reduce_threads = 256
        return [main, Launch("gemm_splitk_reduce", (div_up(m * n, reduce_threads), batch, 1), (reduce_threads, 1, 1),
                             0, follows=self.follows_previous, **values)]

    def main_launch(self, c: Config, m: int, n: int, k: int, layout: str = "nn", batch: int = 1) -> Launch:
        """The GEMM kernel's own launch (occupancy and resources describe it), wherever it runs
        in the sequence: a family may launch a pre-pass before it and a reduction after it."""
        return next(launch for launch in self.launches(c, m, n, k, layout, batch) if launch.kernel == self.kernel_name)

    def workspace_bytes(self, c: Config, m: int, n: int, k: int, layout: str = "nn", batch: int = 1) -> int:
        s = self.splits(c)
        return 0 if s == 1 else batch * s * m * n * 4

    def flops(self, m: int, n: int, k: int) -> int:
        return 2 * m * n * k

    # --- source ------------------------------------------------------------------------------
    @property
    def source(self) -> str:
        """The family's CUDA text with our own `#include "x.cuh"` headers expanded in place."""
        return expanded_source(self.source_file)[0]

    @property
    def source_hash(self) -> str:
        if type(self).source is Family.source:  # the files' text, whose hash is kept with it
            return expanded_source(self.source_file)[1]
        return hashlib.sha256(self.source.encode()).hexdigest()  # a source made another way

    def program(self, c: Config, layout: str = "nn", batch: int = 1, bias: bool = False) -> str:
        """The full CUDA text for one config and problem kind: compile-time parameters as macros
        ahead of the source, SPLIT (1 where K is sliced), the layout's TA / TB, BATCHED (batch
        > 1) and BIAS; launch-time parameters are left out. A single GEMM without a bias
        defines neither, so it compiles to the text it had before either existed."""
        self.validate(c)
        ta, tb = transposed(layout)
        defines = "".join(f"#define {p.name} {int(c[p.name])}\n" for p in self.params if not p.launch_time)
        defines += f"#define SPLIT {int(self.splits(c) > 1)}\n#define TA {int(ta)}\n#define TB {int(tb)}\n"
        if check_batch(batch) > 1:
            defines += "#define BATCHED 1\n"
        if bias:
            defines += "#define BIAS 1\n"
        return defines + self.source

    # --- parameter space ---------------------------------------------------------------------
    def validate(self, c: Config) -> None:
        known = {p.name: p for p in self.params}
        unknown = sorted(set(c) - set(known))
        if unknown:
            raise ConfigError(
                f"family {self.name!r} has no parameter {', '.join(map(repr, unknown))}; "
                f"its parameters are {', '.join(known)}"
            )
        missing = [name for name in known if name not in c]
        if missing:
            raise ConfigError(f"family {self.name!r}: config is missing {', '.join(missing)}")
        for name, p in known.items():
            v = c[name]
            if isinstance(v, bool) or not isinstance(v, int) or v not in p.values:
                raise ConfigError(
                    f"family {self.name!r}: {name}={v!r} is not allowed; allowed values are "
                    f"{', '.join(map(str, p.values))}"
                )

    def reject_reasons(self, c: Config, arch: str = "sm_90") -> list[str]:
        """Reasons the constraints reject this config ([] when accepted)."""
        self.validate(c)
        if not self.offered_on(arch):
            return [f"{self.name} runs only on {', '.join(self.architectures)} ({self.architecture_reason}); "
                    f"this device is {arch}"]
        reasons = [con.reason for con in self.constraints if not con.holds(c)]
        if not reasons:
            threads = self.threads(c)
            if threads % 32 or not 32 <= threads <= 1024:
                reasons.append(f"threads per block must be a multiple of 32 in [32, 1024], got {threads}")
            limit = MAX_SHARED_PER_BLOCK.get(arch, MAX_SHARED_PER_BLOCK["sm_86"])
            if self.shared_bytes(c) > limit:
                reasons.append(
                    f"needs {self.shared_bytes(c)} bytes of shared memory per block; {arch} allows {limit}"
                )
        return reasons

    def accepts(self, c: Config, arch: str = "sm_90") -> bool:
        return not self.reject_reasons(c, arch)

    def refusals(self, c: Config, arch: str = "sm_90") -> list[str]:
        """``reject_reasons`` of a config stored or declared elsewhere, where a value this
        version does not offer is one more reason instead of a ConfigError."""
        try:
            return self.reject_reasons(c, arch)
        except ConfigError as error:
            return [str(error)]

    def space_size(self) -> int:
        size = 1
        for p in self.params:
            size *= len(p.values)
        return size

    def all_configs(self) -> Iterator[dict[str, int]]:
        names = [p.name for p in self.params]
        for values in itertools.product(*(p.values for p in self.params)):
            yield dict(zip(names, values))

    def accepted_configs(self, arch: str = "sm_90") -> list[dict[str, int]]:
        """Every config the constraints accept, in parameter order (cached per architecture)."""
        key = (type(self), arch)
        if key not in _ACCEPTED:
            _ACCEPTED[key] = list(enumerate_accepted(self, arch))
        return _ACCEPTED[key]

    def completed(self, config: Config) -> dict[str, int]:
        """``config`` with every parameter it lacks that has a ``before`` value set to it: a
        config stored before that parameter was added, as the family runs it now."""
        return {**{p.name: p.before for p in self.params if p.before is not None and p.name not in config},
                **{name: int(value) for name, value in config.items()}}

    def first_config(self, arch: str = "sm_90", seed: int = 0) -> dict[str, int]:
        """A config to run when any will do: the first starting point, or where the family has
        none the first of a seeded sample of its accepted configs."""
        if self.starting_points:
            return dict(self.starting_points[0])
        return self.sample_accepted(1, seed=seed, arch=arch)[0]

    def sample_accepted(self, count: int, seed: int = 0, arch: str = "sm_90") -> list[dict[str, int]]:
        """Uniform sample (without replacement) of accepted configs."""
        pool = self.accepted_configs(arch)
        rng = random.Random(seed)
        return rng.sample(pool, min(count, len(pool)))

    @property
    def base(self) -> "Family":
        """The registered family itself (a BoundFamily's is the family it binds)."""
        return self

    def __repr__(self) -> str:
        return f"<Family {self.rung}:{self.name}>"


class BoundFamily:
    """A family bound to one problem's layout and batch count: the same parameters, constraints
    and name, but its program, launches, workspace and FLOP count are that problem's. The
    tuner hands these around where it handles one problem (a study, a sweep), so everything
    below it (compile pools, cache keys, the GPU child) builds and runs the right program
    without being told the layout. Everything else is the family's own."""

    def __init__(self, family: Family, layout: str, batch: int) -> None:
        transposed(layout)
        check_batch(batch)
        self.family, self.layout, self.batch = family, layout, batch

    def __getattr__(self, name: str):
        return getattr(self.family, name)

    def __reduce__(self):
        return (BoundFamily, (self.family, self.layout, self.batch))

    @property
    def base(self) -> Family:
        return self.family

    def program(self, c: Config, layout: str | None = None, batch: int | None = None, bias: bool = False) -> str:
        return self.family.program(c, self.layout, self.batch, bias)

    def launches(self, c: Config, m: int, n: int, k: int, layout: str | None = None,
                 batch: int | None = None) -> list[Launch]:
        return self.family.launches(c, m, n, k, self.layout, self.batch)

    def main_launch(self, c: Config, m: int, n: int, k: int, layout: str | None = None,
                    batch: int | None = None) -> Launch:
        return self.family.main_launch(c, m, n, k, self.layout, self.batch)

    def workspace_bytes(self, c: Config, m: int, n: int, k: int, layout: str | None = None,
                        batch: int | None = None) -> int:
        return self.family.workspace_bytes(c, m, n, k, self.layout, self.batch)

    def flops(self, m: int, n: int, k: int) -> int:
        return self.batch * self.family.flops(m, n, k)

    def __repr__(self) -> str:
        return f"<Family {self.family.rung}:{self.family.name} {self.layout} x{self.batch}>"


def bound_to(family: Any) -> tuple[str, int]:
    """The (layout, batch) a family or view builds its programs for: a BoundFamily's, else a
    single "nn" GEMM's. Anything that caches per family and config keys on it too."""
    return (family.layout, family.batch) if isinstance(family, BoundFamily) else ("nn", 1)


def bind(family: "Family | BoundFamily", layout: str = "nn", batch: int = 1) -> "Family | BoundFamily":
    """``family`` for problems of this layout and batch: itself for a single "nn" GEMM (what
    every family did before layouts; a view such as a recording's narrowed grid stays that
    view), else a BoundFamily of it."""
    unbound = family.family if isinstance(family, BoundFamily) else family
    if layout == "nn" and batch == 1:
        return unbound
    return BoundFamily(unbound, layout, batch)


def enumerate_accepted(family: Family, arch: str = "sm_90") -> Iterator[dict[str, int]]:
    """Every config ``family`` accepts on ``arch``, in the order of ``itertools.product`` over
    the parameters' values (as declared). Works for any object with a family's ``params``,
    ``constraints``, ``offered_on`` and ``accepts`` (a view narrowed to a recorded grid too).

    Depth-first over the parameters, testing each constraint as soon as every parameter it reads
    is bound (a constraint that reads an unbound one raises KeyError), so large spaces are pruned
    early instead of filtered one full config at a time (tenfold faster on pipelined's 884,736).
    A leaf is accepted by ``accepts``, so the result is exactly the filtered product."""
    if not family.offered_on(arch):
        return iter(())
    params, constraints = family.params, family.constraints

    def decidable(partial: dict[str, int]) -> bool:
        for con in constraints:
            try:
                if not con.holds(partial):
                    return False
            except KeyError:
                pass
        return True

    def walk(i: int, partial: dict[str, int]) -> Iterator[dict[str, int]]:
        if i == len(params):
            if family.accepts(partial, arch):
                yield dict(partial)
            return
        p = params[i]
        for v in p.values:
            partial[p.name] = v
            if decidable(partial):
                yield from walk(i + 1, partial)
            del partial[p.name]

    return walk(0, {})
