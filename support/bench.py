"""The two regimes every contender is timed in, and what the GPU did meanwhile.

- **burst**: each launch timed alone with CUDA events, L2 flushed before it, launches
  queued ahead behind a GPU spin (``measure.time_burst``): the kernel on its own.
- **back-to-back**: a program's loop. Many calls through the contender's Python entry
  (``matmul(a, b)``, ``torch.matmul(a, b.T)``, the peer's compiled function) queued with
  no sync between them, rotating through operand sets that together exceed L2, timed end
  to end with events: host cost shows wherever the GPU needs less time than the host.
  Under load an H100 sits at its 700 W cap and its clock follows the energy each contender
  draws, so the order and length of the windows decide what a row says: after WARM_UP_S of
  load, ROUNDS rounds, each giving every contender one window of about WINDOW_S in a fresh
  random order, so that no contender always follows the same one.

With each measurement: its spread (max - min over the rounds of the round's % of cuBLAS,
in points), host µs per call (``host_us``: the Python entry queued 100 times with no sync
behind a GPU spin, after warm-up), the SM clock and board power from NVML over the timed
windows, back to back the energy per GEMM and TFLOPS per watt from NVML's energy counter,
the efficiency per clock against the dense tensor-core peak (SMs x 4096 FLOP per clock on
Hopper: 540.7 TFLOPS/GHz on an H100 SXM) and, for memory-bound shapes, the bytes of A, B
and C over the time against a device-to-device copy measured in the same run.
"""

import dataclasses
import math
import random
import statistics
import threading
import time
from contextlib import contextmanager

import torch

from support import measure

FLOP_PER_CLOCK_PER_SM = 4096  # dense fp16/bf16 tensor-core rate per SM (Hopper wgmma, 2 FLOP per multiply-add)
L2_ROTATION_BYTES = 2 * 50 * 2**20  # operand sets rotated so they do not sit in L2: twice an H100's 50 MB
WINDOW_S = 1.0  # one back-to-back window: long enough that the clock settles into the contender's own draw
ROUNDS = 3  # windows per contender per size, one a round (median)
WARM_UP_S = 2.0  # sustained load before a size's windows: the GPU reaches its power cap and the clock it holds there
HOST_CALLS = 100  # calls queued per host-cost sample: few enough that the launch queue never fills
HOST_WARM_CALLS = 3  # untimed calls before each host-cost sample (see host_us)


@dataclasses.dataclass
class Contender:
    """One entry point to time: ``call(a, b, out)`` returns C (``out=None`` allocates it, as a program would)."""

    name: str  # v1..v9, cublas, or the peer's name
    call: object
    config: str = ""


def compile_peer(fn):
    """``fn`` through torch.compile as the peer: Inductor's Triton templates only (never cuBLAS behind the name),
    the persistent TMA template enabled, autotuned on the first call at each shape (one graph per shape)."""
    import torch._dynamo
    import torch._inductor.config as inductor

    inductor.max_autotune_gemm_backends = "TRITON"
    inductor.triton.enable_persistent_tma_matmul = True
    torch._dynamo.reset()  # a fresh graph for this shape: no recompile limit across sizes
    return torch.compile(fn, mode="max-autotune-no-cudagraphs", dynamic=False)


class Telemetry:
    """Mean SM clock and board power of one contender over its timed windows, and their energy, from NVML.

    A thread samples clock and instantaneous power every few milliseconds and sleeps in
    between (NVML calls release the GIL). The energy is the board's energy counter read at
    each window's ends. The counter moves in steps, so each reading can be up to a step
    late: over ROUNDS windows of WINDOW_S that leaves the energy per GEMM uncertain by
    several percent, more than the times are.
    """

    INTERVAL_S = 0.005

    def __init__(self, handle):
        self.handle = handle
        self.clocks: list[float] = []
        self.powers: list[float] = []
        self.millijoules = 0.0  # over every window
        self.calls = 0  # GEMMs those windows ran (the caller counts them)

    @contextmanager
    def window(self):
        if self.handle is None:
            yield
            return
        import pynvml

        stop = threading.Event()
        energy = pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)

        def sample():
            while True:
                self.clocks.append(pynvml.nvmlDeviceGetClockInfo(self.handle, pynvml.NVML_CLOCK_SM))
                (power,) = pynvml.nvmlDeviceGetFieldValues(self.handle, [pynvml.NVML_FI_DEV_POWER_INSTANT])
                if power.nvmlReturn == pynvml.NVML_SUCCESS:
                    self.powers.append(power.value.uiVal / 1000)
                if stop.wait(self.INTERVAL_S):
                    return

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        try:
            yield
        finally:
            self.millijoules += pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) - energy
            stop.set()
            thread.join()

    @property
    def sm_mhz(self) -> float:
        return statistics.fmean(self.clocks) if self.clocks else math.nan

    @property
    def power_w(self) -> float:
        return statistics.fmean(self.powers) if self.powers else math.nan

    @property
    def mj_per_call(self) -> float:
        return self.millijoules / self.calls if self.calls and self.millijoules else math.nan


def nvml_handle(device: int | None = None):
    """The NVML handle of a torch device (matched by UUID), or None where NVML cannot be read."""
    try:
        import pynvml

        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device() if device is None else device).uuid)
        return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except Exception as reason:  # noqa: BLE001  (no NVML: the rows say nothing of clock and power)
        print(f"NVML not readable ({type(reason).__name__}: {reason}); clock and power are left empty", flush=True)
        return None


def copy_bandwidth(gib: float = 1.0, repeat: int = 20) -> float:
    """Bytes read plus written per second by a device-to-device copy of ``gib`` GiB (median of ``repeat``)."""
    n = int(gib * 2**30) // 2
    src, dst = torch.empty(n, dtype=torch.uint8, device="cuda"), torch.empty(n, dtype=torch.uint8, device="cuda")
    src.fill_(1)
    for _ in range(3):
        dst.copy_(src)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeat)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeat)]
    for start, end in zip(starts, ends):
        start.record()
        dst.copy_(src)
        end.record()
    torch.cuda.synchronize()
    ms = statistics.median(start.elapsed_time(end) for start, end in zip(starts, ends))
    return 2 * n / (ms * 1e-3)


def operand_sets(m: int, n: int, k: int, seed: int, dtype=torch.float16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Distinct random (A, B) pairs, enough that one pass through them does not fit in L2."""
    set_bytes = (m * k + n * k + m * n) * torch.finfo(dtype).bits // 8
    count = max(2, math.ceil(L2_ROTATION_BYTES / set_bytes))
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [
        (torch.randn((m, k), generator=gen, device="cuda").to(dtype), torch.randn((n, k), generator=gen, device="cuda").to(dtype))
        for _ in range(count)
    ]


def host_us(contenders: list[Contender], sets, gpu_ms: dict, rounds: int = 9) -> dict[str, float]:
    """CPU µs per call of each contender's entry point, ``call(a, b, None)``, queued with no sync.

    Each sample queues up to HOST_CALLS calls (fewer where the GPU would need more than
    0.1 s to run them, ``gpu_ms`` per call) behind a GPU spin, so the host measures only its
    own work, never a wait for the GPU; contenders alternate, median over ``rounds`` samples.
    The first call after the sync that ends the previous sample is slow (timed with the
    rest, it doubled torch.matmul's per-call cost at 16384³, where only ten calls are
    timed), and a program's loop has no such sync, so HOST_WARM_CALLS calls are queued
    untimed first.
    """
    samples = {c.name: [] for c in contenders}
    for _ in range(rounds):
        for c in contenders:
            calls = max(10, min(HOST_CALLS, int(100 / gpu_ms[c.name])))
            torch.cuda.synchronize()
            torch.cuda._sleep(40_000_000)  # 20-30 ms of GPU spin: longer than the calls take to queue
            for i in range(HOST_WARM_CALLS):
                c.call(*sets[-1 - i % len(sets)], None)
            start = time.perf_counter()
            for i in range(calls):
                a, b = sets[i % len(sets)]
                c.call(a, b, None)
            samples[c.name].append((time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return {name: statistics.median(times) for name, times in samples.items()}


def time_back_to_back(contenders: list[Contender], sets, telemetry: dict, seed: int = 0) -> dict[str, list[list[float]]]:
    """Ms per call of each contender in each round (a one-window list), back to back, after WARM_UP_S of load.

    Each round gives every contender one window of about WINDOW_S, in a fresh random order.
    """
    arg_sets = [(a, b, None) for a, b in sets]  # each call's arguments: C is allocated by the call, as in a program
    per_call = {c.name: measure.loop_ms(c.call, arg_sets, 10) for c in contenders}  # also the first-window calibration
    deadline = time.perf_counter() + WARM_UP_S
    while time.perf_counter() < deadline:
        for c in contenders:
            measure.loop_ms(c.call, arg_sets, max(1, int(WARM_UP_S / 10 / len(contenders) / (per_call[c.name] * 1e-3))))
    samples = {c.name: [] for c in contenders}
    order, rng = list(contenders), random.Random(seed)
    for _ in range(ROUNDS):
        rng.shuffle(order)
        for c in order:
            calls = min(100_000, max(10, int(WINDOW_S / (per_call[c.name] * 1e-3))))
            with telemetry[c.name].window():
                samples[c.name].append([measure.loop_ms(c.call, arg_sets, calls)])
            telemetry[c.name].calls += calls
    return samples


def time_burst(contenders: list[Contender], a, b, outs: dict, repeat: int, telemetry: dict,
               seed: int = 0) -> dict[str, list[float]]:
    """Each contender's launches alone (``measure.burst_samples``), per round, with its clock and power."""
    calls = {c.name: (lambda c=c: c.call(a, b, outs[c.name])) for c in contenders}
    samples = measure.burst_samples(calls, repeat, around=lambda name: telemetry[name].window(), seed=seed)
    per_round = math.ceil(repeat / measure.BURST_ROUNDS)
    return {name: [times[i:i + per_round] for i in range(0, len(times), per_round)] for name, times in samples.items()}


def median_ms(rounds: list[list[float]]) -> float:
    """The median of every timed ms of every round."""
    return statistics.median(ms for times in rounds for ms in times)


def ratio_and_spread(rounds: dict[str, list[list[float]]], name: str) -> tuple[float, float]:
    """% of cuBLAS (its median over the contender's) and the spread: max - min over the rounds of the round's ratio.

    ``rounds`` holds each contender's ms, a list per round (one window back to back, a run of
    launches in a burst), each round's median taken as the round's time. For cuBLAS itself the
    spread is that of its own rounds' times around their median, in % of it.
    """
    mine = [statistics.median(times) for times in rounds[name]]
    cublas = [statistics.median(times) for times in rounds["cublas"]]
    pct = 100 * median_ms(rounds["cublas"]) / median_ms(rounds[name])
    if name == "cublas":
        return pct, 100 * (max(mine) - min(mine)) / statistics.median(mine)
    ratios = [100 * theirs / ours for theirs, ours in zip(cublas, mine)]
    return pct, max(ratios) - min(ratios)


def check(contender: Contender, a, b, ref, timeout_s: float) -> float:
    """Relative error of one call into an output poisoned with NaN."""
    out = torch.full(ref.shape, math.nan, dtype=a.dtype, device="cuda")
    result = contender.call(a, b, out)
    measure.sync_or_exit(f"{contender.name} at {a.shape[0]}x{b.shape[0]}x{a.shape[1]}", timeout_s)
    return measure.relative_error(result, ref)


def measure_size(contenders: list[Contender], m: int, n: int, k: int, seed: int, repeat: int,
                 copy_bytes_per_s: float, handle, timeout_s: float = 60.0, dtype=torch.float16) -> list[dict]:
    """Check every contender at one size, then time all of them in both regimes; one record per (contender, regime).

    A contender whose result is wrong is recorded with its error and not timed.
    """
    sets = operand_sets(m, n, k, seed, dtype)
    a, b = sets[0]
    ref = a.float() @ b.float().T
    errors = {c.name: check(c, a, b, ref, timeout_s) for c in contenders}
    del ref
    timed = [c for c in contenders if measure.passes(errors[c.name], dtype)]
    records = [{"version": c.name, "rel_err": errors[c.name], "config": c.config} for c in contenders
               if c not in timed]
    if not timed:
        return records
    outs = {c.name: torch.empty((m, n), dtype=a.dtype, device="cuda") for c in timed}
    burst_telemetry = {c.name: Telemetry(handle) for c in timed}
    burst = time_burst(timed, a, b, outs, repeat, burst_telemetry, seed)
    hosts = host_us(timed, sets, {name: median_ms(rounds) for name, rounds in burst.items()})
    loop_telemetry = {c.name: Telemetry(handle) for c in timed}
    loop = time_back_to_back(timed, sets, loop_telemetry, seed)
    data_bytes = (m * k + n * k + m * n) * a.element_size()
    num_sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    for regime, rounds, telemetry in (("burst", burst, burst_telemetry), ("back-to-back", loop, loop_telemetry)):
        for c in timed:
            ms = median_ms(rounds[c.name])
            pct, spread = ratio_and_spread(rounds, c.name) if "cublas" in rounds else (math.nan, math.nan)
            sm_mhz, mj = telemetry[c.name].sm_mhz, telemetry[c.name].mj_per_call
            tflops = measure.tflops(m, n, k, ms)
            per_ghz = tflops / (sm_mhz / 1000)
            records.append({
                "version": c.name, "regime": regime, "ms": ms, "tflops": tflops, "pct_of_cublas": pct,
                "host_us": hosts[c.name], "sm_mhz": sm_mhz, "power_w": telemetry[c.name].power_w,
                "tflops_per_ghz": per_ghz, "pct_of_clock_peak": 100 * per_ghz / (num_sms * FLOP_PER_CLOCK_PER_SM / 1000),
                "pct_of_bandwidth": 100 * data_bytes / (ms * 1e-3) / copy_bytes_per_s,
                "pct_spread": spread, "mj_per_gemm": mj if regime == "back-to-back" else math.nan,
                "tflops_per_w": 2 * m * n * k / (mj * 1e-3) / 1e12 if regime == "back-to-back" else math.nan,
                "rel_err": errors[c.name], "config": c.config,
            })
    return records
