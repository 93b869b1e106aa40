"""Accuracy of every FP32-class family against cuBLAS FP32 on the same inputs (GPU).

    python bench/accuracy.py [--gpu 0] [--size 1024] [--k 1000 --k 4096 --k 16384]
                             [--kind KIND ...] [--family NAME ...] [--set FAMILY:PARAM=V] [--variants]
                             [--out FILE]

For each input kind (KINDS) and each K, one M = N = size problem is run by every family of the
"fp32" precision class that the GPU offers (its first starting point, or the first accepted
config of a seeded sample where it has none; --set overrides a parameter; --variants adds that
config with each other value of each parameter that changes the order of the sums, one at a
time: the family's ``summation_params``) and by cuBLAS FP32
(cublasGemmEx, CUBLAS_COMPUTE_32F, no TF32), and compared with a float64 reference (CuPy's
product of the same FP32 inputs):
  relative error   ||out - ref||_F / ||ref||_F
  component-wise   max_ij |out - ref|_ij / (|A| |B|)_ij
The target (issue 60): every family at or below cuBLAS FP32's error (<= 1.0x) on every kind and
K. Prints the table (each family as a multiple of cuBLAS's error) and writes JSON (default
bench/results/accuracy-<gpu>.json); exit status 1 where a family misses the target.
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
from bench.throughput import gpu_slug  # noqa: E402
from gemmtune.precision import allowed_families  # noqa: E402

KINDS: dict[str, str] = {
    "uniform": "uniform [0, 1): every product positive, so a one-sided rounding bias adds up",
    "normal": "standard normal",
    "wide": "normal, each row of A and column of B scaled by 2^u, u uniform in [-20, 20]",
    "wide-elements": "normal, each element scaled by 2^u, u uniform in [-20, 20]",
    "cancellation": "normal pairs of equal and opposite products along K, plus a small signal (1e-3) in A",
    "tiny": "normal x 1e-18: products near 1e-36, sums still normal FP32",
    "huge": "normal x 1e17: products near 1e34, sums still below FP32's largest",
}
TARGET_RATIO = 1.0
SIGNAL = 1e-3  # the cancellation kind's small signal, relative to its paired terms
TINY, HUGE = 1e-18, 1e17


def make_inputs(kind: str, m: int, n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A (m x k) and B (k x n), float32, of one input kind (KINDS), reproducible from seed."""
    rng = np.random.default_rng(seed)
    if kind == "uniform":
        return rng.random((m, k), np.float32), rng.random((k, n), np.float32)
    if kind not in KINDS:
        raise ValueError(f"unknown input kind {kind!r}; expected one of {', '.join(KINDS)}")
    a = rng.standard_normal((m, k), np.float32)
    b = rng.standard_normal((k, n), np.float32)
    if kind == "wide":
        a *= np.exp2(rng.uniform(-20, 20, (m, 1))).astype(np.float32)
        b *= np.exp2(rng.uniform(-20, 20, (1, n))).astype(np.float32)
    elif kind == "wide-elements":
        a *= np.exp2(rng.uniform(-20, 20, (m, k))).astype(np.float32)
        b *= np.exp2(rng.uniform(-20, 20, (k, n))).astype(np.float32)
    elif kind == "cancellation":
        h = k // 2  # products h..2h-1 undo products 0..h-1 exactly; an odd K keeps one unpaired
        a[:, h:2 * h] = -a[:, :h]
        b[h:2 * h] = b[:h]
        a += (SIGNAL * rng.standard_normal((m, k))).astype(np.float32)
    elif kind == "tiny":
        a *= np.float32(TINY)
        b *= np.float32(TINY)
    elif kind == "huge":
        a *= np.float32(HUGE)
        b *= np.float32(HUGE)
    return a, b


def fp32_families(arch: str, names: list[str] | None = None) -> dict[str, kernels.Family]:
    """The families of the "fp32" precision class offered on arch (only `names`, if given)."""
    offered = {name: f for name, f in allowed_families("fp32").items() if f.offered_on(arch)}
    unknown = sorted(set(names or ()) - set(offered))
    if unknown:
        raise ValueError(f"not an FP32-class family offered on {arch}: {', '.join(unknown)}; "
                         f"allowed: {', '.join(offered)}")
    return {name: f for name, f in offered.items() if not names or name in names}


def variants(family: kernels.Family, base: dict[str, int], arch: str) -> dict[str, dict[str, int]]:
    """``base`` with each other value of each of the family's summation parameters, one at a
    time, where the family accepts it: labelled "FAMILY PARAM=VALUE"."""
    found = {}
    for param in (p for p in family.params if p.sums):
        for value in param.values:
            config = {**base, param.name: value}
            if value != base[param.name] and not family.reject_reasons(config, arch):
                found[f"{family.name} {param.name}={value}"] = config
    return found


def family_of(label: str) -> str:
    """The family a column of the table measures ("tf32x3" or "tf32x3 KGROUP=1")."""
    return label.split()[0]


def errors(out: Any, ref: Any, absprod: Any) -> dict[str, float]:
    """Relative Frobenius error and the largest component-wise error (cupy arrays, float64)."""
    import cupy as cp

    # widened on the host: CuPy's float32 -> float64 cast flushes subnormal values to zero, which
    # set a floor of FLT_MIN / (|A||B|)_ij on every implementation's component-wise error on
    # `tiny` inputs (docs/kernels.md, "Accuracy (bench/accuracy.py)")
    diff = cp.abs(cp.asarray(cp.asnumpy(out).astype(np.float64)) - ref)
    if not bool(cp.isfinite(diff).all()):
        return {"relative": float("inf"), "componentwise": float("inf")}
    rel = float(cp.linalg.norm(diff) / cp.linalg.norm(ref))
    comp = float(cp.max(diff / cp.maximum(absprod, np.finfo(np.float64).tiny)))
    return {"relative": rel, "componentwise": comp}


def source_hashes(configs: dict[str, dict[str, int]], families: dict[str, kernels.Family]) -> dict[str, str]:
    """Each measured config's kernel source version (its family's source hash), by its label
    ("family" or a variant's "family PARAM=V"): what a result file's errors belong to."""
    return {label: families[label.split()[0]].source_hash for label in configs}


def measure(kind: str, m: int, n: int, k: int, configs: dict[str, dict[str, int]], seed: int = 0,
            device: int = 0) -> dict[str, Any]:
    """Errors of cuBLAS FP32 and each family (with its config) on one problem of one input kind."""
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
        for name, config in configs.items():
            fam = kernels.get_family(family_of(name))
            out = cp.full((m, n), cp.nan, cp.float32)
            kernels.gemm(fam, config, da, db_, out, m, n, k, alpha=1.0, beta=0.0, stream=stream.ptr, device=device)
            stream.synchronize()
            row[name] = {**errors(out, ref, absprod), "config": config}
    return row


def ratios(row: dict[str, Any], family: str) -> dict[str, float]:
    base = row["cublas_fp32"]
    return {key: row[family][key] / base[key] if base[key] > 0 else (0.0 if row[family][key] == 0 else float("inf"))
            for key in ("relative", "componentwise")}


def table(rows: list[dict[str, Any]], names: list[str]) -> tuple[list[str], list[str]]:
    """The printed table (a line per kind and K: cuBLAS's errors, then each family's as a multiple
    of them) and the (family, kind, K) that miss TARGET_RATIO."""
    lines = [f"{'inputs':14} {'K':>6} {'cuBLAS rel':>10} {'comp':>9} | " + " ".join(f"{name:>11}" for name in names)]
    missed = []
    for row in rows:
        base, cells = row["cublas_fp32"], []
        for name in names:
            r = ratios(row, name)
            cells.append(f"{r['relative']:5.2f}/{r['componentwise']:<5.2f}")
            if not max(r.values()) <= TARGET_RATIO:
                missed.append(f"{name} {row['kind']} K={row['k']}")
        lines.append(f"{row['kind']:14} {row['k']:6d} {base['relative']:10.2e} {base['componentwise']:9.2e} | "
                     + " ".join(cells))
    lines.append(f"target: every family's errors <= {TARGET_RATIO:g}x cuBLAS FP32's on the same inputs: "
                 + ("met" if not missed else f"NOT met ({len(missed)}: {', '.join(missed)})"))
    return lines, missed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--size", type=int, default=1024, help="M = N (default 1024)")
    parser.add_argument("--k", type=int, action="append", default=[], help="K values (default 1000 4096 16384)")
    parser.add_argument("--kind", action="append", default=[], choices=list(KINDS), help="input kinds (default: all)")
    parser.add_argument("--family", action="append", default=[], help="FP32-class families (default: all offered)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="FAMILY:PARAM=V",
                        help="override a parameter of a family's config")
    parser.add_argument("--variants", action="store_true",
                        help="also each other value of each family's summation parameters "
                             "(kernels' summation_params: split-K slices, flushes), one at a time")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    try:
        import cupy  # noqa: F401
    except ImportError:
        parser.error("needs CuPy (the GPU host has it) for its float64 reference")
    from tuner.measure.gpu import GpuBench

    bench = GpuBench(args.gpu)
    gpu, arch = bench.info(), bench.arch()
    try:
        families = fp32_families(arch, args.family or None)
    except ValueError as error:
        parser.error(f"argument --family: {error}")
    configs = {name: f.first_config(arch, args.seed) for name, f in families.items()}
    for item in args.set:
        try:
            name, assignment = item.split(":", 1)
            param, value = assignment.split("=", 1)
            configs[name][param] = int(value)
        except (ValueError, KeyError):
            parser.error(f"argument --set: {item!r} is not FAMILY:PARAM=VALUE with FAMILY one of {', '.join(configs)}")
    if args.variants:
        for name in list(configs):
            configs.update(variants(families[name], configs[name], arch))
    rows = [measure(kind, args.size, args.size, k, configs, args.seed, args.gpu)
            for kind in (args.kind or KINDS) for k in (args.k or [1000, 4096, 16384])]
    for name, config in configs.items():
        print(f"{name}: {config}")
    print(f"{gpu['name']}, M = N = {args.size}; cuBLAS FP32's errors against float64 (relative Frobenius, max "
          f"component-wise) and each family's as a multiple of them (relative/component-wise)")
    lines, missed = table(rows, list(configs))
    print("\n".join(lines))
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / f"accuracy-{gpu_slug(gpu['name'])}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"gpu": gpu, "date": datetime.now(timezone.utc).isoformat(), "size": args.size,
                               "kinds": {kind: KINDS[kind] for kind in (args.kind or KINDS)}, "configs": configs,
                               "source_hashes": source_hashes(configs, families),
                               "target_ratio": TARGET_RATIO, "met": not missed, "missed": missed, "rows": rows},
                              indent=1))
    print(f"wrote {out}")
    return 0 if not missed else 1


if __name__ == "__main__":
    sys.exit(main())
