"""Running a version's kernel: validate, pick the kernel for this GPU, tune once per size bucket, launch.

The launch path. The first call for a (GPU, kernel, size bucket) builds (cached on disk),
tunes and keeps the chosen schedule's compiled launch function (``_by_bucket``); every
later call checks the inputs, finds that function by its exact size in one dict lookup
(``_by_size``) and calls it (with the tensors' addresses on torch's default stream, see
``run``): no filesystem work, no device-property queries, no tilus key extraction and no
object construction. What it needs of the GPU (which kernel, the SM
count) is asked once per device (``_devices``).

tilus 0.2.0 autotunes on the first call for each bucket of (M, N, K), timing every
schedule five times right after building, while the GPU is still clocking up from idle.
``tune_once`` ranks the schedules itself first, on a warm GPU, and writes its pick into
tilus' dispatch table: tilus then finds the bucket tuned and never times anything
itself. The ranking is saved beside the cache.

The ranking (``rank_schedules``) times what a program sees. A burst pass (each launch
alone, L2 flushed, ``measure``'s timer) is the first cut: it is quick, and it drops the
schedules that are far off. The finalists are then timed back to back, as the
benchmark's back-to-back regime times a contender (``bench``): launches queued with no
sync and no flush, rotating through operand sets larger than L2, on a loaded GPU,
windows in a fresh random order each round. The two regimes can disagree by more than
the gap between schedules: under load the clock follows each schedule's power draw, and a
kernel in a loop starts on the L2 and memory traffic its predecessor left, not on a flushed
L2. The back-to-back time picks (``ranking``). A fresh bucket's ranking takes the burst
pass (about 11 ms per schedule and round) plus TUNE_WARM_UP_S + TUNE_FINALISTS x
TUNE_ROUNDS x TUNE_WINDOW_S = 3.8 s.
"""

import dataclasses
import functools
import inspect
import math
import random
import statistics
import sys
import time
from typing import NamedTuple

import filelock
import tilus
import torch
from tilus.lang.instantiated_script import extract_keys

from support.bench import L2_ROTATION_BYTES
from support.cache import use_cache
from support.checks import check_inputs
from support.gpu import cluster_sms, gpu_arch, gpu_label
from support.measure import loop_ms, time_samples, warm_up_gpu

TUNE_QUICK_RUNS = 12  # burst pass: every schedule, median of this many runs
TUNE_FINALISTS = 5  # back-to-back pass: the fastest few of the burst pass
TUNE_WARM_UP_S = 2.0  # the finalists back to back before their windows, until the clock holds where it will (reference.md)
TUNE_WINDOW_S = 0.12  # one finalist's back-to-back window: hundreds of calls at the sizes where the pick matters
TUNE_ROUNDS = 3  # each pass in rounds, a fresh random order each, so clock drift hits every schedule alike
TUNE_TIE = 0.005  # back-to-back times this close, at least, are a tie, which the burst time breaks (see ranking)
TUNE_SETS_MAX = 32  # operand sets rotated back to back, at most (tiny sizes would need thousands)


@dataclasses.dataclass(frozen=True)
class Device:
    """What the launch path needs of one GPU, asked once per process."""

    index: int
    arch: str  # 'hopper' or 'blackwell': which kernel of a version runs here
    label: str  # the GPU's slug: its tilus cache directory
    num_sms: int


# the element type a kernel is built for, a constructor argument of every version's kernels
TILUS_DTYPES = {torch.float16: tilus.float16, torch.bfloat16: tilus.bfloat16}

_devices: dict[int, Device] = {}
_one_gpu = False  # one visible GPU: it is always the current device, and run() need not ask
# (kernel class, dtype, device index, M, N, K bucket) -> (compiled launch function, kernel arguments after C)
_by_bucket: dict[tuple, tuple] = {}
# the same launchers by exact size, (id of a version's KERNELS, dtype, device index, M, N, K): one dict
# lookup per call instead of three buckets and the device's facts; cleared when it grows large
_by_size: dict[tuple, tuple] = {}
BY_SIZE_LIMIT = 4096


def device(index: int) -> Device:
    """The GPU facts for device ``index``, looked up on its first use (UnsupportedGPUError if it cannot run these kernels)."""
    global _one_gpu
    found = _devices.get(index)
    if found is None:
        _one_gpu = torch.cuda.device_count() == 1
        found = Device(index, gpu_arch(index), gpu_label(index), torch.cuda.get_device_properties(index).multi_processor_count)
        _devices[index] = found
    return found


def bucket(x: int) -> int:
    """tilus' tuning bucket of a size: rounded up to a power of two or 1.5 times one (``extract_keys``)."""
    step = 1 << max(x.bit_length() - 2, 0)
    return -(-x // step) * step


def launch(kernels: dict, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Validate, pick the kernel for this GPU, run it (building and tuning on the first call per size bucket).

    ``kernels`` is a version's KERNELS, a module constant: its id keys the launchers.
    """
    m, n, k, index = check_inputs(a, b, out)
    launcher = _by_size.get((id(kernels), a.dtype, index, m, n, k))
    if launcher is None:
        return first_call_at_size(kernels, index, m, n, k, a, b, out)
    if out is None:
        out = a.new_empty(m, n)
    run(launcher, index, m, n, k, a, b, out)
    return out


def run(launcher: tuple, index: int, m: int, n: int, k: int, a, b, out) -> None:
    """Call a compiled launch function: with data pointers on torch's default stream, else with the tensors.

    tilus' launch function takes a tensor argument as a tensor or as its address. A
    tensor goes through tvm-ffi's DLPack conversion, which also sets the launch stream
    to torch's current one; an address skips both, and the kernel goes to tvm-ffi's
    stream, the default stream, which is torch's unless the caller chose another.
    """
    func, extra, extra_ptrs = launcher
    if _one_gpu or index == torch.cuda.current_device():
        if not current_raw_stream(index):
            func(m, n, k, a.data_ptr(), b.data_ptr(), out.data_ptr(), *extra_ptrs)
        else:
            func(m, n, k, a, b, out, *extra)
    else:  # tilus launches on the current device
        with torch.cuda.device(index):
            func(m, n, k, a, b, out, *extra)


def current_raw_stream(index: int) -> int:
    """The handle of torch's current stream on GPU ``index``: 0 for the default stream."""
    return torch._C._cuda_getCurrentRawStream(index)


def first_call_at_size(kernels: dict, index: int, m: int, n: int, k: int, a, b, out) -> torch.Tensor:
    """The first call at a size: find its bucket's launcher, building and tuning the bucket if it is new; run it."""
    gpu = device(index)
    script_cls = kernels[gpu.arch]
    if out is None:
        out = a.new_empty(m, n)
    key = (script_cls, a.dtype, index, bucket(m), bucket(n), bucket(k))
    launcher = _by_bucket.get(key)
    if launcher is None:
        refuse_capture(f"{script_cls.__name__}: the first call at {m}x{n}x{k}")
        launcher = _by_bucket[key] = first_launch(script_cls, gpu, m, n, k, a, b, out)
    else:
        run(launcher, index, m, n, k, a, b, out)
    if len(_by_size) >= BY_SIZE_LIMIT:
        _by_size.clear()
    _by_size[id(kernels), a.dtype, index, m, n, k] = launcher
    return out


def refuse_capture(first_call: str) -> None:
    """A first call builds and tunes, which synchronizes the GPU: inside a CUDA graph capture, say so instead."""
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"{first_call} builds and tunes its size bucket, which synchronizes the GPU and cannot be recorded into "
            "a CUDA graph: call it once at this size before the capture (run the model once eagerly, or "
            "support.torch_op.prepare)")


def build_tune_run(script_cls, gpu: Device, args: tuple, size: str | None = None, finalist_count: int = TUNE_FINALISTS,
                   **script_kwargs):
    """Build and tune the bucket of ``args``' size (once per machine; cached on disk), run it, return its launch
    function; ``script_kwargs`` go to the kernel's constructor, ``size`` names the size in what tuning reports
    (M x N x K, the first three arguments, by default), ``finalist_count`` schedules are timed back to back."""
    with torch.cuda.device(gpu.index):
        use_cache(script_cls, gpu.label)
        script = script_cls(**script_kwargs)
        tune_once(script, args, size, finalist_count)
        script(*args)
        return script.dispatch_table[keys(script, args)]


def first_launch(script_cls, gpu: Device, m: int, n: int, k: int, a, b, out) -> tuple:
    """Build, tune and run this size's bucket; return its launcher and the arguments after the tensors."""
    args = kernel_args(script_cls, m, n, k, a, b, out, gpu.num_sms)
    extra = args[6:]
    return build_tune_run(script_cls, gpu, args, dtype=TILUS_DTYPES[a.dtype]), extra, tuple(pointer(x) for x in extra)


def sm_count(num_sms: int | None = None) -> int:
    """``num_sms``, or the SM count of the current GPU, or 132 when building without one (an argument of the
    kernel, not compiled into it)."""
    if num_sms is not None:
        return num_sms
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count \
        if torch.cuda.is_available() else 132


def pointer(x):
    """A kernel argument as the launch function may take it without tvm-ffi's tensor conversion."""
    return x.data_ptr() if isinstance(x, torch.Tensor) else x


@functools.cache  # a class's signature never changes
def parameters(script_cls) -> tuple[str, ...]:
    return tuple(inspect.signature(script_cls.__call__).parameters)


def is_persistent(script_cls) -> bool:
    """A persistent kernel (v5 on) takes the number of SMs after M, N, K and the three tensors."""
    return "num_sms" in parameters(script_cls)


# a stream-K kernel's workspace (v8 on), per device: a ready flag and a partial tile of
# ENTRY_FLOATS fp32 per entry, ENTRIES_PER_SM entries per SM (Hopper: one per consumer warpgroup,
# three in v11's 192-row tiles)
ENTRIES_PER_SM = 3
ENTRY_FLOATS = 64 * 256
_workspaces: dict[tuple, tuple] = {}


def workspace(device: torch.device, num_sms: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(flags, partials) for the stream-K fix-up on ``device``, allocated on first use.

    The flags start at 0 and every launch leaves them at 0, so one workspace serves every
    later launch on the device, one at a time (calls on two streams at once would share it).
    """
    key = (device, num_sms)
    found = _workspaces.get(key)
    if found is None:
        entries = ENTRIES_PER_SM * num_sms
        found = _workspaces[key] = (torch.zeros(entries, dtype=torch.int32, device=device),
                                    torch.empty(entries * ENTRY_FLOATS, dtype=torch.float32, device=device))
    return found


def reserve_workspace(device: torch.device) -> None:
    """Allocate ``device``'s stream-K workspace now. Called where a model is set up: allocated on a kernel's first
    call inside torch.compile's CUDA-graph warm-up, it would come from the graphs' private pool, which then finds two
    tensors it does not own (a RuntimeError)."""
    if device.type == "cuda":
        index = torch.cuda.current_device() if device.index is None else device.index
        workspace(torch.device("cuda", index), torch.cuda.get_device_properties(index).multi_processor_count)


def kernel_args(script_cls, m: int, n: int, k: int, a, b, out, num_sms: int | None = None) -> tuple:
    """The arguments of a version's kernel: M, N, K, A, B, C; for a persistent kernel the SM count; from v8 on its
    stream-K workspace.

    ``num_sms`` defaults to the SM count of the current GPU (132 when building without one:
    the value is an argument of the kernel, not compiled into it). Without tensors (a
    build) the workspace is two null pointers. A kernel with clusters of four (v9 on) also
    takes the SMs that such clusters fill at once (``gpu.cluster_sms``).
    """
    args = (m, n, k, a, b, out)
    if not is_persistent(script_cls):
        return args
    num_sms = sm_count(num_sms)
    if "partials_ptr" not in parameters(script_cls):
        return (*args, num_sms)
    args = (*args, num_sms, *(workspace(a.device, num_sms) if isinstance(a, torch.Tensor) else (0, 0)))
    if "cluster4_sms" not in parameters(script_cls):
        return args
    if isinstance(a, torch.Tensor):
        fit = cluster_sms(a.device.index, 4)
    elif torch.cuda.is_available():  # no tensors (a tuning key's lookup): the same bucket as the call's
        fit = cluster_sms(torch.cuda.current_device(), 4)
    else:  # a build: an argument, not compiled in
        fit = num_sms
    return (*args, min(fit, num_sms // 4 * 4))


def jit_instance(script_cls, m: int, n: int, k: int, dtype: torch.dtype = torch.float16):
    """The JIT instance of a version's kernel for a size and dtype: it holds every schedule of the autotune space.

    tilus 0.2.0 has no public compile(); ``.programs()`` builds every schedule.
    """
    return script_cls(dtype=TILUS_DTYPES[dtype])._jit_instance_for(*kernel_args(script_cls, m, n, k, 0, 0, 0))


def keys(script, args: tuple):
    """tilus' (JIT key, tuning key) for a kernel call: the tuning key is the size bucket of its integers."""
    return extract_keys(args, script.const_params, script.tuning_params)


def chosen_schedule(script_cls, m: int, n: int, k: int, dtype: torch.dtype = torch.float16) -> dict:
    """The schedule picked for this size bucket and dtype (after a call at that size)."""
    script = script_cls(dtype=TILUS_DTYPES[dtype])
    jit_key, tuning_key = keys(script, kernel_args(script_cls, m, n, k, None, None, None))
    jit = script.jit_instances[jit_key]
    return jit.schedules[jit.valid_schedules[jit.dispatch_table[tuning_key]]]


def format_schedule(schedule: dict) -> str:
    """The schedule's tuned and switched parameters; the dtype has a column of its own wherever this is shown."""
    return " ".join(f"{key}={value}" for key, value in schedule.items() if key != "dtype")


def space_size(script_cls) -> int:
    """How many schedules a kernel's stacked @tilus.autotune decorators span (their product)."""
    return math.prod(len(values) for values in script_cls._autotune_space.values())


class Timed(NamedTuple):
    """One schedule's times in the ranking: ``loop_ms`` only for the finalists."""

    index: int  # the schedule's program index
    burst_ms: float  # median ms of a launch alone, L2 flushed
    loop_ms: float | None  # median over rounds of ms per call back to back
    loop_spread_ms: float | None = None  # half the range of those rounds' times


def finalists(burst_ms: dict[int, float], count: int = TUNE_FINALISTS) -> list[int]:
    """The ``count`` fastest schedules of the burst pass."""
    return sorted(burst_ms, key=burst_ms.get)[:count]


def ranking(burst_ms: dict[int, float], loop_ms: dict[int, float],
            loop_spread_ms: dict[int, float] | None = None) -> list[Timed]:
    """Every schedule, the pick first: the finalists (those in ``loop_ms``) by their back-to-back time, the others
    after them by their burst time.

    The back-to-back time decides: it is what a program's loop gets. A finalist whose time
    is within TUNE_TIE of the fastest's, or within the larger of the two's spreads (half the
    range of their windows, ``loop_spread_ms``), is level with it, and the fastest burst
    among the level ones is the pick, unless it is within TUNE_TIE of the fastest's burst:
    then the fastest back to back stays the pick. Where the host sets the loop's pace (small
    sizes), or the clock moves more between windows than the schedules differ, the windows
    cannot tell the schedules apart, and the burst can.
    """
    spread = loop_spread_ms or {}
    order = sorted(loop_ms, key=loop_ms.get)
    if order:
        fastest = order[0]
        tied = [index for index in order if loop_ms[index] - loop_ms[fastest]
                <= max(loop_ms[fastest] * TUNE_TIE, spread.get(index, 0.0), spread.get(fastest, 0.0))]
        pick = min(tied, key=burst_ms.get)
        if burst_ms[fastest] - burst_ms[pick] <= burst_ms[fastest] * TUNE_TIE:
            pick = fastest  # the bursts tie too: the loop's median is all that tells them apart
        order.remove(pick)
        order.insert(0, pick)
    order += sorted((index for index in burst_ms if index not in loop_ms), key=burst_ms.get)
    return [Timed(index, burst_ms[index], loop_ms.get(index), spread.get(index)) for index in order]


def random_like(x: torch.Tensor) -> torch.Tensor:
    """Random normal values of ``x``'s shape and dtype (fp8 through bf16)."""
    base = x.dtype if x.dtype in TILUS_DTYPES else torch.bfloat16
    return torch.randn(x.shape, dtype=base, device=x.device).to(x.dtype)


def loop_sets(launch_args: tuple) -> list[tuple]:
    """The kernel's arguments for a back-to-back loop: the caller's A, B and C, then fresh random operands and a
    fresh C, enough sets that one pass through them does not fit in L2 (``bench.operand_sets``' rule, at most
    TUNE_SETS_MAX, fewer where the GPU has no room for them); the arguments after C (the SM count, the workspace,
    fp8 scales) stay."""
    a, b, c = launch_args[3:6]
    set_bytes = sum(x.numel() * x.element_size() for x in (a, b, c))
    sets = [(a, b, c)]
    try:
        while len(sets) < min(TUNE_SETS_MAX, max(2, math.ceil(L2_ROTATION_BYTES / set_bytes))):
            sets.append((random_like(a), random_like(b), torch.empty_like(c)))
    except torch.OutOfMemoryError:
        pass
    return [(*launch_args[:3], *tensors, *launch_args[6:]) for tensors in sets]


def calls_in(seconds: float, ms: float) -> int:
    """Calls that fill about ``seconds`` at ``ms`` a call: at least 10, at most 50,000."""
    return max(10, min(50_000, int(seconds / (ms * 1e-3))))


def rank_schedules(jit, launch_args: tuple, seed: int = 0, count: int = TUNE_FINALISTS) -> list[Timed]:
    """Every built schedule, the pick first (``ranking``): a burst pass, then ``count`` finalists back to back.

    The burst pass times every schedule, TUNE_QUICK_RUNS runs each (L2 flushed before each
    run), in TUNE_ROUNDS rounds, every round in a fresh random order: the clock of a GPU
    coming up to its power cap moves within a pass, and a schedule timed all at once can
    catch a dip that puts it far down the list. The finalists are the fastest there. The
    back-to-back pass launches the finalists in turn for TUNE_WARM_UP_S, then gives each one
    window of about TUNE_WINDOW_S per round, TUNE_ROUNDS rounds in a fresh random order; a
    finalist's time is the median of its windows. The launches go on the default stream with
    addresses, as ``run`` makes them.
    """
    a, b = launch_args[3], launch_args[4]
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    funcs = [compiled.get_launch_func() for compiled in jit.compiled_programs]
    rng = random.Random(seed)

    warm_up_gpu(a, b)
    burst = {index: [] for index in range(len(funcs))}
    order = list(burst)
    for _ in range(TUNE_ROUNDS):
        rng.shuffle(order)
        for index in order:
            burst[index] += time_samples(lambda index=index: funcs[index](*launch_args),
                                         TUNE_QUICK_RUNS // TUNE_ROUNDS, flush)
    burst_ms = {index: statistics.median(times) for index, times in burst.items()}
    del flush

    chosen = finalists(burst_ms, count)
    sets = loop_sets(launch_args)  # the tensors stay alive while the launches use their addresses
    arg_sets = [tuple(pointer(x) for x in args) for args in sets]
    per_call = {index: burst_ms[index] for index in chosen}
    loop = {index: [] for index in chosen}
    with torch.cuda.stream(torch.cuda.default_stream()):
        deadline = time.perf_counter() + TUNE_WARM_UP_S
        while time.perf_counter() < deadline:  # also measures each finalist's ms a call, to size its windows
            for index in chosen:
                per_call[index] = loop_ms(funcs[index], arg_sets, calls_in(TUNE_WARM_UP_S / 10 / len(chosen),
                                                                          per_call[index]))
        for _ in range(TUNE_ROUNDS):
            rng.shuffle(chosen)
            for index in chosen:
                loop[index].append(loop_ms(funcs[index], arg_sets, calls_in(TUNE_WINDOW_S, per_call[index])))
    return ranking(burst_ms, {index: statistics.median(times) for index, times in loop.items()},
                   {index: (max(times) - min(times)) / 2 for index, times in loop.items()})


def tuning_report(timed: list[Timed], schedules: list[dict]) -> str:
    """The ranking as text, the pick first: each schedule's back-to-back and burst ms (``schedules[index]``)."""
    lines = [("# back to back: ms a call in a loop of launches with no sync, operands rotated past L2, median of "
              f"{TUNE_ROUNDS} windows ± half their range (the finalists only); burst: median ms of a launch alone, "
              "L2 flushed. The first schedule is the pick.\n"),
             f"# {'back to back':>20}  {'burst':>9}  schedule\n"]
    for t in timed:
        loop = f"{t.loop_ms:.4f} ms ±{t.loop_spread_ms or 0:.4f}" if t.loop_ms is not None else "-"
        lines.append(f"{loop:>22}  {t.burst_ms:.4f} ms  {format_schedule(schedules[t.index])}\n")
    return "".join(lines)


def tune_once(script, args: tuple, size: str | None = None, finalist_count: int = TUNE_FINALISTS) -> None:
    """Pick this size bucket's schedule with rank_schedules, unless tilus already has one cached; ``size`` and
    ``finalist_count`` as in ``build_tune_run``."""
    jit_key, tuning_key = keys(script, args)
    if (jit_key, tuning_key) in script.dispatch_table:
        return
    size = size or "x".join(map(str, args[:3]))
    jit = script._jit_instance_for(*args)
    jit.programs()  # builds every schedule (cached on disk) and loads the saved picks
    if tuning_key in jit.dispatch_table or len(jit.compiled_programs) == 1:
        return
    with filelock.FileLock(jit.cache_dir_lock):
        jit.load_dispatch_table()  # another process may have tuned this bucket meanwhile
        if tuning_key in jit.dispatch_table:
            return
        name = script.script_cls.__name__
        print(f"tuning {name} at {size}: timing {len(jit.compiled_programs)} schedules on a warm GPU...",
              file=sys.stderr, flush=True)
        start = time.perf_counter()
        timed = rank_schedules(jit, args, count=finalist_count)
        best = timed[0]
        jit.dispatch_table[tuning_key] = best.index
        jit.dump_dispatch_table()
        schedules = [jit.schedules[index] for index in jit.valid_schedules]
        report = jit.cache_dir / "tuning" / f"{size}.txt"
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(tuning_report(timed, schedules))
        print(f"tuning {name} at {size}: {best.loop_ms:.4f} ms back to back ({best.burst_ms:.4f} ms burst) "
              f"with {format_schedule(schedules[best.index])}, ranked in {time.perf_counter() - start:.1f} s "
              f"(all times: {report})", file=sys.stderr, flush=True)
