"""A CPU model of 3xTF32 accumulation (wgmma, tf32x3), calibrated on measured errors (no GPU).

    python bench/accumulation_model.py [--kind uniform ...] [--k 4096 ...] [--flush 2 4]
        [--order interleaved small-first small-first-pairs cross-apart] [--block 48] [--align-bits 26]
        [--measured bench/results/accuracy-h200.json [--measured-order small-first]] [--out FILE]

What it emulates, per output, in the orders the kernels sum (docs/kernels.md, "A model of the
tensor core's accumulation"): each FP32 operand split into big = TF32 rounded to nearest and
small = the TF32 of the rest; per k-step of 8, three MMAs (small·big, big·small, big·big) into
a fragment summed from zero over FLUSH k-steps, the fragment then added to the FP32 accumulator
with one round-to-nearest add. An MMA is modeled as the tensor core is described by Fasi et al.
(2021) for earlier GPUs: the 8 products exact, each term (the accumulator too) cut toward zero
to ``--align-bits`` bits below the largest term's leading bit, summed exactly, the sum cut
toward zero to FP32. ``--align-bits`` is the one fitted constant.

Orders: ``interleaved`` (tf32x3's, and wgmma's until it changed) runs each k-step's three MMAs
in turn; ``small-first`` (wgmma's) sums the cross terms of all FLUSH k-steps first, the big·big
MMAs last, so that only those cut at the scale of the big sum (the same MMAs and registers);
``small-first-pairs`` does so for each pair of k-steps of a flush in turn (what `tf32x3`, whose
fragments are registers, could hold: half of small-first's extra fragments); ``cross-apart`` sums
each k-step's two cross terms from zero in a fragment of their own and adds it to the flush's
fragment with one round-to-nearest add after the big·big MMA (four more registers per chain in
the source).

The inputs are bench/accuracy.py's (``make_inputs``, M = N = 1024, seed 0); the model computes
the top-left ``--block`` × ``--block`` outputs only, so its relative error is a sample of the
whole matrix's. With ``--measured`` (an accuracy JSON whose rows hold ``wgmma``'s error on the
same inputs) each row of ``--measured-order`` (the order the measured kernel ran: small-first
for wgmma's results since the change, interleaved for bench/data/accuracy-h200-interleaved.json,
the H200 rows the constant was checked on) prints the measured error beside the model's, and
each order's modeled error as a multiple of cuBLAS FP32's measured one: the prediction.
JSON to ``bench/results/accumulation_model.json`` unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "bench" / "results" / "accumulation_model.json"
ORDERS = ("interleaved", "small-first", "small-first-pairs", "cross-apart")
KSTEP = 8  # k per TF32 MMA
TF32_DROP = np.uint32(0xFFFFE000)  # TF32 keeps 10 of FP32's 23 stored mantissa bits


def tf32_nearest(x: np.ndarray) -> np.ndarray:
    """x rounded to the nearest TF32, ties away from zero (the kernels' ``tf32_big``)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & TF32_DROP).view(np.float32)


def split(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    big = tf32_nearest(x)
    return big, tf32_nearest(x - big)  # the tensor core reads small as TF32 too


def toward_zero_fp32(x: np.ndarray) -> np.ndarray:
    """float64 → float32 rounded toward zero."""
    f = x.astype(np.float32)
    over = np.abs(f.astype(np.float64)) > np.abs(x)
    return np.where(over, np.nextafter(f, np.float32(0)), f)


def mma(acc: np.ndarray, products: np.ndarray, align_bits: int) -> np.ndarray:
    """One MMA per output: acc (n,) float32 plus products (n, 8), exact in float64."""
    terms = np.concatenate([acc.astype(np.float64)[:, None], products], axis=1)
    largest = np.max(np.abs(terms), axis=1)
    lead = np.floor(np.log2(np.where(largest > 0, largest, 1.0)))
    grid = np.ldexp(1.0, (lead - align_bits + 1).astype(np.int64))[:, None]
    return toward_zero_fp32(np.sum(np.trunc(terms / grid) * grid, axis=1))


def emulate(a: np.ndarray, b: np.ndarray, flush: int, order: str, align_bits: int
            ) -> np.ndarray:
    """C = a @ b (float32 in, float32 out) summed as the kernels sum, K a multiple of 8."""
    m, k = a.shape
    n = b.shape[1]
    if k % KSTEP:
        raise ValueError(f"K = {k} is not a multiple of {KSTEP}")
    (a_big, a_small), (b_big, b_small) = split(a), split(b)

    def products(x: np.ndarray, y: np.ndarray, step: int) -> np.ndarray:
        xs = x[:, KSTEP * step:KSTEP * (step + 1)].astype(np.float64)
        ys = y[KSTEP * step:KSTEP * (step + 1), :].astype(np.float64)
        return (xs[:, None, :] * ys.T[None, :, :]).reshape(m * n, KSTEP)

    acc = np.zeros(m * n, np.float32)
    steps = k // KSTEP
    for first in range(0, steps, flush):
        group = range(first, min(first + flush, steps))
        part = np.zeros(m * n, np.float32)
        if order == "interleaved":
            for s in group:
                for x, y in ((a_small, b_big), (a_big, b_small), (a_big, b_big)):
                    part = mma(part, products(x, y, s), align_bits)
        elif order in ("small-first", "small-first-pairs"):
            width = len(group) if order == "small-first" else 2
            for start in range(0, len(group), width):
                steps_now = group[start:start + width]
                for s in steps_now:
                    for x, y in ((a_small, b_big), (a_big, b_small)):
                        part = mma(part, products(x, y, s), align_bits)
                for s in steps_now:
                    part = mma(part, products(a_big, b_big, s), align_bits)
        elif order == "cross-apart":
            for s in group:
                cross = np.zeros(m * n, np.float32)
                for x, y in ((a_small, b_big), (a_big, b_small)):
                    cross = mma(cross, products(x, y, s), align_bits)
                part = mma(part, products(a_big, b_big, s), align_bits)
                part = (part + cross).astype(np.float32)  # one FADD: round to nearest
        else:
            raise ValueError(f"unknown order {order!r}; expected one of {', '.join(ORDERS)}")
        acc = (acc + part).astype(np.float32)  # the FP32 accumulator: round to nearest
    return acc.reshape(m, n)


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(out.astype(np.float64) - ref) / np.linalg.norm(ref))


def accuracy_bench() -> Any:
    """bench/accuracy.py, beside this script (its inputs and kinds), imported as the other
    benches import their neighbours."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import accuracy

    return accuracy


def measured_rows(path: Path | None) -> dict[tuple[str, int], dict[str, Any]]:
    if path is None:
        return {}
    rows = json.loads(path.read_text())["rows"]
    return {(r["kind"], r["k"]): r for r in rows if "wgmma" in r}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", action="append", default=[],
                        help="bench/accuracy.py input kinds (default: uniform, normal, "
                             "wide-elements)")
    parser.add_argument("--k", action="append", type=int, default=[],
                        help="K values, multiples of 8 (default: 1000 4096 16384)")
    parser.add_argument("--flush", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--order", nargs="+", default=list(ORDERS), choices=ORDERS)
    parser.add_argument("--block", type=int, default=48, help="outputs per side (default 48)")
    parser.add_argument("--align-bits", type=int, default=26)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--measured", type=Path, default=None, metavar="JSON",
                        help="an accuracy JSON on the same inputs (bench/accuracy.py's)")
    parser.add_argument("--measured-order", default="small-first", choices=ORDERS,
                        help="the order wgmma summed in when --measured was measured "
                             "(default small-first, its order now)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    accuracy = accuracy_bench()
    kinds = args.kind or ["uniform", "normal", "wide-elements"]
    unknown = [kind for kind in kinds if kind not in accuracy.KINDS]
    if unknown:
        parser.error(f"unknown --kind {', '.join(unknown)}; expected one of "
                     f"{', '.join(accuracy.KINDS)}")
    ks = args.k or [1000, 4096, 16384]
    if any(k < KSTEP or k % KSTEP for k in ks):
        parser.error(f"--k must be positive multiples of {KSTEP} (got {ks})")
    if any(f not in (1, 2, 4) for f in args.flush):
        parser.error(f"--flush takes 1, 2 or 4 (got {args.flush})")
    if not 1 <= args.block <= 1024:
        parser.error(f"--block must be 1 to 1024 (got {args.block})")
    if args.measured is not None and not args.measured.exists():
        parser.error(f"--measured {args.measured}: no such file")
    measured = measured_rows(args.measured)

    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    print(f"{'kind':14s} {'K':>6s} {'FLUSH':>5s} {'order':17s} {'model':>9s} {'measured':>9s} "
          f"{'x cuBLAS':>8s}")
    for kind in kinds:
        for k in ks:
            a, b = accuracy.make_inputs(kind, 1024, 1024, k, args.seed)
            a, b = a[:args.block], b[:, :args.block]
            ref = a.astype(np.float64) @ b.astype(np.float64)
            seen = measured.get((kind, k))
            for flush in args.flush:
                for order in args.order:
                    model = relative_error(emulate(a, b, flush, order, args.align_bits), ref)
                    row: dict[str, Any] = {"kind": kind, "k": k, "flush": flush, "order": order,
                                           "model_relative": model}
                    if seen is not None:
                        row["cublas_measured"] = seen["cublas_fp32"]["relative"]
                        row["ratio_to_cublas"] = model / row["cublas_measured"]
                        if order == args.measured_order and seen["wgmma"]["config"].get("FLUSH") == flush:
                            row["wgmma_measured"] = seen["wgmma"]["relative"]
                    rows.append(row)
                    print(f"{kind:14s} {k:6d} {flush:5d} {order:17s} {model:9.3g} "
                          f"{row.get('wgmma_measured', float('nan')):9.3g} "
                          f"{row.get('ratio_to_cublas', float('nan')):8.2f}", flush=True)
    result = {"what": "modeled relative error of 3xTF32 sums in each order (bench/accuracy.py's "
                      "inputs, top-left block of outputs) beside the measured errors",
              "align_bits": args.align_bits, "block": args.block, "seed": args.seed,
              "measured_from": str(args.measured) if args.measured else None,
              "measured_order": args.measured_order if args.measured else None,
              "seconds": time.monotonic() - started, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"JSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
