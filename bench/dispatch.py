"""Host overhead of gemmtune.matmul and of the PyTorch switch over a raw kernels.gemm launch of the
same config, beside torch's own (GPU host).

    python bench/dispatch.py [--device 0] [--calls 2000] [--source URL|pack.json] [--out bench/results/dispatch-<gpu>.json]

- 256³, warm, host time per call (median of --calls, ≥ 1000): raw `kernels.gemm` with raw device
  pointers (the leanest launch there is), `gemmtune.matmul(a, b, out=c)`, `gemmtune.matmul(a, b)`
  (allocates its result), `torch.matmul(a, b, out=c)` and `torch.mm(a, b)` (TF32 off) for
  reference, and the same two torch calls with the switch on (`gemmtune.enabled()`: they run the
  tuned kernel), plus `torch.mm` with the switch on for a shape with nothing tuned (torch's own
  kernel behind the switch). The queue is drained every 256 calls, outside the timed calls, so
  launches never block on a full queue. Targets: matmul(out=) − raw ≤ 5 µs; with the switch on, a
  256³ call costs no more host time than torch's own call.
- 4096³ end to end: GPU time per call from CUDA events around 20 back-to-back calls (median of 5
  rounds) for the same three. Target: matmul within 2% of the raw kernel.

The tuning source is a fresh SQLite file holding one config per shape for this GPU's model
(tf32x3 128×64×32, the H100's best tf32x3 config at 4096³, for both), so matmul and the raw
launch run the same kernel; --source uses a real source instead (the raw launch then uses the
config matmul picked). Prints a table and writes JSON. Figures and their reading: docs/serving.md,
"Host overhead: bench/dispatch.py".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import kernels  # noqa: E402

import gemmtune  # noqa: E402
from bench.throughput import gpu_slug  # noqa: E402
from gemmtune.call import device_info  # noqa: E402

CONFIG = dict(BM=128, BN=64, BK=32, WM=64, WN=32, KGROUP=4, STAGES=2, SPLITK=1, RASTER=1)


def host_times(fn, calls: int, sync) -> list[float]:
    """Seconds per call, each call timed alone; the queue drained every 256 calls (untimed)."""
    out = []
    for i in range(calls):
        if i % 256 == 0:
            sync()
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) * 1e-9)
    sync()
    return out


def gpu_ms(fn, torch, reps: int = 20, rounds: int = 5) -> float:
    """GPU milliseconds per call: CUDA events around `reps` back-to-back calls, median of rounds."""
    per_call = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) / reps)
    return statistics.median(per_call)


@contextlib.contextmanager
def switched(fn, source):
    """The call, with the switch on around it where the row is ("switch", call)."""
    if isinstance(fn, tuple):
        with gemmtune.enabled(source=source):
            yield fn[1]
    else:
        yield fn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--calls", type=int, default=2000, help="timed calls per row at 256³ (≥ 1000)")
    ap.add_argument("--source", default=None, help="a real tuning source instead of the generated one")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.calls < 1000:
        ap.error("--calls must be at least 1000")

    import torch

    from results_support import Row, fill

    if not torch.cuda.is_available():
        sys.exit("bench/dispatch.py needs an NVIDIA GPU and a CUDA build of PyTorch")
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = args.device
    torch.cuda.set_device(dev)
    gpu, arch = device_info(dev)
    fam = kernels.get_family("tf32x3")
    if fam.reject_reasons(CONFIG, arch):
        sys.exit(f"the benchmark config does not fit {arch}: {fam.reject_reasons(CONFIG, arch)}")
    tmp = tempfile.TemporaryDirectory()
    source = args.source
    if source is None:
        source = f"sqlite:///{tmp.name}/dispatch.sqlite"
        fill(source, [Row("tf32x3", (256, 256, 256), 1e3, gpu=gpu, uuid="GPU-bench"),
                      Row("tf32x3", (4096, 4096, 4096), 6e4, gpu=gpu, uuid="GPU-bench")])
        import results_support

        assert results_support.CONFIGS["tf32x3"] == CONFIG  # what the fill above stored
    rows = {}
    sync = torch.cuda.synchronize
    for size in (256, 4096):
        a = torch.rand(size, size, device=f"cuda:{dev}") - 0.5
        b = torch.rand(size, size, device=f"cuda:{dev}") - 0.5
        c = torch.empty(size, size, device=f"cuda:{dev}")
        choice = gemmtune.explain(a, b, c, source=source)
        if choice.kind != "kernel":
            sys.exit(f"matmul would not run a tuned kernel at {size}³: {choice}")
        family, config = choice.kernel_family, choice.config
        pa, pb, pc = a.data_ptr(), b.data_ptr(), c.data_ptr()
        stream = torch.cuda.current_stream(dev).cuda_stream  # looked up once: the leanest raw launch

        def raw():
            kernels.gemm(family, config, pa, pb, pc, size, size, size, 1.0, 0.0, stream=stream, device=dev)

        untuned = torch.rand(size - 1, size, device=f"cuda:{dev}") - 0.5  # a shape nothing was tuned on
        calls = {
            "raw kernels.gemm": raw,
            "gemmtune.matmul(out=c)": lambda: gemmtune.matmul(a, b, c, source=source),
            "gemmtune.matmul (allocates)": lambda: gemmtune.matmul(a, b, source=source),
            "torch.matmul(out=c)": lambda: torch.matmul(a, b, out=c),
            "torch.mm(a, b)": lambda: torch.mm(a, b),
            "switch on: torch.matmul(out=c)": ("switch", lambda: torch.matmul(a, b, out=c)),
            "switch on: torch.mm(a, b)": ("switch", lambda: torch.mm(a, b)),
            "switch on: torch.mm, untuned shape": ("switch", lambda: torch.mm(untuned, b)),
            "torch.mm, untuned shape": lambda: torch.mm(untuned, b),
        }
        for name, fn in calls.items():  # warm: compile, load, cache the lookup
            with switched(fn, source) as call:
                for _ in range(10):
                    call()
        sync()
        for name, fn in calls.items():
            entry = rows.setdefault(name, {})
            with switched(fn, source) as call:
                routed_before = gemmtune.counts().routed
                if size == 256:
                    t = host_times(call, args.calls, sync)
                else:
                    t = None
                    entry["gpu_ms_4096"] = round(gpu_ms(call, torch), 4)
                if isinstance(fn, tuple):
                    entry[f"routed_{size}"] = gemmtune.counts().routed > routed_before
            if t is not None:
                entry["host_us_256"] = round(statistics.median(t) * 1e6, 2)
                entry["host_us_256_p90"] = round(sorted(t)[int(0.9 * len(t))] * 1e6, 2)
        rows.setdefault("_config", {})[f"{size}"] = {"family": family.name, "config": config}
        print(f"{size}³: {choice}")
    raw = rows["raw kernels.gemm"]
    overhead = rows["gemmtune.matmul(out=c)"]["host_us_256"] - raw["host_us_256"]
    e2e = rows["gemmtune.matmul(out=c)"]["gpu_ms_4096"] / raw["gpu_ms_4096"] - 1
    print(f"\n{'call':<30} {'host µs/call @256³ (median)':>28} {'p90':>8} {'GPU ms/call @4096³':>20}")
    for name, r in rows.items():
        if not name.startswith("_"):
            print(f"{name:<30} {r['host_us_256']:>28.2f} {r['host_us_256_p90']:>8.2f} {r['gpu_ms_4096']:>20.4f}")
    switch_vs_torch = rows["switch on: torch.matmul(out=c)"]["host_us_256"] - rows["torch.matmul(out=c)"]["host_us_256"]
    print(f"\nmatmul host overhead over the raw launch at 256³: {overhead:.2f} µs (target ≤ 5)")
    print(f"matmul end to end at 4096³ vs the raw kernel: {100 * e2e:+.2f}% (target within 2%)")
    print(f"switch on, torch.matmul(out=c) at 256³ against torch's own: {switch_vs_torch:+.2f} µs (target ≤ 0)")
    result = {
        "gpu": gpu, "arch": arch, "device": dev, "calls": args.calls, "source": "generated" if args.source is None
        else args.source, "rows": rows, "overhead_us_256": round(overhead, 2), "end_to_end_4096": round(e2e, 4),
        "switch_minus_torch_us_256": round(switch_vs_torch, 2),
        "torch": torch.__version__, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }  # fmt: skip
    out = args.out or ROOT / "bench" / "results" / f"dispatch-{gpu_slug(gpu)}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
