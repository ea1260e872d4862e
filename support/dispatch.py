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
``tune_once`` ranks the schedules itself first, on a warm GPU, with the timer of
``measure``, and writes its pick into tilus' dispatch table: tilus then finds the
bucket tuned and never times anything itself. The ranking is saved beside the cache.
"""

import dataclasses
import functools
import inspect
import math
import random
import sys

import filelock
import tilus
import torch
from tilus.lang.instantiated_script import extract_keys

from support.cache import use_cache
from support.checks import check_inputs
from support.gpu import gpu_arch, gpu_label
from support.measure import time_samples, warm_up_gpu

TUNE_QUICK_RUNS = 12  # first pass: every schedule, median of this many runs
TUNE_FINALISTS = 4  # second pass: the best few, timed again
TUNE_FINAL_RUNS = 30
TUNE_ROUNDS = 3  # each pass in rounds, a fresh random order each, so clock drift hits every schedule alike


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


def build_tune_run(script_cls, gpu: Device, args: tuple, **script_kwargs):
    """Build and tune the bucket of ``args``' size (once per machine; cached on disk), run it, return its launch
    function; ``script_kwargs`` go to the kernel's constructor."""
    with torch.cuda.device(gpu.index):
        use_cache(script_cls, gpu.label)
        script = script_cls(**script_kwargs)
        tune_once(script, args)
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


def kernel_args(script_cls, m: int, n: int, k: int, a, b, out, num_sms: int | None = None) -> tuple:
    """The arguments of a version's kernel: M, N, K, A, B, C; for a persistent kernel the SM count; from v8 on its
    stream-K workspace.

    ``num_sms`` defaults to the SM count of the current GPU (132 when building without one:
    the value is an argument of the kernel, not compiled into it). Without tensors (a
    build) the workspace is two null pointers.
    """
    args = (m, n, k, a, b, out)
    if not is_persistent(script_cls):
        return args
    num_sms = sm_count(num_sms)
    if "partials_ptr" not in parameters(script_cls):
        return (*args, num_sms)
    return (*args, num_sms, *(workspace(a.device, num_sms) if isinstance(a, torch.Tensor) else (0, 0)))


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


def rank_schedules(jit, launch_args: tuple, seed: int = 0) -> list[tuple[float, int]]:
    """(median ms, program index) for every built schedule, fastest first.

    Pass 1 times every schedule, TUNE_QUICK_RUNS runs each (L2 flushed before each run) in
    TUNE_ROUNDS rounds, every round in a fresh random order: the clock of a GPU coming up to
    its power cap moves within a pass, and a schedule timed all at once can catch a dip that
    puts it far down the list. Pass 2 re-times the TUNE_FINALISTS fastest the same way,
    TUNE_FINAL_RUNS runs each.
    """
    a, b = launch_args[3], launch_args[4]
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    funcs = [compiled.get_launch_func() for compiled in jit.compiled_programs]
    rng = random.Random(seed)

    def interleaved(indices: list[int], runs: int) -> list[tuple[float, int]]:
        samples, order = {index: [] for index in indices}, list(indices)
        for _ in range(TUNE_ROUNDS):
            rng.shuffle(order)
            for index in order:
                samples[index] += time_samples(lambda: funcs[index](*launch_args), runs // TUNE_ROUNDS, flush)
        return sorted((float(torch.tensor(times).median()), index) for index, times in samples.items())

    warm_up_gpu(a, b)
    quick = interleaved(list(range(len(funcs))), TUNE_QUICK_RUNS)
    final = interleaved([index for _, index in quick[:TUNE_FINALISTS]], TUNE_FINAL_RUNS)
    return final + quick[TUNE_FINALISTS:]


def tune_once(script, args: tuple) -> None:
    """Pick this size bucket's schedule with rank_schedules, unless tilus already has one cached."""
    jit_key, tuning_key = keys(script, args)
    if (jit_key, tuning_key) in script.dispatch_table:
        return
    m, n, k = args[:3]
    jit = script._jit_instance_for(*args)
    jit.programs()  # builds every schedule (cached on disk) and loads the saved picks
    if tuning_key in jit.dispatch_table or len(jit.compiled_programs) == 1:
        return
    with filelock.FileLock(jit.cache_dir_lock):
        jit.load_dispatch_table()  # another process may have tuned this bucket meanwhile
        if tuning_key in jit.dispatch_table:
            return
        name = script.script_cls.__name__
        print(f"tuning {name} at {m}x{n}x{k}: timing {len(jit.compiled_programs)} schedules on a warm GPU...",
              file=sys.stderr, flush=True)
        ranking = rank_schedules(jit, args)
        best_ms, best = ranking[0]
        jit.dispatch_table[tuning_key] = best
        jit.dump_dispatch_table()
        report = jit.cache_dir / "tuning" / f"{m}x{n}x{k}.txt"
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text("".join(
            f"{ms:.4f} ms  {format_schedule(jit.schedules[jit.valid_schedules[index]])}\n" for ms, index in ranking
        ))
        print(f"tuning {name} at {m}x{n}x{k}: {best_ms:.4f} ms with "
              f"{format_schedule(jit.schedules[jit.valid_schedules[best]])} (all times: {report})",
              file=sys.stderr, flush=True)
