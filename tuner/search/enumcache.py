"""A registered family's accepted configs, enumerated once per family and architecture and kept
on disk beside the CUBIN cache (docs/measurement.md,
"The pipeline that keeps the GPU busy").

Enumerating pipelined's or tf32x3's accepted configs is seconds of pure Python, and they depend
on the family's parameters and rules and the architecture only, not on the shape. The file holds
the value tuples (int64, one row per config, the parameters' order); its name is the hash of
what the result depends on, so a changed family is looked up under another name and a stale file
is never read. A damaged file is ignored (and rewritten).
"""

from __future__ import annotations

import hashlib
import inspect
import io
from pathlib import Path
from typing import Any, Callable

import kernels
import numpy as np
from kernels.compiler import atomic_write, default_cache_dir

FOLDER = "accepted"  # under the CUBIN cache folder


def _key(family: Any, arch: str) -> str:
    # The rules are Python (constraints, geometry, shared-memory limits): the family's classes'
    # modules and kernels.space are hashed with the CUDA source and the parameters' values.
    modules = {inspect.getfile(cls) for cls in type(getattr(family, "base", family)).__mro__ if cls is not object}
    modules.add(inspect.getfile(kernels.space))
    parts = [family.name, family.source_hash, arch,
             repr([(p.name, sorted(p.values)) for p in family.params])]
    parts += [Path(path).read_text() for path in sorted(modules)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def path_for(family: Any, arch: str, cache_dir: Path | str | None) -> Path:
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return folder / FOLDER / f"{family.name}-{_key(family, arch)}.npy"


def accepted(family: Any, arch: str, cache_dir: Path | str | None,
             enumerate_: Callable[[], list[dict[str, int]] | None]
             ) -> list[dict[str, int]] | None:
    """``enumerate_()``'s configs, read from the file where one is there for this family and
    arch, else computed and written (None, a space too large to enumerate: not cached).
    Families not registered by name (tests' fakes) are not cached: their name does not identify
    their rules."""
    if kernels.FAMILIES.get(family.name) is not getattr(family, "base", family):  # a BoundFamily accepts what its family does
        return enumerate_()
    names = [param.name for param in family.params]
    path = path_for(family, arch, cache_dir)
    try:
        rows = np.load(path, allow_pickle=False)
        if rows.ndim == 2 and rows.shape[1] == len(names) and rows.dtype == np.int64:
            return [dict(zip(names, row)) for row in rows.tolist()]
    except (OSError, ValueError, EOFError):
        pass  # absent or damaged: enumerate and (re)write
    configs = enumerate_()
    if configs is None:
        return None
    rows = np.array([[config[name] for name in names] for config in configs],
                    dtype=np.int64).reshape(len(configs), len(names))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = io.BytesIO()
        np.save(data, rows, allow_pickle=False)
        atomic_write(path, data.getvalue())  # a reader (a preparing process) sees all or nothing
    except OSError:
        pass  # a read-only cache: enumerate each time, as before
    return configs
