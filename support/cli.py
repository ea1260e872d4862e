"""The command line every stage shares: check against cuBLAS, then time against it.

    python matmul_vN.py [--sizes 4096 8192 1000x1016x1024] [--check-only] [--compile-only]
                        [--arch hopper|blackwell] [--all-schedules] [--save] [--repeat N] [--timeout S]

Without a Hopper or Blackwell GPU it says so in one line and builds every schedule for
sm_90a and sm_100a instead. ``--save`` merges the rows into results/<gpu>.csv.
"""

import argparse
import csv
import datetime
import math
import sys
from pathlib import Path

import tilus
import torch

from support.build import build_schedules
from support.cache import REPO, use_cache
from support.dispatch import chosen_schedule, format_schedule, jit_instance, kernel_args, space_size
from support.gpu import ARCHS, UnsupportedGPUError, gpu_arch, gpu_label, gpu_slug
from support.measure import REL_ERR_TOL, passes, random_inputs, relative_error, sync_or_exit, tflops, time_against_cublas

RESULTS_DIR = REPO / "results"
CSV_FIELDS = ["gpu", "version", "m", "n", "k", "ms", "tflops", "pct_of_cublas", "rel_err", "config", "tilus", "torch", "date"]
DEFAULT_SIZES = ["4096", "8192"]


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


def check_every_schedule(script_cls, sizes, timeout_s: float, first_seed: int = 0):
    """Run every built schedule of a kernel on each size, into an output filled with NaN.

    Size i gets fresh random inputs from seed ``first_seed + i``. A START line is printed
    before each launch; a kernel still running after timeout_s ends the process, naming it
    (``sync_or_exit``). Returns (schedules built, schedules in the space, and a
    (size, schedule, relative error) per launch).
    """
    name = script_cls.__name__
    use_cache(script_cls, gpu_label())
    jit = jit_instance(script_cls, *sizes[0])
    jit.programs()
    results = []
    for seed, (m, n, k) in enumerate(sizes, start=first_seed):
        a, b, ref = random_inputs(m, n, k, seed)
        out = torch.empty((m, n), dtype=torch.float16, device="cuda")
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


def _check_every_schedule(kernels: dict, arch_name: str, sizes, timeout_s: float) -> int:
    script_cls = kernels[arch_name]
    built, total, results = check_every_schedule(script_cls, sizes, timeout_s)
    failures = sum(not passes(err) for _, _, err in results)
    rows = [["x".join(map(str, size)), schedule, f"{err:.2e}", "ok" if passes(err) else "WRONG"]
            for size, schedule, err in results]
    print(_table(["size", "schedule", "rel. error", "result"], rows))
    print(f"{script_cls.__name__}: {built}/{total} schedules built, {failures} wrong results "
          f"(tolerance {REL_ERR_TOL:g})")
    return 1 if failures or built < total else 0


def csv_records(version: str, size: tuple, ms: float, cublas_ms: float, err: float, cublas_err: float,
                config: str) -> list[dict]:
    """The two CSV rows of one timing: the version's and cuBLAS' from the same run."""
    m, n, k = size
    common = {"gpu": torch.cuda.get_device_name(), "m": m, "n": n, "k": k, "tilus": tilus.__version__,
              "torch": torch.__version__, "date": datetime.date.today().isoformat()}
    return [
        common | {"version": version, "ms": f"{ms:.4f}", "tflops": f"{tflops(m, n, k, ms):.1f}",
                  "pct_of_cublas": f"{100 * cublas_ms / ms:.1f}", "rel_err": f"{err:.2e}", "config": config},
        common | {"version": "cublas", "ms": f"{cublas_ms:.4f}", "tflops": f"{tflops(m, n, k, cublas_ms):.1f}",
                  "pct_of_cublas": "100.0", "rel_err": f"{cublas_err:.2e}", "config": "torch.matmul"},
    ]


def save_rows(rows: list[dict], slug: str) -> Path:
    """Merge rows into results/<slug>.csv, replacing earlier rows of the same version and size."""
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
        sync_or_exit(f"{script_cls.__name__} at {m}x{n}x{k}", args.timeout)
        result = {"size": (m, n, k), "err": relative_error(out, ref),
                  "schedule": format_schedule(chosen_schedule(script_cls, m, n, k))}
        results.append(result)
        if args.check_only or not passes(result["err"]):
            continue
        script, expected, call = script_cls(), torch.empty_like(out), kernel_args(script_cls, m, n, k, a, b, out)
        result["ms"], result["cublas_ms"] = time_against_cublas(
            lambda: script(*call), lambda: torch.matmul(a, b.T, out=expected), args.repeat
        )
        result["cublas_err"] = relative_error(expected, ref)

    failures = sum(not passes(r["err"]) for r in results)
    if args.check_only or failures:
        rows = [["x".join(map(str, r["size"])), f"{r['err']:.2e}", "ok" if passes(r["err"]) else "WRONG", r["schedule"]]
                for r in results]
        print(_table(["size", "rel. error", "result", "schedule"], rows))
        return 1 if failures else 0

    rows, records = [], []
    for r in results:
        (m, n, k), ms, cublas_ms = r["size"], r["ms"], r["cublas_ms"]
        ours, theirs, pct = tflops(m, n, k, ms), tflops(m, n, k, cublas_ms), 100 * cublas_ms / ms
        rows.append([f"{m}x{n}x{k}", f"{ms:.3f}", f"{ours:.1f}", f"{cublas_ms:.3f}", f"{theirs:.1f}", f"{pct:.1f}",
                     f"{r['err']:.2e}", r["schedule"]])
        records += csv_records(version, r["size"], ms, cublas_ms, r["err"], r["cublas_err"], r["schedule"])
    print(f"median of {args.repeat} runs each, CUDA events, L2 flushed before every run, "
          "cuBLAS timed in the same process on the same inputs, interleaved")
    print(_table(["size", f"{version} ms", f"{version} TFLOPS", "cuBLAS ms", "cuBLAS TFLOPS", "% of cuBLAS",
                  "rel. error", "schedule"], rows))
    if args.save:
        print(f"wrote {save_rows(records, gpu_slug(gpu)).relative_to(REPO)}")
    return 0


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
