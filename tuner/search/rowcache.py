"""The cost model's feature rows of one unit's measured configs (``costmodel._unit_rows``), kept
on disk beside the CUBIN cache.

Every process that fits the model lays out every recorded config of the examples it learns from:
54,136 launch plans for the H200's bundled recordings, 1.9 s on the 2-core machine, paid by the
command's first start-up (with the GPU waiting for it) and again by each process preparing
start-ups (docs/fleet.md, "Where the first start-up's time goes"). The rows depend only on the
unit's examples and on the Python that turns a config into features (launch geometry, occupancy,
the prior's rate), so a file named by the hash of both is read instead. A stale file is never
read (its name differs); writing a unit's file removes the unit's files of other code versions,
so the folder holds one per unit; a damaged file is ignored and rewritten.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

import kernels
from kernels.compiler import atomic_write, default_cache_dir

FOLDER = "unit-rows"  # under the CUBIN cache folder

# (rows by config key, the unit's best GFLOP/s): costmodel.UnitRows
Rows = tuple[dict[tuple[Any, ...], np.ndarray], float]


@lru_cache(maxsize=1)
def code_digest() -> str:
    """The Python a feature row depends on: all of ``kernels`` and ``tuner`` (more than needed,
    so that no dependency is missed; a changed file only costs one recomputation per unit)."""
    digest = hashlib.sha256()
    for root in (Path(kernels.__file__).parent, Path(__file__).parents[1]):
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root.parent)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:24]


def _unit_digest(unit: tuple[str, str, str], first: Any, names: list[str], values: np.ndarray,
                 gflops: np.ndarray) -> str:
    digest = hashlib.sha256(repr((unit, first.target, first.problem, names)).encode())
    digest.update(values.tobytes())
    digest.update(gflops.tobytes())
    return digest.hexdigest()[:24]


def unit_rows(unit: tuple[str, str, str], examples: Sequence[Any], compute: Callable[[], Rows],
              cache_dir: Path | str | None = None) -> Rows:
    """``compute()``'s rows of this unit's examples (``costmodel.Example``s), read from the file
    where one is there for these examples and this code, else computed and written. Examples
    whose configs do not all name the same parameters are not cached."""
    names = sorted(examples[0].config)
    if any(len(e.config) != len(names) or any(n not in e.config for n in names) for e in examples):
        return compute()
    values = np.array([[e.config[n] for n in names] for e in examples], dtype=np.int64).reshape(len(examples), len(names))
    gflops = np.array([e.gflops for e in examples], dtype=np.float64)
    unit_part = _unit_digest(unit, examples[0], names, values, gflops)
    folder = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / FOLDER
    path = folder / f"{unit_part}-{code_digest()}.npz"
    try:
        with np.load(path, allow_pickle=False) as stored:
            which, x, best = stored["which"], stored["x"], float(stored["best"])
        if x.ndim == 2 and len(which) == len(x) and (len(which) == 0 or which.max() < len(examples)):
            return ({_key(names, values[i]): row for i, row in zip(which.tolist(), x)}, best)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        pass  # absent or damaged: compute and (re)write
    rows = compute()
    _write(path, names, values, rows)
    return rows


def _key(names: list[str], row: np.ndarray) -> tuple[Any, ...]:
    """``costmodel._config_key`` of a config given by its values in ``names``' (sorted) order."""
    return tuple(zip(names, row.tolist()))


def _write(path: Path, names: list[str], values: np.ndarray, rows: Rows) -> None:
    by_key, best = rows
    index = {_key(names, row): i for i, row in enumerate(values)}
    which = [index[key] for key in by_key]  # the examples the family could lay out, in row order
    x = (np.array(list(by_key.values()), dtype=np.float64) if by_key
         else np.zeros((0, 0), dtype=np.float64))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = io.BytesIO()
        np.savez(data, which=np.array(which, dtype=np.int64), x=x, best=np.float64(best))
        atomic_write(path, data.getvalue())  # another process reading sees all or nothing
        unit_part = path.name.split("-")[0]
        for older in path.parent.glob(f"{unit_part}-*.npz"):
            if older != path:
                older.unlink(missing_ok=True)
    except OSError:
        pass  # a read-only cache: compute each time, as before
