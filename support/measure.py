"""Correctness and the burst timer: random inputs, the error against an fp32 reference, kernels timed alone.

The burst timer (``time_burst``, also the autotuner's): the median of many runs after
warm-up, with CUDA events around each run, a 256 MiB buffer zeroed before each so L2
starts cold, the host queued ahead behind a short GPU spin, and every contender timed in
the same process, interleaved in rounds, in a fresh random order each round. ``bench``
adds the back-to-back regime.
"""

import contextlib
import math
import os
import random
import sys
import time

import torch

# The reference is computed in fp32 from the same fp16/bf16 inputs, so the error is the
# output's rounding (fp32 accumulation adds ~1e-6). Rounding to p significant bits errs by at
# most half an ulp, 2**-p of the value; averaged over the values of a product of random normal
# inputs it gives a relative Frobenius error of about 2.1e-4 in fp16 (p = 11) and 1.7e-3 in
# bf16 (p = 8): rounding_error() computes it. 1e-3 and 8e-3 leave 4.8x and 4.7x headroom. One
# wrong 128x128 tile of a 4096x4096 result already gives > 3e-2.
REL_ERR_TOL = {torch.float16: 1e-3, torch.bfloat16: 8e-3}
DTYPE_NAMES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def sync_or_exit(what: str, timeout_s: float) -> None:
    """Synchronize, but treat a kernel that runs past timeout_s as a deadlock and exit the process."""
    done = torch.cuda.Event()
    done.record()
    deadline = time.monotonic() + timeout_s
    while not done.query():
        if time.monotonic() > deadline:
            print(
                f"\nTIMEOUT: {what} did not finish within {timeout_s:.0f} s. A kernel that never "
                "finishes is usually waiting on an mbarrier phase that never completes (wrong "
                "initial phase, arrival count or expected bytes). Exiting.",
                file=sys.stderr,
                flush=True,
            )
            os._exit(3)
        time.sleep(0.0005)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref||_F / ||ref||_F, NaN if any element is not finite (so an unwritten NaN-poisoned tile fails)."""
    out32 = out.float()
    if not torch.isfinite(out32).all():
        return math.nan
    return (torch.linalg.norm(out32 - ref) / torch.linalg.norm(ref)).item()


def rounding_error(dtype: torch.dtype, n: int = 1 << 22, seed: int = 0) -> float:
    """The relative Frobenius error of rounding n products' worth of random normal fp32 values to ``dtype``."""
    values = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)
    return (torch.linalg.norm(values.to(dtype).float() - values) / torch.linalg.norm(values)).item()


def passes(err: float, dtype: torch.dtype = torch.float16) -> bool:
    return math.isfinite(err) and err <= REL_ERR_TOL[dtype]


def random_inputs(m: int, n: int, k: int, seed: int, dtype: torch.dtype = torch.float16):
    """Fresh random (never zero) fp16 or bf16 inputs and the fp32 reference C = A @ B.T."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn((m, k), generator=gen, device="cuda", dtype=torch.float32).to(dtype)
    b = torch.randn((n, k), generator=gen, device="cuda", dtype=torch.float32).to(dtype)
    torch.backends.cuda.matmul.allow_tf32 = False
    return a, b, a.float() @ b.float().T


def time_samples(fn, repeat: int, flush: torch.Tensor) -> list[float]:
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeat)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeat)]
    torch.cuda.synchronize()
    torch.cuda._sleep(20_000_000)  # ~10 ms of GPU spin so the host queues every run before the first starts
    for start, end in zip(starts, ends):
        flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in zip(starts, ends)]


BURST_ROUNDS = 5  # rounds of the burst timer; each contender times repeat / BURST_ROUNDS runs a round


def time_burst(calls: dict, repeat: int, warmup: int = 10, around=None) -> dict[str, float]:
    """Median ms of each call run alone (L2 flushed, queued ahead), interleaved in rounds so clock drift hits all.

    ``around(name)``, if given, is a context manager wrapped around each of a call's timed runs (telemetry).
    """
    samples = burst_samples(calls, repeat, warmup, around)
    return {name: float(torch.tensor(times).median()) for name, times in samples.items()}


def burst_samples(calls: dict, repeat: int, warmup: int = 10, around=None, seed: int = 0) -> dict[str, list[float]]:
    """Every timed ms of ``time_burst``'s runs, per call, in rounds of repeat / BURST_ROUNDS consecutive runs.

    The calls take their turns in a fresh random order each round (seeded), so no call always
    follows the same one.
    """
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")  # > L2, zeroed before every run
    for _ in range(warmup):
        for fn in calls.values():
            fn()
    samples = {name: [] for name in calls}
    order, rng = list(calls), random.Random(seed)
    for _ in range(BURST_ROUNDS):
        rng.shuffle(order)
        for name in order:
            with around(name) if around else contextlib.nullcontext():
                samples[name] += time_samples(calls[name], math.ceil(repeat / BURST_ROUNDS), flush)
    return samples


def tflops(m: int, n: int, k: int, ms: float) -> float:
    return 2 * m * n * k / (ms * 1e-3) / 1e12


def warm_up_gpu(a: torch.Tensor, b: torch.Tensor, seconds: float = 0.3) -> None:
    """Keep the tensor cores busy until the clocks have left their idle state."""
    if a.dtype not in DTYPE_NAMES.values():  # fp8 (v7): torch.matmul takes 16-bit operands
        a, b = a.to(torch.bfloat16), b.to(torch.bfloat16)
    torch.cuda.synchronize()
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(4):
            torch.matmul(a, b.T)
        torch.cuda.synchronize()
