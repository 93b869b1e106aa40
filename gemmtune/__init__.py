"""Use the tuned kernels from user code: `matmul` dispatches each (GPU model, shape, precision) to
the best kernel a tuning source knows, else to the library's own GEMM.

    import torch, gemmtune
    c = gemmtune.matmul(a, b)                 # a, b: float32 CUDA tensors (or CuPy arrays)
    print(gemmtune.explain(a, b))             # what ran and why

Imports `db` and `kernels` (and the API over HTTP), never `tuner` or `api`. Nothing here imports
torch or CuPy until a call receives their arrays.
"""

from __future__ import annotations

from .call import explain, matmul
from .dispatch import DISPATCHER, Choice
from .pack import PackError, build_pack, read_pack, write_pack
from .precision import PRECISION_NAMES
from .sources import SOURCE_ENV, HttpSource, SourceUnavailable, open_source


def clear_cache() -> None:
    """Forget cached choices and opened sources (e.g. after new tuning results landed)."""
    DISPATCHER.clear()


def _register_torch_op() -> None:
    """Register the torch.library op when torch is already imported (else on first use)."""
    import sys

    if "torch" in sys.modules:
        from . import torch_op  # noqa: F401


_register_torch_op()

__all__ = [
    "Choice", "HttpSource", "PRECISION_NAMES", "PackError", "SOURCE_ENV", "SourceUnavailable", "build_pack",
    "clear_cache", "explain", "matmul", "open_source", "read_pack", "write_pack",
]
