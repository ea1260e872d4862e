"""The command line every version shares: check against cuBLAS, then time against it in both regimes.

    python matmul_vN.py [--sizes 4096 8192 1000x1016x1024] [--dtype fp16|bf16] [--check-only]
                        [--compile-only] [--arch hopper|blackwell] [--all-schedules] [--save]
                        [--repeat N] [--timeout S]

Without a Hopper or Blackwell GPU it says so in one line and builds every schedule for
sm_90a and sm_100a instead. ``--save`` merges the rows into results/<gpu>.csv. The timing
(``benchmark``, also plot.py's) is of both regimes of ``bench``: burst and back-to-back.
"""

import argparse
import csv
import datetime
import math
import sys
from pathlib import Path

import tilus
import torch

from support import bench
from support.bench import Contender
from support.build import build_schedules
from support.cache import REPO, use_cache
from support.dispatch import chosen_schedule, format_schedule, jit_instance, kernel_args, space_size
from support.gpu import ARCHS, UnsupportedGPUError, gpu_arch, gpu_label, gpu_slug
from support.measure import CHECK_TILE, DTYPE_NAMES, REL_ERR_TOL, passes, random_inputs, relative_error, sync_or_exit

RESULTS_DIR = REPO / "results"
CSV_FIELDS = ["gpu", "version", "dtype", "regime", "m", "n", "k", "ms", "tflops", "pct_of_cublas", "host_us", "sm_mhz",
              "power_w", "tflops_per_ghz", "pct_of_clock_peak", "pct_of_bandwidth", "pct_spread", "mj_per_gemm",
              "tflops_per_w", "rel_err", "config", "tilus", "torch", "date"]
DEFAULT_SIZES = ["4096", "8192"]


def parse_size(text: str) -> tuple[int, int, int]:
    parts = text.lower().split("x")
    if len(parts) not in (1, 3) or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"size {text!r}: expected N (for N x N x N) or MxNxK with positive integers")
    m, n, k = (int(parts[0]),) * 3 if len(parts) == 1 else map(int, parts)
    if n % 8 or k % 8:  # the rule matmul() enforces (checks.py), asked before any kernel is built or launched
        raise argparse.ArgumentTypeError(f"size {text!r}: TMA needs 16-byte row strides, so N and K must be "
                                         "multiples of 8 for fp16 and bf16")
    if max(m * k, n * k, m * n) >= 2**31:
        raise argparse.ArgumentTypeError(f"size {text!r}: the kernels index each matrix with 32-bit integers")
    return m, n, k


def _parser(version: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"matmul_{version}.py",
        description=f"Check the {version} fp16/bf16 GEMM (C = A @ B.T) against cuBLAS, then time both.",
    )
    parser.add_argument("--sizes", nargs="+", type=parse_size, metavar="SIZE",
                        default=[parse_size(s) for s in DEFAULT_SIZES],
                        help="N (cube) or MxNxK; default: %(default)s" % {"default": " ".join(DEFAULT_SIZES)})
    parser.add_argument("--dtype", choices=sorted(DTYPE_NAMES), default="fp16",
                        help="element type of A, B and C (fp32 accumulation either way); default: fp16")
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
        if arch_name not in kernels:
            try:
                kernels[arch_name]
            except UnsupportedGPUError as reason:
                print(f"Nothing to build for {ARCHS[arch_name].sm}: {reason}.", flush=True)
            failed += len(archs) == 1  # asked for this architecture alone: nothing was built
            continue
        script_cls = kernels[arch_name]
        print(f"Building every schedule of {script_cls.__name__} for {ARCHS[arch_name].sm}:", flush=True)
        results = build_schedules(script_cls, arch_name, progress=lambda line: print(line, flush=True))
        bad = [r for r in results if not r.ok or r.mma_count == 0]
        failed += len(bad)
        print(f"  {len(results) - len(bad)}/{len(results)} schedules built with {ARCHS[arch_name].mma_instruction}")
    return 1 if failed else 0


def text_table(headers: list[str], rows: list[list]) -> str:
    widths = [max(len(str(x)) for x in column) for column in zip(headers, *rows)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)) for row in [headers, *rows]]
    return "\n".join(lines)


def check_every_schedule(script_cls, sizes, timeout_s: float, first_seed: int = 0, dtype: torch.dtype = torch.float16):
    """Run every built schedule of a kernel on each size, into an output filled with NaN.

    Size i gets fresh random inputs from seed ``first_seed + i``. A START line is printed
    before each launch; a kernel still running after timeout_s ends the process, naming it
    (``sync_or_exit``). Returns (schedules built, schedules in the space, and a
    (size, schedule, relative error) per launch).
    """
    name = script_cls.__name__
    use_cache(script_cls, gpu_label())
    jit = jit_instance(script_cls, *sizes[0], dtype=dtype)
    jit.programs()
    results = []
    for seed, (m, n, k) in enumerate(sizes, start=first_seed):
        a, b, ref = random_inputs(m, n, k, seed, dtype)
        out = torch.empty((m, n), dtype=dtype, device="cuda")
        args = kernel_args(script_cls, m, n, k, a, b, out)
        for compiled, index in zip(jit.compiled_programs, jit.valid_schedules):
            schedule = format_schedule(jit.schedules[index])
            where = f"{name} [{schedule}] at {m}x{n}x{k} (input seed {seed})"
            out.fill_(math.nan)
            print(f"START {where}", flush=True)
            compiled.get_launch_func()(*args)
            sync_or_exit(where, timeout_s)
            results.append(((m, n, k), schedule, relative_error(out, ref)))
        del a, b, ref, out  # freed before the next size's tensors are allocated, not after
    return len(jit.compiled_programs), len(jit.schedules), results


def _check_every_schedule(kernels: dict, arch_name: str, sizes, timeout_s: float, dtype: torch.dtype) -> int:
    script_cls = kernels[arch_name]
    built, total, results = check_every_schedule(script_cls, sizes, timeout_s, dtype=dtype)
    failures = sum(not passes(err, dtype) for _, _, err in results)
    rows = [["x".join(map(str, size)), schedule, f"{err:.2e}", "ok" if passes(err, dtype) else "WRONG"]
            for size, schedule, err in results]
    print(text_table(["size", "schedule", "rel. error", "result"], rows))
    print(f"{script_cls.__name__}: {built}/{total} schedules built, {failures} wrong results "
          f"(tolerance {REL_ERR_TOL[dtype]:g} for {dtype})")
    return 1 if failures or built < total else 0


CUBLAS = Contender("cublas", lambda a, b, out: torch.matmul(a, b.T, out=out), "torch.matmul")
METHOD = ("Burst: the median of timed runs, each alone (CUDA events, L2 flushed, launches queued ahead). "
          f"Back to back: the median of {bench.ROUNDS} windows of ~{bench.WINDOW_S:g} s of calls through each entry "
          f"point, no sync, operand sets rotated past L2, after {bench.WARM_UP_S:g} s of load. Contenders go in a "
          "fresh random order each round, in one process. Spread: max - min over the rounds of the round's % of "
          "cuBLAS. Host µs: CPU time per call queued with no sync behind a GPU spin. Clock and power: NVML over the "
          "timed windows. Energy: NVML's energy counter over the back-to-back windows.")


def benchmark(versions: dict, sizes, repeat: int, timeout_s: float, dtype: str = "fp16", peers=(),
              on_size=None) -> list[dict]:
    """Check and time the versions (name -> (kernels, matmul)), any peers and cuBLAS at each size, in both regimes.

    ``dtype`` ('fp16' or 'bf16') is that of A, B and C for every contender, cuBLAS included.

    Each version's first call at a size builds and tunes it (and checks it, into a NaN-poisoned
    output); then every contender is timed in both regimes in one process (``bench``). ``peers``
    are functions (m, n, k) -> Contender. Returns the CSV rows; ``on_size(rows)`` gets each
    size's rows as they are measured.
    """
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False  # cuBLAS accumulates in fp32 too
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    arch = gpu_arch()
    copy_bytes_per_s = bench.copy_bandwidth()
    handle = bench.nvml_handle()
    print(f"device-to-device copy: {copy_bytes_per_s / 1e12:.2f} TB/s (bytes read + written)", flush=True)
    rows = []
    for seed, (m, n, k) in enumerate(sizes):
        for name, (kernels, _) in versions.items():
            print(f"{name} at {m}x{n}x{k}: the first call at a size bucket builds and tunes "
                  f"{space_size(kernels[arch])} schedules (cached afterwards)...", flush=True)
        contenders = [Contender(name, matmul) for name, (_, matmul) in versions.items()]
        contenders += [peer(m, n, k) for peer in peers] + [CUBLAS]
        records = bench.measure_size(contenders, m, n, k, seed, repeat, copy_bytes_per_s, handle, timeout_s,
                                     DTYPE_NAMES[dtype])
        common = {"gpu": torch.cuda.get_device_name(), "dtype": dtype, "m": m, "n": n, "k": k,
                  "tilus": tilus.__version__, "torch": torch.__version__, "date": datetime.date.today().isoformat()}
        size_rows = []
        for record in records:
            if record["version"] in versions:
                record["config"] = format_schedule(
                    chosen_schedule(versions[record["version"]][0][arch], m, n, k, DTYPE_NAMES[dtype]))
            size_rows.append(common | {key: _text(value) for key, value in record.items()})
        rows += size_rows
        if on_size:
            on_size(size_rows)
    return rows


def _text(value) -> str:
    """A CSV cell: floats to 5 significant digits (ms of decode shapes are ~0.01), NaN as empty."""
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.5g}"
    return str(value)


def row_passes(row: dict) -> bool:
    """A CSV row's result is within its dtype's tolerance (a wrong or unwritten result has no error, or NaN)."""
    return passes(float(row["rel_err"] or "nan"), DTYPE_NAMES[row["dtype"]])


def print_rows(rows: list[dict]) -> None:
    columns = ["regime", "version", "ms", "tflops", "pct_of_cublas", "pct_spread", "host_us", "sm_mhz", "power_w",
               "tflops_per_ghz", "mj_per_gemm", "tflops_per_w", "pct_of_bandwidth", "rel_err"]
    table = [["x".join(str(r[d]) for d in "mnk"), r["dtype"], *(r.get(c) or "-" for c in columns),
              "ok" if row_passes(r) else "WRONG", r["config"]] for r in rows]
    print(text_table(["size", "dtype", "regime", "version", "ms", "TFLOPS", "% of cuBLAS", "spread", "host us", "SM MHz",
                  "W", "TFLOPS/GHz", "mJ/GEMM", "TFLOPS/W", "% of copy BW", "rel. error", "result", "schedule"], table))
    print(METHOD)


def read_csv(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def read_rows(path: Path) -> list[dict]:
    """The rows of a results CSV; rows from before a column existed read as fp16, burst."""
    rows = read_csv(path)
    return [{field: "" for field in CSV_FIELDS} | {"dtype": "fp16", "regime": "burst"}
            | {key: value for key, value in row.items() if value not in (None, "")} for row in rows]


def _key(row: dict) -> tuple:
    return row["version"], row["dtype"], row["regime"], int(row["m"]), int(row["n"]), int(row["k"])


def save_rows(rows: list[dict], slug_or_path) -> Path:
    """Merge rows into results/<slug>.csv (or a given path), replacing earlier rows of the same version, dtype,
    regime and size."""
    path = slug_or_path if isinstance(slug_or_path, Path) else RESULTS_DIR / f"{slug_or_path}.csv"
    new = [{field: "" for field in CSV_FIELDS} | row for row in rows]
    new_keys = {_key(row) for row in new}
    keep = [row for row in read_rows(path) if _key(row) not in new_keys] if path.exists() else []
    merged = sorted(keep + new, key=_key)
    path.parent.mkdir(exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(merged)
    return path


def _run(version: str, kernels: dict, matmul, arch_name: str, args) -> int:
    script_cls = kernels[arch_name]
    gpu = torch.cuda.get_device_name()
    print(f"{version} on {gpu} ({ARCHS[arch_name].sm}, {script_cls.__name__}); "
          f"{args.dtype}; reference: fp32 torch matmul, tolerance {REL_ERR_TOL[DTYPE_NAMES[args.dtype]]:g} relative "
          f"error of the worst {CHECK_TILE} x {CHECK_TILE} tile")
    if args.check_only:
        return _check_only(version, script_cls, matmul, args)
    save = (lambda rows: save_rows(rows, gpu_slug(gpu))) if args.save else None
    rows = benchmark({version: (kernels, matmul)}, args.sizes, args.repeat, args.timeout, args.dtype, on_size=save)
    print_rows(rows)
    if args.save:
        print(f"wrote {(RESULTS_DIR / f'{gpu_slug(gpu)}.csv').relative_to(REPO)}")
    return 0 if all(row_passes(r) for r in rows) else 1


def _check_only(version: str, script_cls, matmul, args) -> int:
    results, dtype = [], DTYPE_NAMES[args.dtype]
    for seed, (m, n, k) in enumerate(args.sizes):
        a, b, ref = random_inputs(m, n, k, seed, dtype)
        out = torch.full((m, n), math.nan, dtype=dtype, device="cuda")
        print(f"{m}x{n}x{k}: first call at this size builds and autotunes "
              f"{space_size(script_cls)} schedules (cached afterwards)...", flush=True)
        matmul(a, b, out)
        sync_or_exit(f"{script_cls.__name__} at {m}x{n}x{k}", args.timeout)
        err = relative_error(out, ref)
        results.append([f"{m}x{n}x{k}", f"{err:.2e}", "ok" if passes(err, dtype) else "WRONG",
                        format_schedule(chosen_schedule(script_cls, m, n, k, dtype))])
    print(text_table(["size", "rel. error", "result", "schedule"], results))
    return 1 if any(row[2] != "ok" for row in results) else 0


def main(version: str, kernels: dict, matmul, argv=None) -> int:
    """The CLI of every version. Returns the process exit status."""
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
        kernels[arch_name]
    except UnsupportedGPUError as reason:
        print(f"{torch.cuda.get_device_name()} is {arch_name.capitalize()}: {reason}.", flush=True)
        return 1
    try:
        if args.all_schedules:
            return _check_every_schedule(kernels, arch_name, args.sizes, args.timeout, DTYPE_NAMES[args.dtype])
        return _run(version, kernels, matmul, arch_name, args)
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
