"""v5's ablation: each technique switched off (or on) alone, timed against cuBLAS in one process.

    python plot.py --ablation        on a Hopper GPU: time the variants, write
                                     results/<gpu>_ablation.csv and the table in docs/v5.md
    python plot.py --from ...        no GPU: rewrite the table from the CSV

For each shape, v5's tuned schedule is the base; every other column changes one thing:
the output tile unswizzled, the epilogue not overlapped (the producer waits for both
stores), not persistent (a block per unit of work, as in v4), the cluster size flipped
(1 <-> 2, with group_m scaled so that the patch of tiles in flight keeps its height), the
register split switched on. v4 (tuned) is timed beside
them. All columns run interleaved, in rounds, on the same inputs as cuBLAS, with the
timer every version uses (median, L2 flushed before each run).
"""

import csv
import datetime
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCUMENT = REPO / "docs" / "v5.md"
BLOCK = re.compile(r"(<!-- ablation (\S+) -->\n)(.*?)(<!-- /ablation -->)", re.S)
SIZES = ["4096", "8192", "4096x14336x4096", "4096x4096x14336"]  # square and LLM-like
# column -> (HopperMatmulV5 switches, schedule change, kernel argument num_sms) relative to the tuned v5
VARIANTS = {
    "v5": ({}, {}, None),
    "unswizzled store": ({"swizzled_store": False}, {}, None),
    "epilogue not overlapped": ({"overlap_epilogue": False}, {}, None),
    "not persistent": ({}, {}, 2**30),
    "cluster size flipped": ({}, {"cluster_m": "flip"}, None),  # and group_m, to keep the patch
    "register split on": ({"register_split": True}, {}, None),
}
FIELDS = ["gpu", "variant", "m", "n", "k", "ms", "pct_of_cublas", "schedule", "tilus", "torch", "date"]
ROUNDS, RUNS = 6, 10


def _programs(script_cls, kwargs: dict, args: tuple) -> list[tuple[dict, object]]:
    jit = script_cls(**kwargs)._jit_instance_for(*args)
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
    cache.use_cache(kernel, gpu.gpu_label())
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
        (v4_launch,) = [f for schedule, f in _programs(matmul_v4.HopperMatmulV4, {}, v4_args) if schedule == v4_tuned]
        calls = {"cublas": lambda: torch.matmul(a, b.T, out=out), "v4": lambda: v4_launch(*v4_args)}
        schedules = {"v4": dispatch.format_schedule(v4_tuned)}
        for name, (switches, change, num_sms) in VARIANTS.items():
            want = tuned | switches
            if change:  # cluster_m 1 <-> 2 with the same patch height: group_m counts units of cluster_m rows
                cluster = 3 - tuned["cluster_m"]
                group = tuned["group_m"] * tuned["cluster_m"] // cluster
                want |= {"cluster_m": cluster, "group_m": group if group in (8, 16, 32) else tuned["group_m"]}
            args = dispatch.kernel_args(kernel, m, n, k, a, b, out, num_sms=num_sms)
            (launch,) = [f for schedule, f in _programs(kernel, switches, args) if schedule == want]
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
    variants = ["v4", *VARIANTS]
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
    """Rewrite the ablation table of docs/v5.md from results/<gpu>_ablation.csv; True if it changed."""
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
