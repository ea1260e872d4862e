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
# bf16 (p = 8): rounding_error() computes it. 1e-3 and 8e-3 leave 4.8x and 4.7x headroom, also for
# relative_error's worst tile, which random inputs put a few percent above the whole C's error.
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


# the error is measured tile by tile: one wrong 64 x 64 block of a large C must not vanish in C's norm
CHECK_TILE = 64


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """The worst CHECK_TILE x CHECK_TILE tile's relative error: its RMS error over its reference's RMS (or over
    1/CHECK_TILE of the whole reference's RMS, where the tile's own is smaller); NaN if any element is not finite
    (so an unwritten NaN-poisoned tile fails).

    Over many random elements a correct tile's relative error is the whole C's, the relative
    Frobenius error ||out - ref||_F / ||ref||_F. A wrong one is not averaged away: a zeroed
    64 x 64 block of an 8192 x 8192 C counts as the block it is (an error near 1), not as 1/128
    of C's norm (8e-3, within bf16's tolerance), and one element zeroed where the reference is
    large as at least 1/64 of its tile. Each tile against its own magnitude: inputs whose rows
    and blocks span orders of magnitude (the fp8 tests') are judged where they are large and
    where they are small; the floor keeps a tile of near-zero sums from turning rounding into
    a large ratio.
    """
    out32 = out.float()
    if not torch.isfinite(out32).all():
        return math.nan
    ref = ref.to(out32.device).float()

    def tile_means(x: torch.Tensor) -> torch.Tensor:
        """The mean of x over each tile (edge tiles over the elements inside C)."""
        rows, cols = x.shape
        padded = torch.nn.functional.pad(x, (0, -cols % CHECK_TILE, 0, -rows % CHECK_TILE))
        sums = padded.reshape(padded.shape[0] // CHECK_TILE, CHECK_TILE, -1, CHECK_TILE).sum(dim=(1, 3))
        tile_rows = (rows - CHECK_TILE * torch.arange(sums.shape[0], device=x.device)).clamp(max=CHECK_TILE)
        tile_cols = (cols - CHECK_TILE * torch.arange(sums.shape[1], device=x.device)).clamp(max=CHECK_TILE)
        return sums / (tile_rows[:, None] * tile_cols[None, :])

    error = tile_means((out32 - ref).square().reshape(-1, out32.shape[-1])).sqrt()
    scale = tile_means(ref.square().reshape(-1, ref.shape[-1])).sqrt()
    floor = ref.square().mean().sqrt() / CHECK_TILE
    return (error / scale.clamp(min=floor)).max().item()


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


def loop_ms(call, arg_sets: list[tuple], calls: int) -> float:
    """GPU ms per call over ``calls`` calls queued back to back with no sync, ``call(*arg_sets[i % len(arg_sets)])``:
    a program's loop (the benchmark's back-to-back regime, and the tuner's ranking of its finalists)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for i in range(calls):
        call(*arg_sets[i % len(arg_sets)])
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


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
    if a.dtype not in DTYPE_NAMES.values() or b.dtype != a.dtype:  # fp8 (v10, v11, the quantizer's output)
        a, b = a.to(torch.bfloat16), b.to(torch.bfloat16)
    if b.shape[-1] != a.shape[-1]:  # not a GEMM's operands: the gated quantizer reads 2 K columns and writes K
        b = a
    torch.cuda.synchronize()
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(4):
            torch.matmul(a, b.T)
        torch.cuda.synchronize()
