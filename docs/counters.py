"""Hardware counters of each Hopper version, read by Nsight Compute, and the spread of its timing.

For each version (v1 .. v7) and shape (4096^3 and the skinny 128 x 8192 x 8192) it measures
one launch of the tuned kernel under ``ncu`` (L2 flushed before it, ncu's default):

- tensor-pipe utilisation: the share of the SMs' active cycles the wgmma pipe was busy;
- DRAM bytes read, against the traffic model of docs/v4.md ("What the order saves",
  docs/raster.py) applied to the version's tile order, tile size and blocks in flight;
  and DRAM bytes written (C, less what is still in L2 when the kernel ends);
- shared-memory bank conflicts of plain loads and stores (the epilogue's stmatrix: v6's
  swizzle should bring the stores' count near zero; TMA and wgmma do not go through this pipe);
- achieved occupancy: warps resident per SM against the 64 an SM can hold;
and, outside ncu, the run-to-run spread of the kernel's time: min / median / max of 30
burst runs (CUDA events, L2 flushed before each run, in rounds, as support/measure.py times).

For the newest 16-bit version (v9) and cuBLAS it also profiles the shapes where v9 trails
(issue 48), with two counters more: the share of the kernel's time the SMs were active, and
the bytes L2 moved. They tell where the time goes: a tile's tensor work, or SMs left idle.

    python docs/counters.py --run      on a Hopper GPU with ncu: writes results/<gpu>_counters.csv
                                       (about 3 minutes on a fresh H100, builds and tuning included)
    python docs/counters.py --run --versions v9 cublas --sizes 3000x5000x2056 128x8192x8192 4096x4096x4096
                                       the rows of the <!-- counters-limits --> table
    python docs/counters.py --table    anywhere: rewrites the <!-- counters --> table in docs/results.md
                                       and the <!-- counters-line --> line of each page docs/vN.md

ncu runs with ``--clock-control none``: the GPU keeps its own clocks, as in every other
measurement here, and the clock it ran at is recorded (``sm_hz``).
"""

import argparse
import csv
import datetime
import glob
import io
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent
sys.path[:0] = [str(REPO), str(DOCS)]  # the versions and support/ (repo root), raster.py (docs/)

import raster  # after the path: the traffic model's tile orders live there

PAGE = DOCS / "results.md"
BLOCK = re.compile(r"(<!-- counters (\S+) -->\n)(.*?)(<!-- /counters -->)", re.DOTALL)
# one line near the top of each version's page: what it changed, its time against the version before, and why
LINE = re.compile(r"(<!-- counters-line (\S+) (v\d+) -->\n)(.*?)(<!-- /counters-line -->)", re.DOTALL)
VERSIONS = ["v1", "v2", "v3", "v4", "v5", "v6", "v7"]
SIZES = ["4096x4096x4096", "128x8192x8192"]
# the second table: the newest 16-bit version beside cuBLAS ("cublas": torch.matmul's kernel)
LIMITS = re.compile(r"(<!-- counters-limits (\S+) -->\n)(.*?)(<!-- /counters-limits -->)", re.DOTALL)
LIMIT_VERSIONS = ["v9", "cublas"]
RUNS = 30  # timed runs for the spread, in the rounds of support/measure.py's time_burst
WARMUP_CALLS = 3  # calls in the profiled child before the one it profiles

# The tensor pipe's busy cycles, by the first name this ncu knows for this GPU (it goes into
# the CSV). ncu 2025.3.1 on the H100 has no gmma-only cycle counter: its "hmma" cycles count
# HMMA, HGMMA (fp16/bf16 wgmma) and QGMMA. A count of gmma instructions would not do: one
# wgmma keeps the pipe busy for many cycles.
TENSOR_METRICS = [
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
]
METRICS = {  # CSV column -> ncu metric
    "dram_read_bytes": "dram__bytes_read.sum",
    "dram_write_bytes": "dram__bytes_write.sum",
    "smem_conflicts_st": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "smem_conflicts_ld": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "kernel_ns": "gpu__time_duration.sum",
    "sm_hz": "sm__cycles_elapsed.avg.per_second",
    "grid": "launch__grid_size",
    "sm_active_pct": "sm__cycles_active.avg.pct_of_peak_sustained_elapsed",
    "l2_bytes": "lts__t_bytes.sum",
}
# blocks per SM is the least of what registers, shared memory, warps and the block limit allow
OCCUPANCY_LIMITS = ["launch__occupancy_limit_registers", "launch__occupancy_limit_shared_mem",
                    "launch__occupancy_limit_warps", "launch__occupancy_limit_blocks"]
FIELDS = ["gpu", "version", "dtype", "m", "n", "k", "config", "tensor_pipe_pct", *METRICS, "blocks_per_sm",
          "model_read_bytes", "ms_min", "ms_median", "ms_max", "runs", "tensor_metric", "tilus", "torch", "date"]

# ncu's units, to base units (bytes, seconds, hertz); --print-units base should make them all 1
UNITS = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
         "nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9,  # to nanoseconds
         "hz": 1, "khz": 1e3, "mhz": 1e6, "ghz": 1e9}


# --- the traffic model (docs/v4.md, "What the order saves"; docs/raster.py) -----------------------

def tile_order(version: str, schedule: dict, num_m: int, num_n: int) -> tuple[list[tuple[int, int]], int]:
    """(the order work units start in, tile rows per unit) of a version's kernel.

    v1-v3 launch a 2-D grid, tile rows fastest; v4 launches one block per tile in grouped
    order; v5 and v6 walk the grouped order with a stride of the grid, and v7's clusters walk
    units of cluster_m tile rows (sharing one B tile) so, so the units in flight at once are
    consecutive too.
    """
    if version in ("v1", "v2", "v3"):
        return raster.row_order(num_m, num_n), 1
    rows = schedule.get("cluster_m", 1)
    return raster.grouped_order(-(-num_m // rows), num_n, schedule["group_m"]), rows


def model_read_bytes(version: str, schedule: dict, m: int, n: int, k: int, in_flight: int) -> int:
    """DRAM bytes read if L2 serves the blocks in flight together and keeps nothing from one wave to the next.

    As docs/raster.py: a wave is ``in_flight`` consecutive blocks; each wave reads every
    row of A tiles and column of B tiles it touches once. Tiles at the edges read only the
    rows that exist (TMA fetches nothing outside the tensor). fp16: 2 bytes an element.
    """
    block_m, block_n = schedule["block_m"], schedule["block_n"]
    num_m, num_n = -(-m // block_m), -(-n // block_n)
    order, rows_per_unit = tile_order(version, schedule, num_m, num_n)
    unit_m = block_m * rows_per_unit
    per_wave = max(in_flight // rows_per_unit, 1)
    total = 0
    for start in range(0, len(order), per_wave):
        wave = order[start : start + per_wave]
        a_rows = sum(min(unit_m, m - r * unit_m) for r in {r for r, _ in wave})
        b_rows = sum(min(block_n, n - c * block_n) for c in {c for _, c in wave})
        total += (a_rows + b_rows) * k * 2
    return total


# --- ncu ------------------------------------------------------------------------------------------

def find_ncu() -> str:
    installed = sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"))
    found = shutil.which("ncu") or (installed[-1] if installed else None)
    if found is None:
        sys.exit("ncu not found: not on PATH, nor in /opt/nvidia/nsight-compute/*/")
    return found


def parse_raw_csv(text: str) -> list[dict[str, float | str]]:
    """The kernels of ``ncu --csv --page raw`` output: one dict per kernel, metric values in base units.

    ncu writes its own ``==PROF==`` lines and the program's output around the CSV: only the
    lines from the header (it starts with "ID") on are read. The row after the header holds
    the units. Numbers may carry thousands separators.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID",')), None)
    if start is None:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(line for line in lines[start:] if line.startswith('"')))))
    header, units, kernels = rows[0], rows[1], rows[2:]
    parsed = []
    for values in kernels:
        kernel = {}
        for name, unit, value in zip(header, units, values):
            number = value.replace(",", "")
            try:
                kernel[name] = float(number) * UNITS.get(unit.lower(), 1)
            except ValueError:
                kernel[name] = value
        parsed.append(kernel)
    return parsed


def ncu_run(ncu: str, args: list[str]) -> subprocess.CompletedProcess:
    result = subprocess.run([ncu, *args], capture_output=True, text=True, cwd=REPO, check=False)
    if result.returncode != 0:
        sys.exit(f"ncu {' '.join(args)} failed (exit {result.returncode}):\n"
                 f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result


def pick_metrics(ncu: str) -> str:
    """The tensor-pipe metric this ncu knows for this GPU; exit, naming them, if any metric needed is unknown."""
    known = set(ncu_run(ncu, ["--query-metrics"]).stdout.split())
    tensor = next((name for name in TENSOR_METRICS if name.split(".")[0] in known), None)
    # launch__ values are the launch's, not counters: --query-metrics does not list them
    missing = [name for name in METRICS.values() if name.split(".")[0] not in known and not name.startswith("launch__")]
    if tensor is None or missing:
        sys.exit(f"ncu ({ncu}) does not know these metrics on this GPU: "
                 f"{', '.join(missing + ([] if tensor else TENSOR_METRICS))}; see ncu --query-metrics")
    return tensor


def profile(ncu: str, tensor_metric: str, version: str, size: str) -> dict:
    """ncu's metrics of one launch of a version's tuned kernel, in a child process (``--child``)."""
    metrics = [tensor_metric, *METRICS.values(), *OCCUPANCY_LIMITS]
    # cuBLAS's Hopper kernels are named nvjet_... or ..._gemm_...
    kernel = "regex:nvjet|gemm" if version == "cublas" else "regex:tilus"
    args = ["--clock-control", "none", "--profile-from-start", "off", "--kernel-name", kernel,
            "--launch-count", "1", "--metrics", ",".join(metrics), "--csv", "--page", "raw", "--print-units", "base",
            sys.executable, str(Path(__file__).resolve()), "--child", version, size]
    result = ncu_run(ncu, args)
    kernels = parse_raw_csv(result.stdout)
    if len(kernels) != 1 or any(not isinstance(kernels[0].get(name), float) for name in metrics):
        sys.exit(f"ncu gave no complete row for {version} at {size}:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return kernels[0]


def child(version: str, size: str) -> None:
    """Under ncu: load the tuned kernel (built and tuned by the parent), warm up, profile one launch."""
    import torch

    m, n, k = map(int, size.split("x"))
    matmul = matmul_of(version)
    a = torch.randn(m, k, device="cuda").half()
    b = torch.randn(n, k, device="cuda").half()
    out = torch.empty(m, n, device="cuda", dtype=torch.float16)
    for _ in range(WARMUP_CALLS):
        matmul(a, b, out)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()  # ncu --profile-from-start off profiles from here
    matmul(a, b, out)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def cublas(a, b, out):
    """C = A @ B.T by cuBLAS (torch.matmul), as the versions' matmul() takes it."""
    import torch

    return torch.matmul(a, b.T, out=out)


def module_of(version: str):
    """A version's module; None for cuBLAS."""
    import importlib

    return None if version == "cublas" else importlib.import_module(f"matmul_{version}")


def matmul_of(version: str):
    module = module_of(version)
    return cublas if module is None else module.matmul


# --- the run on the GPU ---------------------------------------------------------------------------

def measure(version: str, size: str, ncu: str, tensor_metric: str) -> dict:
    import tilus
    import torch

    from support.dispatch import chosen_schedule, format_schedule
    from support.gpu import gpu_arch
    from support.measure import burst_samples, random_inputs

    m, n, k = map(int, size.split("x"))
    module = module_of(version)
    matmul = matmul_of(version)
    a, b, _ = random_inputs(m, n, k, seed=0)
    out = torch.empty(m, n, device="cuda", dtype=torch.float16)
    matmul(a, b, out)  # builds (cached on disk) and tunes this size bucket
    torch.cuda.synchronize()
    schedule = None if module is None else chosen_schedule(module.KERNELS[gpu_arch()], m, n, k)
    # the burst regime of results/<gpu>.csv, timed as measure.time_burst times it: a few calls,
    # then rounds of runs, each round behind a GPU spin. One long batch right after a warm-up
    # under load ran slower at 4096^3 (the clock drops at the power limit).
    samples = sorted(burst_samples({version: lambda: matmul(a, b, out)}, RUNS)[version])

    counters = profile(ncu, tensor_metric, version, size)
    blocks_per_sm = int(min(counters[name] for name in OCCUPANCY_LIMITS))
    in_flight = min(int(counters["launch__grid_size"]), torch.cuda.get_device_properties(0).multi_processor_count
                    * blocks_per_sm)
    # the traffic model knows the versions' tile orders, not cuBLAS's
    model = "" if schedule is None else model_read_bytes(version, schedule, m, n, k, in_flight)
    return {
        "gpu": torch.cuda.get_device_name(), "version": version, "dtype": "fp16", "m": m, "n": n, "k": k,
        "config": counters["Kernel Name"] if schedule is None else format_schedule(schedule),
        "tensor_pipe_pct": f"{counters[tensor_metric]:.4g}",
        **{column: f"{counters[metric]:.6g}" for column, metric in METRICS.items()},
        "blocks_per_sm": blocks_per_sm, "model_read_bytes": model,
        "ms_min": f"{samples[0]:.5g}", "ms_median": f"{statistics.median(samples):.5g}", "ms_max": f"{samples[-1]:.5g}",
        "runs": RUNS, "tensor_metric": tensor_metric, "tilus": tilus.__version__, "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
    }


def save(rows: list[dict], path: Path) -> None:
    """Merge rows into the CSV, replacing earlier rows of the same version and size."""
    def key(row):
        return row["version"], int(row["m"]), int(row["n"]), int(row["k"])

    new = {key(row): row for row in rows}
    old = [row for row in read_rows(path) if key(row) not in new] if path.exists() else []
    path.parent.mkdir(exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(sorted([*old, *new.values()], key=key))


def run(versions: list[str], sizes: list[str], out: Path | None) -> int:
    from support import provenance
    from support.gpu import UnsupportedGPUError, gpu_arch, gpu_label

    try:
        if gpu_arch() != "hopper":
            sys.exit("--run profiles the Hopper kernels (wgmma counters): this GPU is not a Hopper GPU")
    except UnsupportedGPUError as reason:
        sys.exit(f"--run needs a Hopper GPU: {reason}")
    ncu = find_ncu()
    tensor_metric = pick_metrics(ncu)
    out = out or REPO / "results" / f"{gpu_label()}_counters.csv"
    for size in sizes:
        for version in versions:
            print(f"{version} at {size}: tune (cached after the first time), time {RUNS} runs, profile one under ncu",
                  flush=True)
            save([measure(version, size, ncu, tensor_metric)], out)
    for version in versions:  # the programs these rows were measured with (support/provenance.py)
        if version != "cublas":
            provenance.record_measured(version, out)
    print(f"wrote {out}")
    return 0


# --- the table ------------------------------------------------------------------------------------

def read_rows(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def _mib(value: str) -> str:
    return f"{float(value) / 2**20:.0f}"


def in_order(rows: list[dict], versions: list[str]) -> list[dict]:
    """The rows of ``versions``, shapes in the order first seen, and in each shape the versions in their order."""
    rows = [r for r in rows if r["version"] in versions]
    shapes = list(dict.fromkeys((int(r["m"]), int(r["n"]), int(r["k"])) for r in rows))
    return sorted(rows, key=lambda r: (shapes.index((int(r["m"]), int(r["n"]), int(r["k"]))),
                                       versions.index(r["version"])))


def measured(rows: list[dict]) -> str:
    """A table footer's last sentence: the rows' dates and versions, and the command that wrote the table."""
    dates = ", ".join(sorted({r["date"] for r in rows}))
    return (f"Measured {dates} with tilus {rows[0]['tilus']}, torch {rows[0]['torch']}; "
            "written by `python docs/counters.py --table`")


def table(rows: list[dict]) -> str:
    """The markdown table of the counters of v1 to v7, shapes in the order first seen, versions in order."""
    ordered = in_order(rows, VERSIONS)
    lines = ["| version | shape | schedule | tensor pipe % | DRAM read MiB (model) | DRAM written MiB "
             "| smem bank conflicts (store / load) | achieved occupancy % | ms min / median / max |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in ordered:
        lines.append(
            f"| {r['version']} | {r['m']}x{r['n']}x{r['k']} | `{r['config']}` | {float(r['tensor_pipe_pct']):.1f} "
            f"| {_mib(r['dram_read_bytes'])} ({_mib(r['model_read_bytes'])}) | {_mib(r['dram_write_bytes'])} "
            f"| {float(r['smem_conflicts_st']):.0f} / {float(r['smem_conflicts_ld']):.0f} "
            f"| {float(r['occupancy_pct']):.1f} "
            f"| {float(r['ms_min']):.4f} / {float(r['ms_median']):.4f} / {float(r['ms_max']):.4f} |")
    first = ordered[0]
    lines += ["", f"{first['gpu']}, fp16. One launch of each version's tuned kernel under Nsight Compute "
              f"(`--clock-control none`, L2 flushed before it). Tensor pipe % is `{first['tensor_metric']}`. "
              "The model is docs/v4.md's traffic model: each wave of blocks in flight reads the A and B tiles it "
              "touches once, and nothing stays in L2 between waves. Bank conflicts are those of shared-memory loads "
              "and stores (not TMA, not wgmma). Achieved occupancy is warps resident per SM against 64. DRAM "
              "written leaves out what is still in L2 when the kernel ends. The times are min / median / max of "
              f"{first['runs']} runs outside ncu in the burst regime of the results tables (CUDA events, L2 flushed "
              "before each run). "
              f"{measured(ordered)} from the CSV of `python docs/counters.py --run`."]
    return "\n".join(lines) + "\n"


def tiles(row: dict) -> str:
    """A version's tiles of C and how many each launched CTA takes (waves): '-' for cuBLAS (its tiles are its own)."""
    if row["version"] == "cublas":
        return "-"
    schedule = dict(item.split("=") for item in row["config"].split())
    m, n = int(row["m"]), int(row["n"])
    if schedule.get("swap_ab") == "True":  # the kernel's M is the caller's N
        m, n = n, m
    count = -(-m // int(schedule["block_m"])) * -(-n // int(schedule["block_n"]))
    return f"{count} ({count / float(row['grid']):.2f})"


def limits_table(rows: list[dict]) -> str:
    """v9 beside cuBLAS, shape by shape (in the order first seen): where the time goes."""
    ordered = in_order(rows, LIMIT_VERSIONS)
    lines = ["| shape | version | kernel | tiles (a CTA's) | µs under ncu | SMs active % of the time "
             "| tensor pipe % of active cycles | tensor pipe % of the time | L2 MiB moved | DRAM read MiB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in ordered:
        active, tensor = float(r["sm_active_pct"]), float(r["tensor_pipe_pct"])
        lines.append(
            f"| {r['m']}x{r['n']}x{r['k']} | {r['version']} | `{r['config']}` | {tiles(r)} "
            f"| {float(r['kernel_ns']) / 1e3:.1f} | {active:.1f} | {tensor:.1f} | {active * tensor / 100:.1f} "
            f"| {_mib(r['l2_bytes'])} | {_mib(r['dram_read_bytes'])} |")
    first = ordered[0]
    lines += ["", f"{first['gpu']}, fp16. One launch of each kernel under Nsight Compute (`--clock-control none`, "
              "L2 flushed before it); v9 tuned as its first call tunes. SMs active: "
              f"`{METRICS['sm_active_pct']}`; tensor pipe: `{first['tensor_metric']}`; their product is the share "
              f"of the kernel's time the tensor pipe was busy. L2 moved: `{METRICS['l2_bytes']}`. A CTA's tiles: "
              "tiles of C over the CTAs launched (one an SM; cuBLAS's own tiles are not counted). "
              f"{measured(ordered)}."]
    return "\n".join(lines) + "\n"


# --- the line on each version's page ----------------------------------------------------------------

LINE_SIZE = "4096x4096x4096"


def _pct(row: dict) -> str:
    return f"{float(row['tensor_pipe_pct']):.1f}"


def _tensor(before: dict, after: dict) -> str:
    return f"tensor pipe busy {_pct(before)}% → {_pct(after)}% of active cycles"


def _dram_read(before: dict, after: dict) -> str:
    return (f"DRAM read {_mib(before['dram_read_bytes'])} → {_mib(after['dram_read_bytes'])} MiB "
            f"(traffic model {_mib(before['model_read_bytes'])} → {_mib(after['model_read_bytes'])})")


def _smem_stores(before: dict, after: dict) -> str:
    return (f"shared-memory store bank conflicts {float(before['smem_conflicts_st']):.0f} → "
            f"{float(after['smem_conflicts_st']):.0f}")


# per version: what it changed (as its page's "What changed" list says) and the counters that show why it is faster
CHANGES = {
    "v1": ("TMA loads, one mbarrier, wgmma on whole tiles and a TMA-stored epilogue, nothing overlapped", []),
    "v2": ("a ring of `stages` shared-memory slots, one barrier each, refilled while the tensor cores work",
           [_tensor]),
    "v3": ("a producer warp and two consumer warpgroups (full/empty barriers, a 128 x 256 tile)", [_tensor]),
    "v4": ("the `Pipeline` class, grouped tile order (`group_m`), a fourth slot at 128 x 256", [_dram_read]),
    "v5": ("persistent blocks, one per SM, and an epilogue that overlaps the next tile's K loop", [_tensor]),
    "v6": ("a swizzled output tile, stored by TMA in 64-column boxes", [_smem_stores, _tensor]),
    "v7": ("2-CTA clusters that share B through TMA multicast", [_dram_read, _tensor]),
}


def version_line(rows: list[dict], version: str, size: str = LINE_SIZE) -> str:
    """The one-line summary of a version on its page, from the counters CSV's rows at ``size``."""
    at_size = {r["version"]: r for r in rows if f"{r['m']}x{r['n']}x{r['k']}" == size}
    previous = VERSIONS[VERSIONS.index(version) - 1] if version != VERSIONS[0] else None
    missing = [v for v in (version, previous) if v and v not in at_size]
    if missing:
        raise KeyError(f"no counters row for {', '.join(missing)} at {size}")
    row = at_size[version]
    changed, why = CHANGES[version]
    m, n, k = size.split("x")
    shape = f"{m}³" if m == n == k else f"{m} x {n} x {k}"
    head = (f"**Measured** ({row['gpu'].removeprefix('NVIDIA ')}, {row['dtype']}, {shape}, median of {row['runs']} "
            f"runs; [counters](results.md#counters)). {version}: {changed}. ")
    if previous is None:
        return head + f"Time: {float(row['ms_median']):.4f} ms; tensor pipe busy {_pct(row)}% of active cycles."
    before = at_size[previous]
    old_ms, new_ms = float(before["ms_median"]), float(row["ms_median"])
    return (head + f"Time: {old_ms:.4f} → {new_ms:.4f} ms against {previous} ({(new_ms / old_ms - 1) * 100:+.1f}%). "
            f"Why: {'; '.join(counter(before, row) for counter in why)}.")


def update_lines(pages: list[Path] | None = None, csv_path: Path | None = None) -> int:
    """Rewrite the counters line of each version's page (docs/vN.md) from its CSV; exit status."""
    pages = pages or [DOCS / f"{version}.md" for version in VERSIONS]
    status = 0
    for page in pages:
        text = page.read_text()
        lines = list(LINE.finditer(text))
        if not lines:
            print(f"{page}: no <!-- counters-line <gpu> <version> --> ... <!-- /counters-line --> line",
                  file=sys.stderr)
            status = 1
            continue
        for match in lines:
            path = existing_csv(match.group(2), csv_path)
            if path is None:
                return 1
            try:
                line = version_line(read_rows(path), match.group(3))
            except KeyError as reason:
                print(f"{page}: {path}: {reason.args[0]}", file=sys.stderr)
                return 1
            text = text.replace(match.group(0), match.group(1) + line + "\n" + match.group(5))
        page.write_text(text)
        print(f"updated the counters line in {page}")
    return status


def existing_csv(slug: str, csv_path: Path | None) -> Path | None:
    """The CSV a block of GPU ``slug`` is written from (``csv_path`` if given); None, said on stderr, if it is missing."""
    path = csv_path or REPO / "results" / f"{slug}_counters.csv"
    if not path.exists():
        print(f"{path} does not exist: run `python docs/counters.py --run` on the GPU ({slug}) first", file=sys.stderr)
        return None
    return path


def update_page(page: Path = PAGE, csv_path: Path | None = None) -> int:
    """Rewrite each counters block of the page from its CSV (results/<slug>_counters.csv); exit status."""
    text = page.read_text()
    blocks = list(BLOCK.finditer(text))
    if not blocks:
        print(f"{page}: no <!-- counters <gpu> --> ... <!-- /counters --> block", file=sys.stderr)
        return 1
    for match in blocks:
        path = existing_csv(match.group(2), csv_path)
        if path is None:
            return 1
        rows = read_rows(path)
        if not rows:
            print(f"{path} has no rows", file=sys.stderr)
            return 1
        text = text.replace(match.group(0), match.group(1) + table(rows) + match.group(4))
    for match in LIMITS.finditer(text):
        path = existing_csv(match.group(2), csv_path)
        if path is None:
            return 1
        rows = read_rows(path)
        if not in_order(rows, LIMIT_VERSIONS):
            print(f"{path}: no rows of {' or '.join(LIMIT_VERSIONS)} for the counters-limits table: run "
                  f"python docs/counters.py --run --versions {' '.join(LIMIT_VERSIONS)} --sizes ...", file=sys.stderr)
            return 1
        text = text.replace(match.group(0), match.group(1) + limits_table(rows) + match.group(4))
    page.write_text(text)
    print(f"updated the counters table in {page}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--run", action="store_true", help="on a Hopper GPU: measure and write the CSV")
    mode.add_argument("--table", action="store_true",
                      help="rewrite the counters table in docs/results.md and the line on each docs/vN.md from the CSV")
    mode.add_argument("--child", nargs=2, metavar=("VERSION", "SIZE"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help="the CSV (default: results/<gpu>_counters.csv)")
    parser.add_argument("--sizes", nargs="+", default=SIZES, metavar="MxNxK")
    parser.add_argument("--versions", nargs="+", default=VERSIONS, choices=VERSIONS + LIMIT_VERSIONS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    if args.table:
        return update_page(csv_path=args.out) or update_lines(csv_path=args.out)
    bad = [s for s in args.sizes if not re.fullmatch(r"\d+x\d+x\d+", s)]
    if bad:
        parser.error(f"sizes must be MxNxK: {' '.join(bad)}")
    return run(args.versions, args.sizes, args.out)


if __name__ == "__main__":
    sys.exit(main())
