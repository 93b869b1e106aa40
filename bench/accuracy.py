"""Accuracy of the FP32-accurate tensor-core families against cuBLAS FP32 on the same inputs (GPU).

    python bench/accuracy.py [--gpu 0] [--size 1024] [--k 1000 --k 4096 --k 16384] [--out FILE]

For each input kind (uniform [0,1), standard normal, and wide range: rows of A and columns of B
scaled by 2^u, u uniform in [-20, 20]) and each K, one M = N = size problem is run by `wgmma`,
`tf32x3` (their first starting points) and cuBLAS FP32 (cublasGemmEx, CUBLAS_COMPUTE_32F, no
TF32), and compared with a float64 reference (cuBLAS DGEMM of the same FP32 inputs):
  relative error   ||out - ref||_F / ||ref||_F
  component-wise   max_ij |out - ref|_ij / (|A| |B|)_ij
The target (issue 14): every error of `wgmma` at most 2x cuBLAS FP32's on the same inputs.
Prints the table and writes JSON (default bench/results/accuracy-<gpu>.json).
"""
from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import kernels  # noqa: E402

KINDS = ("uniform", "normal", "wide")
TARGET_RATIO = 2.0
FAMILIES = ("wgmma", "tf32x3")


def make_inputs(kind: str, m: int, n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    if kind == "uniform":
        return rng.random((m, k), np.float32), rng.random((k, n), np.float32)
    a = rng.standard_normal((m, k), np.float32)
    b = rng.standard_normal((k, n), np.float32)
    if kind == "normal":
        return a, b
    if kind == "wide":  # each row of A and column of B carries its own scale, 2^-20 .. 2^20
        a *= np.exp2(rng.uniform(-20, 20, (m, 1))).astype(np.float32)
        b *= np.exp2(rng.uniform(-20, 20, (1, n))).astype(np.float32)
        return a, b
    raise ValueError(f"unknown input kind {kind!r}; expected one of {', '.join(KINDS)}")


def errors(out: Any, ref: Any, absprod: Any) -> dict[str, float]:
    """Relative Frobenius error and the largest component-wise error (cupy arrays, float64)."""
    import cupy as cp

    diff = cp.abs(out.astype(cp.float64) - ref)
    if not bool(cp.isfinite(diff).all()):
        return {"relative": float("inf"), "componentwise": float("inf")}
    rel = float(cp.linalg.norm(diff) / cp.linalg.norm(ref))
    comp = float(cp.max(diff / cp.maximum(absprod, np.finfo(np.float64).tiny)))
    return {"relative": rel, "componentwise": comp}


def measure(kind: str, m: int, n: int, k: int, seed: int = 0, device: int = 0,
            configs: dict[str, dict[str, int]] | None = None) -> dict[str, Any]:
    """Errors of cuBLAS FP32 and each family on one problem of one input kind."""
    import cupy as cp

    from tuner.measure.gpu import Cublas

    a, b = make_inputs(kind, m, n, k, seed)
    with cp.cuda.Device(device):
        da, db_ = cp.asarray(a), cp.asarray(b)
        a64, b64 = da.astype(cp.float64), db_.astype(cp.float64)
        ref = a64 @ b64
        absprod = cp.abs(a64) @ cp.abs(b64)
        stream = cp.cuda.get_current_stream()
        cublas = Cublas(stream.ptr)
        out = cp.full((m, n), cp.nan, cp.float32)
        cublas.gemm(m, n, k, 1.0, da.data.ptr, db_.data.ptr, 0.0, out.data.ptr)
        stream.synchronize()
        row: dict[str, Any] = {"kind": kind, "m": m, "n": n, "k": k, "seed": seed,
                               "cublas_fp32": errors(out, ref, absprod)}
        for name in FAMILIES:
            fam = kernels.get_family(name)
            config = (configs or {}).get(name) or dict(fam.starting_points[0])
            out = cp.full((m, n), cp.nan, cp.float32)
            kernels.gemm(fam, config, da, db_, out, m, n, k, alpha=1.0, beta=0.0, stream=stream.ptr, device=device)
            stream.synchronize()
            row[name] = {**errors(out, ref, absprod), "config": config}
    return row


def ratios(row: dict[str, Any], family: str) -> dict[str, float]:
    base = row["cublas_fp32"]
    return {key: row[family][key] / base[key] if base[key] > 0 else (0.0 if row[family][key] == 0 else float("inf"))
            for key in ("relative", "componentwise")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--size", type=int, default=1024, help="M = N (default 1024)")
    parser.add_argument("--k", type=int, action="append", default=[], help="K values (default 1000 4096 16384)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="FAMILY:PARAM=V",
                        help="override a parameter of a family's config (its first starting point)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    configs = {name: dict(kernels.get_family(name).starting_points[0]) for name in FAMILIES}
    for item in args.set:
        try:
            name, assignment = item.split(":", 1)
            param, value = assignment.split("=", 1)
            configs[name][param] = int(value)
        except (ValueError, KeyError):
            parser.error(f"argument --set: {item!r} is not FAMILY:PARAM=VALUE with FAMILY one of {', '.join(FAMILIES)}")
    try:
        import cupy  # noqa: F401
    except ImportError:
        parser.error("needs CuPy (the GPU host has it) for its float64 reference")
    from tuner.measure.gpu import GpuBench

    gpu = GpuBench(args.gpu).info()
    rows = [measure(kind, args.size, args.size, k, args.seed, args.gpu, configs)
            for kind in KINDS for k in (args.k or [1000, 4096, 16384])]
    print(f"wgmma {configs['wgmma']}; tf32x3 {configs['tf32x3']}")
    print(f"{gpu['name']}, M = N = {args.size}; errors against float64 (relative Frobenius | max component-wise)")
    print(f"{'inputs':8} {'K':>6} | {'cuBLAS FP32':>21} | {'wgmma':>21} {'x cuBLAS':>11} | {'tf32x3':>21} {'x cuBLAS':>11}")
    met = True
    for row in rows:
        line = f"{row['kind']:8} {row['k']:6d} | {row['cublas_fp32']['relative']:9.2e} {row['cublas_fp32']['componentwise']:9.2e}   |"
        for name in FAMILIES:
            r = ratios(row, name)
            line += (f" {row[name]['relative']:9.2e} {row[name]['componentwise']:9.2e}  "
                     f"{r['relative']:4.2f} {r['componentwise']:4.2f} |")
            if name == "wgmma":
                met &= max(r.values()) <= TARGET_RATIO
        print(line)
    print(f"target: every wgmma error <= {TARGET_RATIO:g}x cuBLAS FP32's on the same inputs: {'met' if met else 'NOT met'}")
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / f"accuracy-{gpu['name'].split()[1].lower()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"gpu": gpu, "date": datetime.now(timezone.utc).isoformat(), "size": args.size,
                               "target_ratio": TARGET_RATIO, "met": met, "rows": rows}, indent=1))
    print(f"wrote {out}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
