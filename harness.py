"""What every stage shares: GPU dispatch, input checks, builds, correctness, timing and the CLI.

Each ``matmul_vN.py`` defines its kernels and calls into this module, so the stage
files hold only the GEMM ideas. Nothing here is specific to one stage.

- :func:`launch` validates ``matmul(a, b, out)`` input and runs the kernel for this GPU.
- :func:`build_schedules` builds every autotune schedule of a kernel for sm_90a or
  sm_100a without a GPU (CI, and the fallback of the CLI on machines without one).
- :func:`main` is the command line of every stage: check against cuBLAS, then time.
"""

import argparse
import csv
import dataclasses
import datetime
import hashlib
import inspect
import math
import os
import re
import sys
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

import filelock
import tilus
import tilus.drivers
import tilus.target
import torch
from tilus.hidet.backend.build import NVCC
from tilus.lang.instantiated_script import extract_keys
from tilus.utils.multiprocess import parallel_imap

import compat

compat.apply()

REPO = Path(__file__).resolve().parent
CACHE_ROOT = Path(os.environ.get("MATMUL_TUTORIAL_CACHE", REPO / ".cache" / "tilus"))
RESULTS_DIR = REPO / "results"
CSV_FIELDS = ["gpu", "version", "m", "n", "k", "ms", "tflops", "pct_of_cublas", "rel_err", "config", "tilus", "torch", "date"]

# The output is fp16, so rounding it alone gives a relative Frobenius error of about
# 2**-11 / sqrt(3) = 2.8e-4 (fp32 accumulation adds ~1e-6). 1e-3 leaves 3.5x headroom;
# one wrong 128x128 tile of a 4096x4096 result already gives > 3e-2.
REL_ERR_TOL = 1e-3

DEFAULT_SIZES = ["4096", "8192"]


@dataclasses.dataclass(frozen=True)
class Arch:
    name: str
    target: tilus.target.Target
    sm: str
    mma_instruction: str


ARCHS = {
    "hopper": Arch("hopper", tilus.target.nvgpu_sm90a, "sm_90a", "wgmma.mma_async"),
    "blackwell": Arch("blackwell", tilus.target.nvgpu_sm100a, "sm_100a", "tcgen05.mma"),
}


class UnsupportedGPUError(ValueError):
    """The tensors live on a GPU these kernels were not written for."""


# ----------------------------------------------------------------------------------------
# GPU detection and input validation


def gpu_arch(device: torch.device | None = None) -> str:
    """'hopper' (sm_90) or 'blackwell' (sm_100 family) for the device, else UnsupportedGPUError."""
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        raise UnsupportedGPUError(f"no CUDA GPU is visible to torch {torch.__version__} ({build})")
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) == (9, 0):
        return "hopper"
    if major == 10:
        return "blackwell"
    raise UnsupportedGPUError(
        f"{torch.cuda.get_device_name(device)} is sm_{major}{minor}; these kernels need "
        "Hopper (sm_90: wgmma) or Blackwell (sm_100/sm_103: tcgen05)"
    )


def gpu_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100', 'NVIDIA H100 PCIe' -> 'h100-pcie' (results file names)."""
    lowered = name.lower()
    model = re.search(r"\b([a-z]{1,2}\d{2,3}[a-z]?)\b", lowered)
    if model is None:
        return re.sub(r"[^a-z0-9]+", "-", lowered).strip("-")
    variants = [v for v in ("pcie", "nvl") if v in lowered]
    return "-".join([model.group(1), *variants])


def _check_tensor(name: str, t, shape=None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.float16:
        raise TypeError(f"{name} must be torch.float16, got {t.dtype}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D, got {t.dim()}-D with shape {tuple(t.shape)}")
    if shape is not None and tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape} (M x N), got {tuple(t.shape)}")


def _check_layout(name: str, t: torch.Tensor) -> None:
    rows, cols = t.shape
    if t.stride(1) != 1 or (rows > 1 and t.stride(0) != cols):
        raise ValueError(
            f"{name} must be contiguous (row-major, strides ({cols}, 1)), got strides {t.stride()}; "
            "call .contiguous() first"
        )
    if cols % 8:
        raise ValueError(
            f"{name} has {cols} columns: TMA needs 16-byte row strides, so the row length must be a "
            "multiple of 8 for fp16 (K for A and B, N for the output); pad it"
        )
    if t.data_ptr() % 16:
        raise ValueError(f"{name} must start at a 16-byte aligned address for TMA (a sliced view may not)")


def _overlaps(x: torch.Tensor, y: torch.Tensor) -> bool:
    x0, y0 = x.data_ptr(), y.data_ptr()
    return x.device == y.device and x0 < y0 + y.numel() * 2 and y0 < x0 + x.numel() * 2


def check_inputs(a, b, out=None) -> tuple[int, int, int]:
    """Validate ``matmul(a, b, out)`` input; return (M, N, K). Raises TypeError/ValueError naming the rule."""
    _check_tensor("a", a)
    _check_tensor("b", b)
    (m, k), (n, kb) = a.shape, b.shape
    if k != kb:
        raise ValueError(f"K mismatch: a is {m}x{k} and b is {n}x{kb}; C = A @ B.T needs a.shape[1] == b.shape[1]")
    if 0 in (m, n, k):
        raise ValueError(f"empty dimension: M={m}, N={n}, K={k}; all must be at least 1")
    if max(m * k, n * k, m * n) >= 2**31:
        raise ValueError(f"{m}x{n}x{k} is too large: the kernels index each matrix with 32-bit integers")
    _check_layout("a", a)
    _check_layout("b", b)
    if out is not None:
        _check_tensor("out", out, shape=(m, n))
    if n % 8:
        raise ValueError(f"N={n}: the output's rows are stored by TMA, so N must be a multiple of 8 for fp16; pad b")
    if out is not None:
        _check_layout("out", out)
    for name, t in (("a", a), ("b", b), ("out", out)):
        if t is not None and t.device.type != "cuda":
            raise ValueError(f"{name} is on the {t.device.type.upper()}; move it to the GPU (.cuda())")
    if b.device != a.device or (out is not None and out.device != a.device):
        raise ValueError(f"a, b and out must be on one GPU, got {a.device}, {b.device}, {getattr(out, 'device', '-')}")
    if out is not None and (_overlaps(out, a) or _overlaps(out, b)):
        raise ValueError("out must not share memory with a or b")
    return m, n, k


# ----------------------------------------------------------------------------------------
# tilus cache: one directory per GPU model and per version of the kernel source


def _kernel_sources(script_cls) -> list[Path]:
    """The files a kernel's code comes from: its stage, the tilus.Class helpers it uses, compat."""
    module = sys.modules[script_cls.__module__]
    helpers = {
        Path(inspect.getsourcefile(value))
        for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, tilus.Class) and value.__module__ != "tilus.lang.constructs.state"
    }
    return [Path(inspect.getsourcefile(script_cls)), *sorted(helpers), Path(compat.__file__)]


def _source_key(script_cls) -> str:
    digest = hashlib.sha256(tilus.__version__.encode())
    for path in _kernel_sources(script_cls):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:10]


def cache_dir_for(script_cls, label: str) -> Path:
    """tilus keys neither its tuning cache by GPU model nor its failure cache by kernel source: we do both."""
    return CACHE_ROOT / label / f"{Path(inspect.getsourcefile(script_cls)).stem}-{_source_key(script_cls)}"


def _use_cache(script_cls, label: str) -> None:
    tilus.option.cache_dir(cache_dir_for(script_cls, label))


def _gpu_label(device=None) -> str:
    return gpu_slug(torch.cuda.get_device_name(device))


# ----------------------------------------------------------------------------------------
# running a kernel


def launch(kernels: dict, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Validate, pick the kernel for this GPU, run it (autotuning on the first call per size bucket)."""
    m, n, k = check_inputs(a, b, out)
    script_cls = kernels[gpu_arch(a.device)]
    if out is None:
        out = torch.empty((m, n), dtype=torch.float16, device=a.device)
    with torch.cuda.device(a.device):
        _use_cache(script_cls, _gpu_label(a.device))
        script = script_cls()
        _tune_once(script, m, n, k, a, b, out)
        script(m, n, k, a, b, out)
    return out


def _jit_instance(script_cls, m: int, n: int, k: int):
    # tilus 0.2.0 has no public compile(): the JIT instance transpiles every schedule of the
    # autotune space, and .programs() builds them all.
    return script_cls()._jit_instance_for(m, n, k, 0, 0, 0)


def _keys(script, m: int, n: int, k: int):
    return extract_keys((m, n, k, None, None, None), script.const_params, script.tuning_params)


def chosen_schedule(script_cls, m: int, n: int, k: int) -> dict:
    """The schedule the autotuner picked for this size bucket (after a call at that size)."""
    script = script_cls()
    jit_key, tuning_key = _keys(script, m, n, k)
    jit = script.jit_instances[jit_key]
    return jit.schedules[jit.valid_schedules[jit.dispatch_table[tuning_key]]]


def format_schedule(schedule: dict) -> str:
    return " ".join(f"{key}={value}" for key, value in schedule.items())


def _wait(what: str, timeout_s: float) -> None:
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


def passes(err: float) -> bool:
    return math.isfinite(err) and err <= REL_ERR_TOL


def random_inputs(m: int, n: int, k: int, seed: int):
    """Fresh random (never zero) fp16 inputs and the fp32 reference C = A @ B.T."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn((m, k), generator=gen, device="cuda", dtype=torch.float32).half()
    b = torch.randn((n, k), generator=gen, device="cuda", dtype=torch.float32).half()
    torch.backends.cuda.matmul.allow_tf32 = False
    return a, b, a.float() @ b.float().T


def _time_samples(fn, repeat: int, flush: torch.Tensor) -> list[float]:
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


def time_against_cublas(kernel_fn, cublas_fn, repeat: int, warmup: int = 10) -> tuple[float, float]:
    """Median ms of kernel_fn and cublas_fn, measured interleaved in rounds so clock drift hits both."""
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")  # > L2, zeroed before every run
    for _ in range(warmup):
        kernel_fn()
        cublas_fn()
    ours, theirs = [], []
    rounds = 5
    for _ in range(rounds):
        theirs += _time_samples(cublas_fn, math.ceil(repeat / rounds), flush)
        ours += _time_samples(kernel_fn, math.ceil(repeat / rounds), flush)
    return float(torch.tensor(ours).median()), float(torch.tensor(theirs).median())


def tflops(m: int, n: int, k: int, ms: float) -> float:
    return 2 * m * n * k / (ms * 1e-3) / 1e12


# ----------------------------------------------------------------------------------------
# autotuning: tilus 0.2.0 times its candidates from idle clocks, five runs each, so a
# close second could win. We rank them ourselves, on a warm GPU, and hand tilus the pick.

TUNE_QUICK_RUNS = 10  # first pass: every schedule, median of this many runs
TUNE_FINALISTS = 3  # second pass: the best few, interleaved in rounds as in time_against_cublas
TUNE_FINAL_RUNS = 30


def _warm_up_gpu(a: torch.Tensor, b: torch.Tensor, seconds: float = 0.3) -> None:
    """Keep the tensor cores busy until the clocks have left their idle state."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(4):
            torch.matmul(a, b.T)
        torch.cuda.synchronize()


def rank_schedules(jit, launch_args: tuple) -> list[tuple[float, int]]:
    """(median ms, program index) for every built schedule, fastest first.

    Pass 1 times every schedule (median of TUNE_QUICK_RUNS, L2 flushed before each run);
    pass 2 re-times the TUNE_FINALISTS fastest interleaved, TUNE_FINAL_RUNS runs each, so
    that clock drift hits all finalists alike.
    """
    a, b = launch_args[3], launch_args[4]
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    funcs = [compiled.get_launch_func() for compiled in jit.compiled_programs]
    _warm_up_gpu(a, b)
    quick = []
    for index, func in enumerate(funcs):
        samples = _time_samples(lambda: func(*launch_args), TUNE_QUICK_RUNS, flush)
        quick.append((float(torch.tensor(samples).median()), index))
    quick.sort()
    finalists = [index for _, index in quick[:TUNE_FINALISTS]]
    samples = {index: [] for index in finalists}
    rounds = 3
    for _ in range(rounds):
        for index in finalists:
            samples[index] += _time_samples(lambda: funcs[index](*launch_args), TUNE_FINAL_RUNS // rounds, flush)
    final = sorted((float(torch.tensor(samples[index]).median()), index) for index in finalists)
    return final + quick[TUNE_FINALISTS:]


def _tune_once(script, m: int, n: int, k: int, a, b, out) -> None:
    """Pick this size bucket's schedule with rank_schedules, unless tilus already has one cached."""
    jit_key, tuning_key = _keys(script, m, n, k)
    if (jit_key, tuning_key) in script.dispatch_table:
        return
    jit = script._jit_instance_for(m, n, k, a, b, out)
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
        ranking = rank_schedules(jit, (m, n, k, a, b, out))
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


# ----------------------------------------------------------------------------------------
# building without a GPU


@dataclasses.dataclass
class BuildResult:
    schedule: dict
    error: str = ""
    module_dir: Path | None = None
    registers: int = 0
    spill_bytes: int = 0
    stack_bytes: int = 0
    dynamic_smem: int = 0
    mma_count: int = 0
    # e.g. C7515 (wgmma serialised) or C7508 (setmaxnreg ignored): a silent slowdown
    ptxas_warnings: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.error

    def describe(self, arch: Arch) -> str:
        if not self.ok:
            return "FAILED: " + self.error.strip().splitlines()[-1]
        return (
            f"ok, {self.registers} registers, {self.spill_bytes} B spilled, {self.stack_bytes} B stack, "
            f"{self.dynamic_smem} B shared, {self.mma_count} x {arch.mma_instruction}"
            + "".join(f"; {warning}" for warning in self.ptxas_warnings)
        )


class _CompileOnlyNVCC(NVCC):
    """tilus' own nvcc command (host stub and kernel), stopping at an object file and keeping the PTX."""

    LOG = "_compileonlynvcc_output.txt"

    def run_compile_command(self, command, src_path, out_lib_path, keep_files):
        super().run_compile_command(command + " --keep", src_path, out_lib_path, [*keep_files, "source.ptx"])


def _compile_object(source_file, output_library_file, target, **_):
    # The GPU-less stand-in for tilus' compile_source: that one refuses to run without a
    # GPU and links against libcuda.so, which a CPU machine lacks. An object file is enough
    # to prove that nvcc and ptxas accept the kernel.
    _CompileOnlyNVCC().compile(source_file, str(Path(output_library_file).with_name("kernel.o")), target)


@contextmanager
def _building_for(target: tilus.target.Target):
    previous_target, previous_compile = tilus.target._target, tilus.drivers.compile_source
    tilus.target.set_current_target(target)
    tilus.drivers.compile_source = _compile_object
    try:
        yield
    finally:
        tilus.target._target, tilus.drivers.compile_source = previous_target, previous_compile


def _build_program(job) -> tuple[str, str]:
    program, options = job
    module_dir = tilus.drivers.get_cache_dir(program, options) / "module"
    if (module_dir / "kernel.o").exists():
        return str(module_dir), ""
    try:
        tilus.drivers.build_program(program, options)
    except Exception:
        return str(module_dir), traceback.format_exc()
    return str(module_dir), ""


def _inspect_build(result: BuildResult, arch: Arch) -> None:
    log = (result.module_dir / _CompileOnlyNVCC.LOG).read_text()
    result.registers = int(re.search(r"Used (\d+) registers", log).group(1))
    result.spill_bytes = sum(int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", log))
    result.stack_bytes = int(re.search(r"(\d+) bytes stack frame", log).group(1))
    result.ptxas_warnings = re.findall(r"ptxas.*warning.*", log, re.IGNORECASE)
    launch_config = re.search(r", (\d+), \(cudaStream_t\)", (result.module_dir / "source.cu").read_text())
    result.dynamic_smem = int(launch_config.group(1))
    result.mma_count = (result.module_dir / "source.ptx").read_text().count(arch.mma_instruction)


def build_schedules(
    script_cls, arch_name: str, progress=print, script_kwargs: dict | None = None, call_args: tuple | None = None
) -> list[BuildResult]:
    """Build every schedule of the autotune space for the architecture, without a GPU.

    tilus' autotuner silently drops schedules that fail to build, so this returns one
    result per schedule of the space and the caller decides what a failure means.
    ``script_kwargs`` and ``call_args`` are for kernels other than the GEMMs (whose
    arguments are M, N, K and three pointers): the first are passed to the script's
    constructor, the second stand for its call's arguments, pointers as 0.
    """
    arch = ARCHS[arch_name]
    with _building_for(arch.target):
        _use_cache(script_cls, f"compile-{arch.sm}")
        jit = script_cls(**(script_kwargs or {}))._jit_instance_for(*(call_args or (4096, 4096, 4096, 0, 0, 0)))
        results = [BuildResult(schedule) for schedule in jit.schedules]
        transpiled = set(jit.transpiled_schedules)
        failed_transpile = [i for i in range(len(results)) if i not in transpiled]
        for i, message in zip(failed_transpile, jit.failed_scheduling):
            results[i].error = message
        jobs = [(program, jit.build_options) for program in jit.transpiled_programs]
        name = script_cls.__name__
        for done, (index, (module_dir, error)) in enumerate(
            zip(jit.transpiled_schedules, parallel_imap(_build_program, jobs)), start=1
        ):
            result = results[index]
            result.module_dir, result.error = Path(module_dir), error
            if result.ok:
                _inspect_build(result, arch)
            progress(f"  [{done}/{len(jobs)}] {name} {arch.sm} {format_schedule(result.schedule)}: {result.describe(arch)}")
    return results


# ----------------------------------------------------------------------------------------
# the command line of every stage


def parse_size(text: str) -> tuple[int, int, int]:
    parts = text.lower().split("x")
    if len(parts) not in (1, 3) or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"size {text!r}: expected N (for N x N x N) or MxNxK with positive integers")
    m, n, k = (int(parts[0]),) * 3 if len(parts) == 1 else map(int, parts)
    return m, n, k


def _parser(version: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"matmul_{version}.py",
        description=f"Check the {version} fp16 GEMM (C = A @ B.T) against cuBLAS, then time both.",
    )
    parser.add_argument("--sizes", nargs="+", type=parse_size, metavar="SIZE",
                        default=[parse_size(s) for s in DEFAULT_SIZES],
                        help="N (cube) or MxNxK; default: %(default)s" % {"default": " ".join(DEFAULT_SIZES)})
    parser.add_argument("--check-only", action="store_true", help="check correctness, do not time")
    parser.add_argument("--compile-only", action="store_true", help="build every schedule for sm_90a/sm_100a, run nothing")
    parser.add_argument("--arch", choices=sorted(ARCHS), help="with --compile-only: build only this architecture")
    parser.add_argument("--all-schedules", action="store_true",
                        help="check every schedule of the autotune space, not only the tuned one (no timing)")
    parser.add_argument("--repeat", type=int, default=50, help="timed runs per kernel (median reported)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds before a running kernel counts as hung")
    parser.add_argument("--save", action="store_true", help="write the rows to results/<gpu>.csv")
    return parser


def _compile_only(kernels: dict, archs: list[str]) -> int:
    failed = 0
    for arch_name in archs:
        script_cls = kernels[arch_name]
        print(f"Building every schedule of {script_cls.__name__} for {ARCHS[arch_name].sm}:", flush=True)
        results = build_schedules(script_cls, arch_name, progress=lambda line: print(line, flush=True))
        bad = [r for r in results if not r.ok or r.mma_count == 0]
        failed += len(bad)
        print(f"  {len(results) - len(bad)}/{len(results)} schedules built with {ARCHS[arch_name].mma_instruction}")
    return 1 if failed else 0


def _table(headers: list[str], rows: list[list]) -> str:
    widths = [max(len(str(x)) for x in column) for column in zip(headers, *rows)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)) for row in [headers, *rows]]
    return "\n".join(lines)


def _check_every_schedule(kernels: dict, arch_name: str, sizes, timeout_s: float) -> int:
    script_cls = kernels[arch_name]
    name = script_cls.__name__
    _use_cache(script_cls, _gpu_label())
    jit = _jit_instance(script_cls, *sizes[0])
    programs = jit.programs()
    missing = len(jit.schedules) - len(programs)
    rows, failures = [], 0
    for seed, (m, n, k) in enumerate(sizes):
        a, b, ref = random_inputs(m, n, k, seed)
        out = torch.empty((m, n), dtype=torch.float16, device="cuda")
        for compiled, index in zip(jit.compiled_programs, jit.valid_schedules):
            schedule = format_schedule(jit.schedules[index])
            out.fill_(math.nan)
            print(f"START {name} [{schedule}] {m}x{n}x{k}", flush=True)
            compiled.get_launch_func()(m, n, k, a, b, out)
            _wait(f"{name} [{schedule}] at {m}x{n}x{k}", timeout_s)
            err = relative_error(out, ref)
            failures += not passes(err)
            rows.append([f"{m}x{n}x{k}", schedule, f"{err:.2e}", "ok" if passes(err) else "WRONG"])
    print(_table(["size", "schedule", "rel. error", "result"], rows))
    print(f"{name}: {len(programs)}/{len(jit.schedules)} schedules built, {failures} wrong results "
          f"(tolerance {REL_ERR_TOL:g})")
    return 1 if failures or missing else 0


def _save(rows: list[dict], slug: str) -> Path:
    path = RESULTS_DIR / f"{slug}.csv"
    keep = []
    if path.exists():
        with path.open() as f:
            new_keys = {(r["version"], str(r["m"]), str(r["n"]), str(r["k"])) for r in rows}
            keep = [r for r in csv.DictReader(f) if (r["version"], r["m"], r["n"], r["k"]) not in new_keys]
    merged = sorted(keep + rows, key=lambda r: (str(r["version"]), int(r["m"]), int(r["n"]), int(r["k"])))
    path.parent.mkdir(exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(merged)
    return path


def _run(version: str, kernels: dict, matmul, arch_name: str, args) -> int:
    script_cls = kernels[arch_name]
    gpu = torch.cuda.get_device_name()
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False  # cuBLAS accumulates in fp32 too
    print(f"{version} on {gpu} ({ARCHS[arch_name].sm}, {script_cls.__name__}); "
          f"reference: fp32 torch matmul, tolerance {REL_ERR_TOL:g} relative Frobenius error")
    results = []
    for seed, (m, n, k) in enumerate(args.sizes):
        a, b, ref = random_inputs(m, n, k, seed)
        out = torch.full((m, n), math.nan, dtype=torch.float16, device="cuda")
        print(f"{m}x{n}x{k}: first call at this size builds and autotunes "
              f"{space_size(script_cls)} schedules (cached afterwards)...", flush=True)
        matmul(a, b, out)
        _wait(f"{script_cls.__name__} at {m}x{n}x{k}", args.timeout)
        result = {"size": (m, n, k), "err": relative_error(out, ref),
                  "schedule": format_schedule(chosen_schedule(script_cls, m, n, k))}
        results.append(result)
        if args.check_only or not passes(result["err"]):
            continue
        script, expected = script_cls(), torch.empty_like(out)
        result["ms"], result["cublas_ms"] = time_against_cublas(
            lambda: script(m, n, k, a, b, out), lambda: torch.matmul(a, b.T, out=expected), args.repeat
        )
        result["cublas_err"] = relative_error(expected, ref)

    failures = sum(not passes(r["err"]) for r in results)
    if args.check_only or failures:
        rows = [["x".join(map(str, r["size"])), f"{r['err']:.2e}", "ok" if passes(r["err"]) else "WRONG", r["schedule"]]
                for r in results]
        print(_table(["size", "rel. error", "result", "schedule"], rows))
        return 1 if failures else 0

    rows, records = [], []
    common = {"gpu": gpu, "tilus": tilus.__version__, "torch": torch.__version__, "date": datetime.date.today().isoformat()}
    for r in results:
        (m, n, k), ms, cublas_ms = r["size"], r["ms"], r["cublas_ms"]
        ours, theirs, pct = tflops(m, n, k, ms), tflops(m, n, k, cublas_ms), 100 * cublas_ms / ms
        rows.append([f"{m}x{n}x{k}", f"{ms:.3f}", f"{ours:.1f}", f"{cublas_ms:.3f}", f"{theirs:.1f}", f"{pct:.1f}",
                     f"{r['err']:.2e}", r["schedule"]])
        size = common | {"m": m, "n": n, "k": k}
        records.append(size | {"version": version, "ms": f"{ms:.4f}", "tflops": f"{ours:.1f}",
                               "pct_of_cublas": f"{pct:.1f}", "rel_err": f"{r['err']:.2e}", "config": r["schedule"]})
        records.append(size | {"version": "cublas", "ms": f"{cublas_ms:.4f}", "tflops": f"{theirs:.1f}",
                               "pct_of_cublas": "100.0", "rel_err": f"{r['cublas_err']:.2e}", "config": "torch.matmul"})
    print(f"median of {args.repeat} runs each, CUDA events, L2 flushed before every run, "
          "cuBLAS timed in the same process on the same inputs, interleaved")
    print(_table(["size", f"{version} ms", f"{version} TFLOPS", "cuBLAS ms", "cuBLAS TFLOPS", "% of cuBLAS",
                  "rel. error", "schedule"], rows))
    if args.save:
        print(f"wrote {_save(records, gpu_slug(gpu)).relative_to(REPO)}")
    return 0


def space_size(script_cls) -> int:
    return math.prod(len(values) for values in script_cls._autotune_space.values())


def main(version: str, kernels: dict, matmul, argv=None) -> int:
    """The CLI of every stage. Returns the process exit status."""
    parser = _parser(version)
    args = parser.parse_args(argv)
    arch_name = None
    try:
        arch_name = None if args.compile_only else gpu_arch()
    except UnsupportedGPUError as reason:
        print(f"No Hopper or Blackwell GPU here ({reason}): building {version} for sm_90a and sm_100a instead "
              "(compile-only).", flush=True)
    if arch_name is None:
        return _compile_only(kernels, [args.arch] if args.arch else sorted(ARCHS, reverse=True))
    if args.arch and args.arch != arch_name:
        parser.error(f"this GPU runs the {arch_name} kernel; --arch {args.arch} only works with --compile-only")
    try:
        if args.all_schedules:
            return _check_every_schedule(kernels, arch_name, args.sizes, args.timeout)
        return _run(version, kernels, matmul, arch_name, args)
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
