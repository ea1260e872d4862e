"""Benchmark every stage against cuBLAS (and a Triton peer), or re-plot measured results.

    python plot.py                            on a Hopper/Blackwell GPU: time v1..vN and cuBLAS on
                                              one or two shapes of each class and on square sizes
                                              from 512 to 16384 (each stage's CLI with --save)
    python plot.py --peer                     also time the Triton GEMM torch reaches (below)
    python plot.py --from results/h100.csv    no GPU needed: figures and tables from that CSV
    python plot.py --ablation                 on a Hopper GPU: time v5 with each technique off
                                              (docs/ablation.py; the table in docs/v5.md)

The peer is what a user would pick instead of hand-written kernels: ``torch.compile`` of
``a @ b.T`` with ``mode="max-autotune-no-cudagraphs"``, Inductor restricted to its Triton
GEMM templates with the persistent TMA template enabled, timed like every stage (same
timer, cuBLAS in the same run, rows with version ``triton``).

Writes docs/figures/perf_<gpu>.* (bars, one group per shape of each class), sizes_<gpu>.*
(TFLOPS across square sizes) and classes_<gpu>.* (a panel per shape class), each with the
GPU's dense fp16 peak where known, and rewrites every results table in README.md and
docs/*.md that sits between ``<!-- results <gpu> <versions> -->`` and ``<!-- /results -->``,
so no measured number is typed by hand. It also redraws the figures that come from
models (docs/timeline.py, docs/raster.py) and rewrites each stage's build evidence table
from the builds (docs/evidence.py; no GPU needed, slow only the first time).
"""

import argparse
import csv
import importlib
import importlib.util
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from support import cache, cli, gpu, measure  # noqa: E402

REPO = cache.REPO
FIGURES = REPO / "docs" / "figures"
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"(<!-- results (\S+) (\S+) -->\n)(.*?)(<!-- /results -->)", re.S)


# one or two shapes of each class a version is judged on (M x N x K; C = A @ B.T)
CLASS_SIZES = [
    "4096", "8192",  # square
    "4096x14336x4096", "4096x4096x14336",  # LLM-like: an MLP's up and down projection, 4096 tokens
    "128x8192x8192", "256x14336x4096",  # skinny: M <= 256
    "16384x1024x4096", "2048x2048x8192",  # few tiles: under 4 waves of 128 x 256 tiles on 132 SMs
]
SQUARE_SIZES = ["512", "1024", "2048", "4096", "8192", "16384"]
BENCHMARK_SIZES = CLASS_SIZES + [size for size in SQUARE_SIZES if size not in CLASS_SIZES]

# dense fp16 tensor-core peak from NVIDIA's datasheets, TFLOPS (without sparsity)
PEAK_TFLOPS = {"h100": 989.4, "h200": 989.4, "h100-pcie": 756.5}
PEER = "triton"
PEER_CONFIG = "torch.compile max-autotune-no-cudagraphs; Inductor Triton templates, persistent TMA"
STYLE = {"cublas": {"color": "0.35", "label": "cuBLAS"}, PEER: {"color": "0.65", "label": "Triton (torch.compile)"}}


def stages() -> list[str]:
    return sorted(path.stem for path in REPO.glob("matmul_v*.py"))


def shape_class(m: int, n: int, k: int) -> str:
    """The class a shape is judged in: square, LLM-like, skinny (M <= 256) or few tiles."""
    if m <= 256:
        return "skinny"
    if m == n == k:
        return "square"
    if {n, k} & {11008, 14336}:
        return "LLM-like"
    if -(-m // 128) * -(-n // 256) < 4 * 132:
        return "few tiles"
    return "other"


def read_rows(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def _size(row: dict) -> str:
    return f"{row['m']}x{row['n']}x{row['k']}"


CLASS_ORDER = ["square", "LLM-like", "skinny", "few tiles", "other"]


def _dims(size: str) -> tuple[int, int, int]:
    m, n, k = (int(x) for x in size.split("x"))
    return m, n, k


def _class_sizes(rows: list[dict]) -> list[str]:
    """The class shapes present in the rows, grouped by class, then by M, N, K."""
    wanted = {"x".join(map(str, cli.parse_size(size))) for size in CLASS_SIZES}
    present = {_size(r) for r in rows} & wanted
    return sorted(present, key=lambda size: (CLASS_ORDER.index(shape_class(*_dims(size))), *_dims(size)))


def _label(version: str) -> str:
    return STYLE.get(version, {}).get("label", version)


def _versions(rows: list[dict]) -> list[str]:
    """Stages in order, then the peer, then cuBLAS."""
    found = {r["version"] for r in rows}
    return sorted(found - {"cublas", PEER}) + [v for v in (PEER, "cublas") if v in found]


def results_table(rows: list[dict], versions: list[str]) -> str:
    """Markdown table of the versions' results, cuBLAS last; one version also shows its schedule."""
    sizes = _class_sizes(rows)
    by_key = {(r["version"], _size(r)): r for r in rows}
    if len(versions) == 1:
        (version,) = versions
        lines = [f"| size | {version} TFLOPS | % of cuBLAS | cuBLAS TFLOPS | rel. error | schedule chosen |", "|---|---|---|---|---|---|"]
        for size in sizes:
            ours = by_key.get((version, size))
            if ours:
                # cuBLAS as timed in this version's own run: its time is ours scaled by the ratio
                cublas_ms = float(ours["ms"]) * float(ours["pct_of_cublas"]) / 100
                lines.append(
                    f"| {size} | {ours['tflops']} | {ours['pct_of_cublas']} | "
                    f"{measure.tflops(*_dims(size), cublas_ms):.1f} | {ours['rel_err']} | `{ours['config']}` |"
                )
    else:
        names = [_label(v) for v in [*versions, "cublas"]]
        lines = ["| class | size | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
        for size in sizes:
            cells = []
            for version in [*versions, "cublas"]:
                row = by_key.get((version, size))
                if row is None:
                    cells.append("-")
                elif version == "cublas":
                    cells.append(f"{row['tflops']} TFLOPS")
                else:
                    cells.append(f"{row['tflops']} ({row['pct_of_cublas']}%)")
            lines.append(f"| {shape_class(*_dims(size))} | {size} | " + " | ".join(cells) + " |")
        lines.append("")
        lines.append("Each cell: TFLOPS (% of cuBLAS timed in the same run as that column); "
                     "the cuBLAS column is from the last of those runs.")
    gpus = sorted({r["gpu"] for r in rows})
    dates = sorted({r["date"] for r in rows})
    lines.append("")
    lines.append(
        f"{', '.join(gpus)}; fp16 in, fp32 accumulate; median of timed runs with CUDA events, L2 flushed "
        f"before each; % of cuBLAS from the same run; measured {dates[0]}"
        + (f" to {dates[-1]}" if len(dates) > 1 else "")
        + f" with tilus {rows[0]['tilus']}, torch {rows[0]['torch']}."
    )
    return "\n".join(lines) + "\n"


def update_documents(csv_dir: Path = cli.RESULTS_DIR, documents: list[Path] = DOCUMENTS) -> list[Path]:
    """Rewrite each results block from results/<gpu>.csv; return the documents that changed."""
    changed = []
    for document in documents:
        text = document.read_text()

        def render(match):
            slug, versions = match.group(2), match.group(3).split(",")
            table = results_table(read_rows(csv_dir / f"{slug}.csv"), versions)
            return match.group(1) + table + match.group(5)

        updated = BLOCK.sub(render, text)
        if updated != text:
            document.write_text(updated)
            changed.append(document)
    return changed


def _save(fig, out_dir: Path, name: str) -> list[Path]:
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.svg", out_dir / f"{name}.png"]
    fig.savefig(paths[0], metadata={"Date": None})
    fig.savefig(paths[1], dpi=150, metadata={"Software": None})
    plt.close(fig)
    return paths


def _top(rows: list[dict], slug: str) -> float:
    """The y-axis top: room above the GPU's peak line and the fastest measurement."""
    return max(PEAK_TFLOPS.get(slug, 0), *(float(r["tflops"]) for r in rows)) * 1.12


def _peak_line(ax, slug: str) -> None:
    if slug in PEAK_TFLOPS:
        ax.axhline(PEAK_TFLOPS[slug], color="black", linestyle="--", linewidth=0.8)
        ax.text(ax.get_xlim()[0], PEAK_TFLOPS[slug], f" dense fp16 peak (datasheet): {PEAK_TFLOPS[slug]:.0f}",
                fontsize=6, va="bottom")


def _bars(ax, rows: list[dict], sizes: list[str], slug: str) -> None:
    versions = _versions(rows)
    by_key = {(r["version"], _size(r)): r for r in rows}
    width = 0.8 / len(versions)
    for i, version in enumerate(versions):
        xs, heights, labels = [], [], []
        for j, size in enumerate(sizes):
            row = by_key.get((version, size))
            if row is not None:
                xs.append(j + (i - (len(versions) - 1) / 2) * width)
                heights.append(float(row["tflops"]))
                labels.append("" if version == "cublas" else f"{float(row['pct_of_cublas']):.0f}%")
        bars = ax.bar(xs, heights, width, label=_label(version), color=STYLE.get(version, {}).get("color"))
        ax.bar_label(bars, labels=labels, fontsize=5, padding=2)
    ax.set_xticks(range(len(sizes)), sizes, fontsize=6)
    ax.set_ylabel("TFLOPS", fontsize=7)
    ax.tick_params(axis="y", labelsize=6)
    ax.set_ylim(0, _top(rows, slug))
    _peak_line(ax, slug)


def plot(rows: list[dict], slug: str, out_dir: Path = FIGURES) -> list[Path]:
    """perf_<slug>: every class shape; sizes_<slug>: square sizes; classes_<slug>: a panel per class."""
    gpu_name = rows[0]["gpu"]
    plt.rcParams["svg.hashsalt"] = "tilus-gemm-tutorial"
    paths = []

    sizes = _class_sizes(rows)
    fig, ax = plt.subplots(figsize=(max(8, 1.4 * len(sizes)), 3.8))
    _bars(ax, rows, sizes, slug)
    ax.set_xticks(range(len(sizes)), [f"{size}\n{shape_class(*_dims(size))}" for size in sizes], fontsize=7)
    ax.set_title(f"fp16 GEMM C = A @ B.T on {gpu_name}: each stage and cuBLAS (labels: % of cuBLAS, same run)",
                 fontsize=9)
    ax.legend(fontsize=8, ncol=len(_versions(rows)), loc="lower center", bbox_to_anchor=(0.5, -0.32), frameon=False)
    paths += _save(fig, out_dir, f"perf_{slug}")

    squares = sorted({int(r["m"]) for r in rows if r["m"] == r["n"] == r["k"]})
    by_key = {(r["version"], int(r["m"])): r for r in rows if r["m"] == r["n"] == r["k"]}
    fig, ax = plt.subplots(figsize=(7, 4))
    for version in _versions(rows):
        points = [(n, float(by_key[version, n]["tflops"])) for n in squares if (version, n) in by_key]
        style = STYLE.get(version, {})
        ax.plot([n for n, _ in points], [t for _, t in points], marker="o", markersize=3, label=_label(version),
                color=style.get("color"), linewidth=2 if version in STYLE else 1.2)
    ax.set_xscale("log", base=2)
    ax.set_xticks(squares, [str(n) for n in squares], fontsize=7)
    ax.set_xlabel("M = N = K", fontsize=8)
    ax.set_ylabel("TFLOPS", fontsize=8)
    ax.set_ylim(0, _top(rows, slug))
    _peak_line(ax, slug)
    ax.set_title(f"Square fp16 GEMMs on {gpu_name}", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    paths += _save(fig, out_dir, f"sizes_{slug}")

    classes = [c for c in CLASS_ORDER if any(shape_class(*_dims(size)) == c for size in sizes)]
    fig, axes = plt.subplots(1, len(classes), figsize=(3.6 * len(classes), 3.6), squeeze=False)
    for ax, name in zip(axes[0], classes):
        _bars(ax, rows, [size for size in sizes if shape_class(*_dims(size)) == name], slug)
        ax.set_title(name, fontsize=9)
    axes[0][0].legend(fontsize=6, loc="lower left")
    fig.suptitle(f"Each shape class on {gpu_name} (labels: % of cuBLAS, same run)", fontsize=9)
    paths += _save(fig, out_dir, f"classes_{slug}")
    return paths


def benchmark(sizes: list[str]) -> Path:
    """Time every stage and cuBLAS on this GPU; each stage's rows go to results/<gpu>.csv."""
    failed = []
    for stage in stages():
        module = importlib.import_module(stage)
        version = stage.removeprefix("matmul_")
        if cli.main(version, module.KERNELS, module.matmul, ["--save", "--sizes", *sizes]) != 0:
            failed.append(stage)
    if failed:
        raise SystemExit(f"not plotted: {', '.join(failed)} failed their check")
    return cli.RESULTS_DIR / f"{gpu.gpu_label()}.csv"


def benchmark_peer(sizes: list[str], repeat: int = 50) -> Path:
    """Time the Triton GEMM torch.compile reaches, against cuBLAS in the same run, as the stages are timed."""
    import torch._dynamo
    import torch._inductor.config as inductor

    inductor.max_autotune_gemm_backends = "TRITON"  # a Triton kernel, never cuBLAS behind the name
    inductor.triton.enable_persistent_tma_matmul = True
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    path = cli.RESULTS_DIR / f"{gpu.gpu_label()}.csv"
    for seed, (m, n, k) in enumerate(cli.parse_size(size) for size in sizes):
        print(f"{PEER} peer at {m}x{n}x{k}: torch.compile autotunes its Triton templates...", flush=True)
        torch._dynamo.reset()  # one compiled graph per shape, no recompile limit
        compiled = torch.compile(lambda x, y: x @ y.T, mode="max-autotune-no-cudagraphs", dynamic=False)
        a, b, ref = measure.random_inputs(m, n, k, seed)
        err = measure.relative_error(compiled(a, b), ref)
        expected = torch.empty((m, n), dtype=torch.float16, device="cuda")
        if not measure.passes(err):
            raise SystemExit(f"the {PEER} peer is wrong at {m}x{n}x{k}: relative error {err:.2e}")
        ms, cublas_ms = measure.time_against_cublas(lambda: compiled(a, b), lambda: torch.matmul(a, b.T, out=expected),
                                                    repeat)
        records = cli.csv_records(PEER, (m, n, k), ms, cublas_ms, err, measure.relative_error(expected, ref),
                                  PEER_CONFIG)
        path = cli.save_rows(records, gpu.gpu_label())  # after each shape: a long run keeps what it measured
        print(f"{PEER} peer at {m}x{n}x{k}: {ms:.4f} ms, {100 * cublas_ms / ms:.1f}% of cuBLAS", flush=True)
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", type=Path, help="plot this results CSV instead of benchmarking")
    parser.add_argument("--sizes", nargs="+", default=BENCHMARK_SIZES,
                        help="sizes to benchmark (N or MxNxK); default: one or two of each shape class and "
                             "square sizes from 512 to 16384")
    parser.add_argument("--peer", action="store_true", help="also time the Triton GEMM torch.compile reaches")
    parser.add_argument("--ablation", action="store_true",
                        help="only time v5 with each technique switched off, beside v4 and cuBLAS")
    args = parser.parse_args(argv)
    if args.ablation:
        ablation = _docs_script("ablation")
        print(f"wrote {ablation.measure_variants().relative_to(REPO)}")
        if ablation.update_page():
            print(f"updated the ablation table in {ablation.DOCUMENT.relative_to(REPO)}")
        return 0
    sources = [args.source] if args.source else []
    if not sources:
        try:
            gpu.gpu_arch()
            sources = [benchmark(args.sizes)]
            if args.peer:
                benchmark_peer(args.sizes)
        except gpu.UnsupportedGPUError as reason:
            sources = sorted(cli.RESULTS_DIR.glob("*.csv"))
            print(f"No Hopper or Blackwell GPU here ({reason}): re-plotting {len(sources)} results file(s) instead.")
    for source in sources:
        if not source.exists():
            parser.error(f"{source} does not exist")
        for path in plot(read_rows(source), source.stem):
            print(f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    for document in update_documents():
        print(f"updated the results tables in {document.relative_to(REPO)}")
    if _docs_script("ablation").update_page():
        print("updated the ablation table in docs/v5.md")
    for path in model_figures():
        print(f"wrote {path.relative_to(REPO)} (a model)")
    print("build evidence: building every schedule without a GPU (cached after the first time)...", flush=True)
    for document in _docs_script("evidence").update_all(progress=lambda line: None):
        print(f"updated the build evidence tables in {document.relative_to(REPO)}")
    return 0


def _docs_script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "docs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def model_figures() -> list[Path]:
    """The figures drawn from models, not measurements: the timelines of v1-v3 and v4's tile order."""
    raster = _docs_script("raster")
    raster.update_page()
    return [*_docs_script("timeline").main(), raster.draw()]


if __name__ == "__main__":
    sys.exit(main())
