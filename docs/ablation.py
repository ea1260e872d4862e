"""v5's ablation: each technique switched off (or on) alone, timed against cuBLAS in one process.

    python plot.py --ablation        on a Hopper GPU: time the variants, write
                                     results/<gpu>_ablation.csv and the table in docs/results.md
    python plot.py --from ...        no GPU: rewrite the table from the CSV

For each shape, v5's tuned schedule is the base; every other column changes one thing:
the output tile unswizzled (``UnswizzledStoreV5``), the epilogue not overlapped (the
producer waits for both stores, ``EpilogueNotOverlappedV5``), not persistent (a block per
unit of work, as in v4), the cluster size flipped (1 <-> 2, with group_m scaled so that
the patch of tiles in flight keeps its height). v4 (tuned) is timed beside them. All
columns run interleaved, in rounds, on the same inputs as cuBLAS, with the timer every
version uses (median, L2 flushed before each run).

The two kernels that switch a technique off are subclasses of v5's Hopper kernel here, so
that matmul_v5.py holds only what v5 keeps; each replaces the one method that does the
technique.
"""

import csv
import datetime
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tilus import RegisterTensor, int32, uint32  # noqa: E402
from tilus.ir.layout.ops.shared_ops import shared_row_major  # noqa: E402

from matmul_v5 import HopperMatmulV5  # noqa: E402

DOCUMENT = REPO / "docs" / "results.md"
BLOCK = re.compile(r"(<!-- ablation (\S+) -->\n)(.*?)(<!-- /ablation -->)", re.S)
SIZES = ["4096", "8192", "4096x14336x4096", "4096x4096x14336"]  # square and LLM-like


class UnswizzledStoreV5(HopperMatmulV5):
    """v5 with v4's output tile: row-major, so every stmatrix meets an 8-way bank conflict; one TMA store."""

    def output_tile(self):
        s_c = self.shared_tensor(dtype=self.dtype, shape=[self.consumer_m, self.block_n])
        self.annotate_layout(s_c, shared_row_major(self.consumer_m, self.block_n))
        return s_c

    def epilogue(self, warpgroup: int, acc: RegisterTensor, tile_m: int32, tile_n: int32):
        offset_m = self.block_m * tile_m + warpgroup * self.consumer_m
        offset_n = self.block_n * tile_n
        self.store_shared(self.s_c, acc.to(self.dtype))
        self.fence.proxy_async(space="shared")
        self.sync()
        with self.single_warp():
            self.tma.shared_to_global(self.s_c, self.g_c, offsets=[offset_m, offset_n], dims=[0, 1])
            self.tma.commit_group()
            self.tma.wait_group(n=0, read=True)
            with self.single_thread():
                self.release_s_c(warpgroup)


class EpilogueNotOverlappedV5(HopperMatmulV5):
    """v5 whose producer loads a tile only once both warpgroups have stored the one before."""

    def load_units(self, k_trips: int32):
        # warpgroup 1 stores after warpgroup 0 and then arrives on s_c_free[0]: that barrier's
        # n-th phase completes once both have stored the block's n-th tile
        stored_phase: uint32 = 0
        for unit in self.scheduler.units():
            tile_m, tile_n = self.scheduler.tile(unit)
            if unit != self.scheduler.first_unit:
                self.mbarrier.wait(self.s_c_free[0], phase=stored_phase)
                stored_phase ^= 1
            self.load_tile(tile_m, tile_n, k_trips)


# column -> (kernel, schedule change, kernel argument num_sms) relative to the tuned v5
VARIANTS = {
    "v5": (HopperMatmulV5, {}, None),
    "unswizzled store": (UnswizzledStoreV5, {}, None),
    "epilogue not overlapped": (EpilogueNotOverlappedV5, {}, None),
    "not persistent": (HopperMatmulV5, {}, 2**30),
    "cluster size flipped": (HopperMatmulV5, {"cluster_m": "flip"}, None),  # and group_m, to keep the patch
}
FIELDS = ["gpu", "variant", "m", "n", "k", "ms", "pct_of_cublas", "schedule", "tilus", "torch", "date"]
ROUNDS, RUNS = 6, 10


def _programs(script_cls, args: tuple) -> list[tuple[dict, object]]:
    jit = script_cls()._jit_instance_for(*args)
    jit.programs()
    return [(jit.schedules[index], compiled.get_launch_func())
            for compiled, index in zip(jit.compiled_programs, jit.valid_schedules)]


def measure_variants(sizes: list[str] = SIZES, progress=print) -> Path:
    import tilus
    import torch

    import matmul_v4
    import matmul_v5
    from support import cache, cli, dispatch, gpu, measure

    if gpu.gpu_arch() != "hopper":
        raise SystemExit("the ablation is of v5's Hopper kernel: it needs a Hopper GPU")
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    kernel = matmul_v5.HopperMatmulV5
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    rows = []
    for seed, (m, n, k) in enumerate(cli.parse_size(size) for size in sizes):
        a, b, ref = measure.random_inputs(m, n, k, seed)
        out = torch.empty((m, n), dtype=torch.float16, device="cuda")
        matmul_v4.matmul(a, b, out)  # tunes v4 at this size
        matmul_v5.matmul(a, b, out)  # tunes v5 at this size
        tuned = dispatch.chosen_schedule(kernel, m, n, k)
        v4_tuned = dispatch.chosen_schedule(matmul_v4.HopperMatmulV4, m, n, k)
        v4_args = dispatch.kernel_args(matmul_v4.HopperMatmulV4, m, n, k, a, b, out)
        (v4_launch,) = [f for schedule, f in _programs(matmul_v4.HopperMatmulV4, v4_args) if schedule == v4_tuned]
        calls = {"cublas": lambda: torch.matmul(a, b.T, out=out), "v4": lambda: v4_launch(*v4_args)}
        schedules = {"v4": dispatch.format_schedule(v4_tuned)}
        for name, (variant, change, num_sms) in VARIANTS.items():
            want = dict(tuned)
            if change:  # cluster_m 1 <-> 2 with the same patch height: group_m counts units of cluster_m rows
                cluster = 3 - tuned["cluster_m"]
                group = tuned["group_m"] * tuned["cluster_m"] // cluster
                want |= {"cluster_m": cluster, "group_m": group if group in (8, 16, 32) else tuned["group_m"]}
            cache.use_cache(variant, gpu.gpu_label())
            args = dispatch.kernel_args(variant, m, n, k, a, b, out, num_sms=num_sms)
            (launch,) = [f for schedule, f in _programs(variant, args) if schedule == want]
            calls[name] = lambda launch=launch, args=args: launch(*args)
            schedules[name] = dispatch.format_schedule(want)
        for name, call in calls.items():
            out.fill_(float("nan"))
            call()
            measure.sync_or_exit(f"ablation {name} at {m}x{n}x{k}", 60)
            error = measure.relative_error(out, ref)
            if not measure.passes(error):
                raise SystemExit(f"ablation: {name} is wrong at {m}x{n}x{k} (relative error {error:.2e})")
        measure.warm_up_gpu(a, b)
        samples = {name: [] for name in calls}
        for _ in range(ROUNDS):
            for name, call in calls.items():
                samples[name] += measure.time_samples(call, RUNS, flush)
        medians = {name: float(torch.tensor(s).median()) for name, s in samples.items()}
        for name in calls:
            if name == "cublas":
                continue
            rows.append({"gpu": torch.cuda.get_device_name(), "variant": name, "m": m, "n": n, "k": k,
                         "ms": f"{medians[name]:.4f}", "pct_of_cublas": f"{100 * medians['cublas'] / medians[name]:.1f}",
                         "schedule": schedules[name], "tilus": tilus.__version__, "torch": torch.__version__,
                         "date": datetime.date.today().isoformat()})
        progress(f"ablation at {m}x{n}x{k}: " + ", ".join(
            f"{name} {100 * medians['cublas'] / ms:.1f}%" for name, ms in medians.items() if name != "cublas"))
    path = cli.RESULTS_DIR / f"{gpu.gpu_label()}_ablation.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    return path


def table(rows: list[dict]) -> str:
    """% of cuBLAS per shape (rows) and variant (columns), with the method underneath."""
    variants = [v for v in ["v4", *VARIANTS] if any(r["variant"] == v for r in rows)]
    by_key = {(r["variant"], f"{r['m']}x{r['n']}x{r['k']}"): r for r in rows}
    sizes = list(dict.fromkeys(f"{r['m']}x{r['n']}x{r['k']}" for r in rows))
    lines = ["| shape | " + " | ".join(variants) + " |", "|---|" + "---|" * len(variants)]
    for size in sizes:
        cells = [by_key[(v, size)]["pct_of_cublas"] if (v, size) in by_key else "-" for v in variants]
        lines.append(f"| {size} | " + " | ".join(cells) + " |")
    tuned = "; ".join(f"{size}: `{by_key[('v5', size)]['schedule']}`" for size in sizes if ("v5", size) in by_key)
    lines += ["", f"% of cuBLAS, {rows[0]['gpu']}, {rows[0]['date']}, tilus {rows[0]['tilus']}, torch "
              f"{rows[0]['torch']}: every column and cuBLAS timed interleaved in one process, {ROUNDS} rounds of "
              f"{RUNS} runs, median, L2 flushed before each run. v5's tuned schedules: {tuned}."]
    return "\n".join(lines) + "\n"


def update_page(results_dir: Path | None = None, document: Path = DOCUMENT) -> bool:
    """Rewrite the ablation table of docs/results.md from results/<gpu>_ablation.csv; True if it changed."""
    results_dir = results_dir or REPO / "results"
    if not document.exists():
        return False
    text = document.read_text()

    def render(match):
        path = results_dir / f"{match.group(2)}_ablation.csv"
        if not path.exists():  # not measured on this GPU yet: leave the block as it is
            return match.group(0)
        with path.open() as f:
            return match.group(1) + table(list(csv.DictReader(f))) + match.group(4)

    updated = BLOCK.sub(render, text)
    if updated != text:
        document.write_text(updated)
    return updated != text
