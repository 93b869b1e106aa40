"""Use the tuned kernels from user code: `matmul` dispatches each (GPU model, problem, precision)
to the best kernel a tuning source knows, else to the library's own GEMM; `enable()` does the same
for PyTorch's own GEMMs, unchanged code and autograd included; `record_workload` records the GEMMs
a program runs for the tuner.

    import torch, gemmtune
    c = gemmtune.matmul(a, b)                 # a, b: float32 CUDA tensors (or CuPy arrays)
    print(gemmtune.explain(a, b))             # what ran and why
    with gemmtune.enabled():                  # torch.mm / addmm / bmm / linear / matmul / @
        loss = model(x).sum(); loss.backward()

Imports `db` and `kernels` (and the API over HTTP), never `tuner` or `api`. Nothing here imports
torch or CuPy until a call receives their arrays.
"""

from __future__ import annotations

from .answers import SourceUnavailable
from .dispatch import DISPATCHER, Choice
from .frontend import explain, matmul
from .pack import PackError, build_pack, read_pack, write_pack
from .precision import PRECISION_NAMES
from .sources import SOURCE_ENV, HttpSource, open_source
from .switch import counts, disable, enable, enabled, is_enabled
from .torchpath import forget as _forget_plans
from .workload import record_workload


def clear_cache() -> None:
    """Forget cached choices, plans and opened sources (e.g. after new tuning results landed)."""
    DISPATCHER.clear()
    _forget_plans()


def _register_torch_op() -> None:
    """Register the torch.library op when torch is already imported (else on first use)."""
    import sys

    if "torch" in sys.modules:
        from . import torch_op  # noqa: F401


_register_torch_op()

__all__ = [
    "Choice", "HttpSource", "PRECISION_NAMES", "PackError", "SOURCE_ENV", "SourceUnavailable",
    "build_pack", "clear_cache", "counts", "disable", "enable", "enabled", "explain", "is_enabled", "matmul",
    "open_source", "read_pack", "record_workload", "write_pack",
]
