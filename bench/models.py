"""Real FP32 PyTorch models, unchanged, with the switch on: speed against torch FP32 and TF32, and
error against float64 next to torch FP32's (GPU host).

    python bench/models.py [--models encoder,decoder,mlp] [--tune-budget 90] [--kernel wgmma ...]
                           [--db URL] [--reps 20] [--out bench/results/models-<gpu>.json]

Models (torch.nn only, FP32, on the GPU):
- encoder: nn.TransformerEncoderLayer(d_model 1024, 16 heads, feed-forward 4096, dropout 0,
  batch_first), batch 8 × 512 tokens, train mode (so no fused inference path hides its GEMMs);
  its attention is PyTorch's fused scaled_dot_product_attention, whose GEMMs no switch can reach.
- decoder: a GPT-style block (pre-LayerNorm, causal self-attention written with matmul, so its
  batched GEMMs are torch.bmm calls, GELU MLP 4×), d_model 1024, 16 heads, batch 8 × 512 tokens.
- mlp: Linear 1000→3001→1537→1000 with GELU, batch 8191: widths that are multiples of nothing.

Per model: (1) its workload — forward plus a training step, after one warm-up step, recorded with
gemmtune.record_workload; (2) tuned with the tuner's own command on that workload,
`python -m tuner --gpu N --workload FILE --budget S [--kernel …] --db DB`; (3) timed, forward
and full training step (forward, backward, SGD step), median of --reps CUDA-event timings after
warm-up, for torch FP32 (allow_tf32 off), torch TF32 and the switch on (FP32, tuned kernels where
they beat cuBLAS), all in this process; (4) output and gradient errors against a float64 copy of
the model on the same inputs (relative norm error; for gradients the largest over parameters), for
torch FP32 and the switch; (5) the share of the model's GEMM FLOPs the switch served (the fused
attention of the encoder counts as GEMM FLOPs not served). Prints a table and writes JSON.
Targets (H100, issue 57): ≥ 90 % of GEMM FLOPs served; encoder forward ≥ 1.6× and training step
≥ 1.4× torch FP32; errors ≤ 2× torch FP32's. docs/serving.md, "Models: bench/models.py".
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

import gemmtune  # noqa: E402
from bench.throughput import gpu_slug  # noqa: E402
from gemmtune import torchpath  # noqa: E402

TARGETS = {"served": 0.90, "encoder forward": 1.6, "encoder train": 1.4, "error": 2.0}


def build(name: str, torch, device):
    """(model, input) for one of the benchmark's models, FP32 on `device`, seeded."""
    nn = torch.nn
    torch.manual_seed(0)
    if name == "encoder":
        model = nn.TransformerEncoderLayer(1024, 16, 4096, dropout=0.0, batch_first=True)
        x = torch.randn(8, 512, 1024)
    elif name == "decoder":
        model = DecoderBlock(torch, 1024, 16)
        x = torch.randn(8, 512, 1024)
    elif name == "mlp":
        model = nn.Sequential(nn.Linear(1000, 3001), nn.GELU(), nn.Linear(3001, 1537), nn.GELU(),
                              nn.Linear(1537, 1000))
        x = torch.randn(8191, 1000)
    else:
        raise ValueError(f"unknown model {name!r}; known: encoder, decoder, mlp")
    return model.to(device).train(), x.to(device)


def DecoderBlock(torch, d: int, heads: int):
    nn = torch.nn

    class Block(nn.Module):
        """Pre-LayerNorm GPT block; attention with explicit matmuls (batched GEMMs)."""

        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
            q, k, v = (z.view(b, t, heads, d // heads).transpose(1, 2).reshape(b * heads, t, d // heads)
                       for z in (q, k, v))
            scores = torch.matmul(q, k.transpose(1, 2)) / math.sqrt(d // heads)
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            att = torch.matmul(scores.masked_fill(mask, float("-inf")).softmax(-1), v)
            att = att.view(b, heads, t, d // heads).transpose(1, 2).reshape(b, t, d)
            x = x + self.proj(att)
            return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))

    return Block()


def step(model, x, optimizer=None):
    """Forward (and, with an optimizer, backward and an SGD step)."""
    out = model(x)
    if optimizer is None:
        return out
    optimizer.zero_grad(set_to_none=True)
    out.square().mean().backward()
    optimizer.step()
    return out


def timed(torch, fn, reps: int) -> float:
    """Median milliseconds of fn over reps CUDA-event timings, after three warm-up calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def errors(torch, model, x, reference, ref_out, ref_grads) -> tuple[float, float]:
    """(output error, largest gradient error) of `model` against the float64 reference."""
    model.zero_grad(set_to_none=True)
    out = model(x)
    out.square().mean().backward()
    out_err = ((out.double() - ref_out).norm() / ref_out.norm()).item()
    grad_err = max(((p.grad.double() - g).norm() / g.norm()).item()
                   for p, g in zip(model.parameters(), ref_grads) if g is not None and g.norm() > 0)
    return out_err, grad_err


def attention_flops(name: str) -> tuple[int, int]:
    """GEMM FLOPs of the encoder's fused attention per (forward, training step): QKᵀ and PV, each
    2·B·H·S²·D, and twice that again in the backward pass. No switch reaches inside that kernel."""
    if name != "encoder":
        return 0, 0
    b, h, s, d = 8, 16, 512, 64
    forward = 2 * (2 * b * h * s * s * d)
    return forward, 3 * forward


def flops(workload: dict) -> dict[tuple, int]:
    return {(p["m"], p["n"], p["k"], p["layout"], p["batch"]): 2 * p["m"] * p["n"] * p["k"] * p["batch"] * p["count"]
            for p in workload["problems"]}


def served_share(torch, workload: dict, source: str, extra: int) -> tuple[float, list[str]]:
    """The share of the workload's GEMM FLOPs (plus `extra` FLOPs never served) that the switch
    runs on tuned kernels, by its own decision per problem, and the problems it leaves to torch."""
    total, served, left = extra, 0, []
    device = torch.device("cuda")
    for key, f in flops(workload).items():
        m, n, k, layout, batch = key
        total += f
        a = torch.empty((batch, m, k) if batch > 1 else (m, k), device=device)
        b = torch.empty((batch, k, n) if batch > 1 else (k, n), device=device)
        if layout[0] == "t":
            a = a.transpose(-1, -2).contiguous().transpose(-1, -2)
        if layout[1] == "t":
            b = b.transpose(-1, -2).contiguous().transpose(-1, -2)
        if torchpath.would_run(a, b, "fp32", source):
            served += f
        else:
            left.append(f"{batch}x{m}x{n}x{k}:{layout}" if batch > 1 else f"{m}x{n}x{k}:{layout}")
    return (served / total if total else 0.0), left


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="encoder,decoder,mlp")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--tune-budget", type=float, default=90.0, help="seconds of tuning per model's workload")
    ap.add_argument("--tune-trials", type=int, default=None, help="measured configs per study (tuner --trials)")
    ap.add_argument("--kernel", action="append", default=None, help="families to tune (default: the tuner's all)")
    ap.add_argument("--db", default=None, help="results database (default: a fresh SQLite file)")
    ap.add_argument("--no-tune", action="store_true", help="measure with what --db holds already")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        sys.exit("bench/models.py needs an NVIDIA GPU and a CUDA build of PyTorch")
    torch.cuda.set_device(args.device)
    device = torch.device("cuda", args.device)
    gpu = torch.cuda.get_device_name(args.device)
    tmp = tempfile.TemporaryDirectory()
    source = args.db or f"sqlite:///{tmp.name}/models.sqlite"
    results = []
    for name in args.models.split(","):
        torch.backends.cuda.matmul.allow_tf32 = False
        model, x = build(name, torch, device)
        sgd = torch.optim.SGD(model.parameters(), lr=1e-6)
        # (1) the workload: forward and a training step, after one unrecorded (cuBLAS's and the
        # allocator's first-call costs otherwise land on the first problem: 88 % of the encoder's
        # GEMM time on the H100 went to its first GEMM)
        workload_path = Path(tmp.name) / f"{name}.workload.json"
        step(model, x, sgd)
        torch.cuda.synchronize()
        with gemmtune.record_workload(workload_path, label=f"bench/models.py {name}"):
            step(model, x, sgd)
            torch.cuda.synchronize()
        workload = json.loads(workload_path.read_text())
        # (2) tuned with the tuner's own command
        tune_s = 0.0
        if not args.no_tune:
            command = [sys.executable, "-m", "tuner", "--gpu", str(args.device), "--workload", str(workload_path),
                       "--budget", str(args.tune_budget), "--db", source]
            for k in args.kernel or []:
                command += ["--kernel", k]
            if args.tune_trials:
                command += ["--trials", str(args.tune_trials)]
            started = time.monotonic()
            print(f"{name}: {' '.join(command[1:])}", flush=True)
            done = subprocess.run(command, cwd=ROOT,  # its progress and table on our stdout
                                  env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])))
            tune_s = time.monotonic() - started
            if done.returncode != 0:
                sys.exit(f"tuning {name} failed (exit {done.returncode})")
            print(f"{name}: tuned in {tune_s:.0f} s", flush=True)
        gemmtune.clear_cache()
        # (3) times
        row = {"model": name, "gpu": gpu, "tune_s": round(tune_s, 1), "workload": workload}
        for mode, opt in (("forward", None), ("train", sgd)):
            with torch.no_grad() if opt is None else torch.enable_grad():
                torch.backends.cuda.matmul.allow_tf32 = False
                fp32 = timed(torch, lambda: step(model, x, opt), args.reps)
                torch.backends.cuda.matmul.allow_tf32 = True
                tf32 = timed(torch, lambda: step(model, x, opt), args.reps)
                torch.backends.cuda.matmul.allow_tf32 = False
                with gemmtune.enabled(source=source) as counts:
                    tuned = timed(torch, lambda: step(model, x, opt), args.reps)
            row[mode] = {"torch_fp32_ms": fp32, "torch_tf32_ms": tf32, "gemmtune_ms": tuned,
                         "speedup_vs_fp32": fp32 / tuned, "speedup_vs_tf32": tf32 / tuned,
                         "routed_calls": counts.routed, "torch_calls": counts.torch}
        # (4) errors against float64, same weights and inputs
        reference = copy.deepcopy(model).double()
        ref_out = reference(x.double())
        ref_out.square().mean().backward()
        ref_grads = [p.grad for p in reference.parameters()]
        ref_out = ref_out.detach()
        torch.backends.cuda.matmul.allow_tf32 = False
        torch_err = errors(torch, model, x, reference, ref_out, ref_grads)
        with gemmtune.enabled(source=source):
            tuned_err = errors(torch, model, x, reference, ref_out, ref_grads)
        row["errors"] = {"torch_fp32": {"output": torch_err[0], "gradient": torch_err[1]},
                         "gemmtune": {"output": tuned_err[0], "gradient": tuned_err[1]},
                         "ratio_output": tuned_err[0] / torch_err[0], "ratio_gradient": tuned_err[1] / torch_err[1]}
        # (5) GEMM FLOPs served
        row["served_share"], row["left_to_torch"] = served_share(torch, workload, source, attention_flops(name)[1])
        results.append(row)
        print_row(row)
        write(args, gpu, torch, results)
        del model, reference, sgd
        torch.cuda.empty_cache()
    print(f"\n{gpu}; torch {torch.__version__}; times in ms (median of {args.reps}); errors: relative norm vs float64")
    for r in results:
        print_row(r)
    print(f"wrote {write(args, gpu, torch, results)}")


HEADER = (f"{'model':<8} {'mode':<8} {'FP32':>8} {'TF32':>8} {'gemmtune':>9} {'×FP32':>6} {'×TF32':>6}  "
          f"{'routed':>7} {'served FLOPs':>12} {'err out (torch)':>20} {'err grad (torch)':>20}")


def print_row(r: dict) -> None:
    print(HEADER)
    e = r["errors"]
    for mode in ("forward", "train"):
        t = r[mode]
        print(f"{r['model']:<8} {mode:<8} {t['torch_fp32_ms']:>8.3f} {t['torch_tf32_ms']:>8.3f} {t['gemmtune_ms']:>9.3f} "
              f"{t['speedup_vs_fp32']:>6.2f} {t['speedup_vs_tf32']:>6.2f}  {t['routed_calls']:>7} "
              f"{r['served_share']:>11.1%} {e['gemmtune']['output']:>9.2e} ({e['torch_fp32']['output']:.2e}) "
              f"{e['gemmtune']['gradient']:>9.2e} ({e['torch_fp32']['gradient']:.2e})", flush=True)
    if r.get("left_to_torch"):
        print(f"{r['model']}: left to torch (no tuned kernel beats cuBLAS): {', '.join(r['left_to_torch'])}")


def write(args, gpu: str, torch, results: list) -> Path:
    """The JSON so far (written after every model: a run cut short keeps what it measured)."""
    out = args.out or ROOT / "bench" / "results" / f"models-{gpu_slug(gpu)}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"gpu": gpu, "torch": torch.__version__, "targets": TARGETS, "reps": args.reps,
                               "tune_budget_s": args.tune_budget, "tune_trials": args.tune_trials,
                               "kernels": args.kernel, "models": results,
                               "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
