"""NVRTC compile time per family, on this host's CPU (no GPU needed; issue 19).

    python bench/compile_time.py --per-family 4 --arch sm_90 [--family NAME ...] [--out FILE]

For a few accepted configs per family (a seeded uniform sample): the full compile the tuner's
compile pool does (``kernels.compile_program``: NVRTC front end + ptxas, with ptxas' report,
no cache), and the front end alone (the same source to PTX for ``compute_XX``), so that the
ptxas share is the difference. One compile at a time, one process: these bound the configs per
second one compile worker can feed the GPU. Prints a markdown table; JSON with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import kernels
from kernels.compiler import compile_program


def front_end_seconds(program: str, target: str) -> float:
    """NVRTC to PTX only (virtual architecture): the C++ front end and NVVM, no ptxas."""
    from cuda.bindings import nvrtc

    virtual = target.replace("sm_", "compute_")
    err, prog = nvrtc.nvrtcCreateProgram(program.encode(), b"gemm.cu", 0, [], [])
    try:
        opts = [f"--gpu-architecture={virtual}", "-std=c++17", "--no-cache"]
        start = time.perf_counter()
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        seconds = time.perf_counter() - start
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(f"front end failed: {result}")
        return seconds
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def measure(family: Any, configs: list[dict[str, int]], arch: str) -> dict[str, Any]:
    target = family.target(arch)
    full, front = [], []
    for config in configs:
        program = family.program(config)
        start = time.perf_counter()
        compile_program(program, target, f"{family.name}.cu")
        full.append(time.perf_counter() - start)
        front.append(front_end_seconds(program, target))
    return {"family": family.name, "configs": configs, "full_s": full, "front_end_s": front,
            "full_median_s": statistics.median(full), "front_median_s": statistics.median(front)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-family", type=int, default=4)
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--family", action="append", default=[])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    names = args.family or [f.name for f in kernels.FAMILIES.values()]
    rows = []
    print("| family | configs | full compile median s (min–max) | front end median s "
          "| ptxas share |")
    print("|---|---|---|---|---|")
    for name in names:
        family = kernels.get_family(name)
        if not family.offered_on(args.arch):
            continue
        configs = family.sample_accepted(args.per_family, seed=args.seed, arch=args.arch)
        row = measure(family, configs, args.arch)
        rows.append(row)
        share = 1 - row["front_median_s"] / row["full_median_s"]
        print(f"| {name} | {len(configs)} | {row['full_median_s']:.2f} "
              f"({min(row['full_s']):.2f}–{max(row['full_s']):.2f}) | "
              f"{row['front_median_s']:.2f} | {share:.0%} |", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"arch": args.arch, "nvrtc": kernels.nvrtc_version(),
                                        "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
