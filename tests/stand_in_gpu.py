"""A stand-in GPU bench for the recording sweep's own code on CPU (real NVRTC compiles, made-up
timings): ``tuner.measure.testing.GpuBench``, but each CUBIN's first timing is 10 % fast, as a
lucky single timing would be, and one chosen timing can raise GpuFault."""

from __future__ import annotations

import pytest


class LuckyBench:
    """The stand-in GPU bench (``tuner.measure.testing.GpuBench``), but every CUBIN's first
    timing is 10 % fast, and ``fault_on`` (a timing's number, counted over the process) raises
    GpuFault: the recording sweep's own code then runs on CPU with real NVRTC compiles. ``lucky``
    holds the lucky rates handed out."""

    timings = 0
    fault_on: int | None = None
    seen: set[bytes] = set()
    lucky: set[float] = set()

    def __new__(cls, device: int = 0):
        from tuner.measure import testing

        class Bench(testing.GpuBench):
            def evaluate(self, cubin, launches, workspace_bytes, flops):
                LuckyBench.timings += 1
                if LuckyBench.timings == LuckyBench.fault_on:
                    raise testing.GpuFault("stand-in: CUDA_ERROR_ILLEGAL_ADDRESS")
                result = super().evaluate(cubin, launches, workspace_bytes, flops)
                if cubin not in LuckyBench.seen:
                    LuckyBench.seen.add(cubin)
                    result["gflops"] *= 1.1
                    LuckyBench.lucky.add(result["gflops"])
                return result

        return Bench(device)


@pytest.fixture
def stand_in_gpu(monkeypatch, tmp_path):
    from tuner.measure import gpu, testing

    monkeypatch.setenv("GEMMTUNE_CACHE", str(tmp_path / "cubins"))
    monkeypatch.setattr(gpu, "GpuBench", LuckyBench)
    monkeypatch.setattr(gpu, "GpuFault", testing.GpuFault)
    LuckyBench.timings, LuckyBench.fault_on, LuckyBench.seen, LuckyBench.lucky = 0, None, set(), set()
    return LuckyBench
