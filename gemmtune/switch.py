"""The drop-in switch: while enabled, PyTorch's FP32 GEMMs on CUDA (`mm`, `addmm`, `bmm`,
`baddbmm` and their `out=` forms, hence `matmul`, `linear`, `@`, and autograd's GEMMs, which are
other layouts of the same shapes) run on the tuned kernel where the tuning source knows one for
this GPU model and problem (shape, layout, batch) that beats the library's; everything else goes
to torch's own kernel, untouched.

    import gemmtune
    gemmtune.enable()                 # or: with gemmtune.enabled(): ...
    y = model(x)                      # unchanged code; FP32-accurate throughout
    gemmtune.disable()                # torch's own kernels again, exactly

How: the CUDA kernels of those aten operators are replaced through torch.library (below
autograd, so gradients, torch.compile's graphs, which call the same operators, and CUDA graph
capture all pass through it), each keeping torch's original (torch.library.get_kernel) for
what it does not take. Nothing less accurate than FP32 ever runs: only families of the FP32
class are chosen, and where PyTorch was asked for TF32 (torch.backends.cuda.matmul.allow_tf32)
the call is left to torch, which the user asked to trade accuracy for speed. Only kernels tuned
on the problem itself run (not a nearest shape's), and only where that kernel measured faster
than cuBLAS on it. The recorder of workload.py observes the same operators.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .torchpath import result_shape, tuned, would_run
from .precision import check_precision

OPERATORS = ("mm", "mm.out", "addmm", "addmm.out", "bmm", "bmm.out", "baddbmm", "baddbmm.out")


@dataclass
class Counts:
    """Calls seen while installed: routed to a tuned kernel, or left to torch."""

    routed: int = 0
    torch: int = 0
    by_operator: dict[str, list[int]] = field(default_factory=dict)  # operator → [routed, torch]

    def add(self, op: str, routed: bool) -> None:
        row = self.by_operator.setdefault(op, [0, 0])
        if routed:
            self.routed += 1
            row[0] += 1
        else:
            self.torch += 1
            row[1] += 1


class _State:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.library: Any = None
        self.originals: dict[str, Any] = {}
        self.routing = False
        self.precision = "fp32"
        self.source: str | None = None
        self.observers: list[Callable[[str, tuple, dict, Callable[[], Any]], Any]] = []
        self.counts = Counts()
        self.warned_no_cuda = False


_S = _State()


def is_enabled() -> bool:
    return _S.routing


def counts() -> Counts:
    """How many GEMMs the switch routed to tuned kernels and left to torch since it was enabled."""
    return _S.counts


def enable(*, precision: str = "fp32", source: str | None = None) -> None:
    """Route FP32 CUDA GEMMs to tuned kernels from now on (see the module docstring).
    precision: "fp32" (default: FFMA or FP32-accurate tensor-core families) or "ffma".
    source: a results database URL, the API's URL or a pack (default: $GEMMTUNE_SOURCE, then
    the tuner's database)."""
    check_precision(precision)
    if source is not None and not isinstance(source, str):
        raise TypeError(f"source must be a string (database URL, http(s):// API URL or .json pack) or None, "
                        f"got {type(source).__name__}")
    with _S.lock:
        _S.precision, _S.source = precision, source
        _S.counts = Counts()
        _S.routing = True
        _install()


def disable() -> None:
    """Give every operator its torch kernel back (a no-op when not enabled)."""
    with _S.lock:
        _S.routing = False
        _uninstall_if_idle()


@contextlib.contextmanager
def enabled(*, precision: str = "fp32", source: str | None = None) -> Iterator[Counts]:
    """``with gemmtune.enabled(): ...`` — enabled inside, as before outside; yields the counts."""
    with _S.lock:
        was = (_S.routing, _S.precision, _S.source)
        enable(precision=precision, source=source)
    try:
        yield _S.counts
    finally:
        with _S.lock:
            if was[0]:
                _S.precision, _S.source = was[1], was[2]
            else:
                disable()


@contextlib.contextmanager
def observing(observer: Callable[[str, tuple, dict, Callable[[], Any]], Any]) -> Iterator[None]:
    """Install the operators for an observer (workload.py's recorder): observer(operator, args,
    kwargs, run) is called for every call and must return run()'s result."""
    with _S.lock:
        _S.observers.append(observer)
        _install()
    try:
        yield
    finally:
        with _S.lock:
            _S.observers.remove(observer)
            _uninstall_if_idle()


# --- the operators ----------------------------------------------------------------------------------


def _install() -> None:
    if _S.library is not None:
        return
    import torch

    try:
        originals = {op: torch.library.get_kernel(f"aten::{op}", "CUDA") for op in OPERATORS}
    except RuntimeError:  # a PyTorch built without CUDA: no CUDA GEMM to take over
        if not _S.warned_no_cuda:
            _S.warned_no_cuda = True
            warnings.warn("gemmtune: this PyTorch has no CUDA kernels (a CPU build); the switch has nothing to "
                          "route and changes nothing", RuntimeWarning, stacklevel=4)
        return
    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel.*")
        for op in OPERATORS:
            library.impl(op, _kernel(op, originals[op]), "CUDA", with_keyset=True)
    _S.originals, _S.library = originals, library


def _uninstall_if_idle() -> None:
    if _S.library is not None and not _S.routing and not _S.observers:
        _S.library._destroy()
        _S.library, _S.originals = None, {}


def _kernel(op: str, original: Any) -> Callable[..., Any]:
    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        def run() -> Any:
            if _S.routing:
                done = route(op, args, kwargs)
                _S.counts.add(op, done is not None)
                if done is not None:
                    return done
            return original.call_boxed(keyset, *args, **kwargs)

        for observer in _S.observers:
            inner = run
            run = (lambda obs, inner: (lambda: obs(op, args, kwargs, inner)))(observer, inner)  # noqa: E731
        return run()

    kernel.__name__ = f"gemmtune_{op.replace('.', '_')}"
    return kernel


def _scalar(value: Any) -> float | None:
    """A real alpha/beta as float; None for what the kernels cannot take (complex, symbolic)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def route(op: str, args: tuple, kwargs: dict) -> Any:
    """The result of one operator call computed by a tuned kernel, or None where torch's own
    kernel should run (not FP32, TF32 allowed, strides with no unit dimension, an output that
    overlaps an input or has to be resized, nothing tuned that beats cuBLAS, …)."""
    import torch

    if torch.backends.cuda.matmul.allow_tf32:
        return None
    out = kwargs.get("out")
    if op.startswith(("mm", "bmm")):
        a, b = args
        return tuned(a, b, out, 1.0, 0.0, None, _S.precision, _S.source, exact_only=True)
    given, a, b = args
    alpha, beta = _scalar(kwargs.get("alpha", 1)), _scalar(kwargs.get("beta", 1))
    if alpha is None or beta is None or not isinstance(given, torch.Tensor) or given.dtype is not torch.float32:
        return None
    if beta == 0.0:  # torch ignores the input then (nan and inf in it included)
        return tuned(a, b, out, alpha, 0.0, None, _S.precision, _S.source, exact_only=True)
    n = b.shape[-1]
    if beta == 1.0 and given.dim() >= 1 and given.shape[-1] == n and given.numel() == n and given.stride(-1) == 1:
        # a bias vector broadcast over the rows (nn.Linear): the kernels' epilogue adds it
        return tuned(a, b, out, alpha, 0.0, given.reshape(n), _S.precision, _S.source, exact_only=True)
    if not would_run(a, b, _S.precision, _S.source):
        return None
    # beta * input in C: the input in the output first, then C = alpha*A*B + beta*C
    shape = result_shape(a, b)
    if out is not None and out.shape == shape and out.data_ptr() == given.data_ptr() and out.stride() == given.stride():
        target = out  # addmm_ / out=input: C is the input already
    else:
        if not torch.broadcast_shapes(given.shape, shape) == shape:
            return None
        target = out if out is not None and out.shape == shape else torch.empty(shape, dtype=torch.float32,
                                                                                   device=a.device)
        if out is not None and target is not out:
            return None  # out would have to be resized: torch's rules
        target.copy_(given.expand(shape))
    return tuned(a, b, target, alpha, beta, None, _S.precision, _S.source, exact_only=True)
