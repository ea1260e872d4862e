"""Benchmark every stage against cuBLAS, or re-plot measured results; regenerate the results tables.

    python plot.py                            on a Hopper/Blackwell GPU: time v1..vN and cuBLAS
                                              (each stage's CLI with --save), then plot
    python plot.py --from results/h100.csv    no GPU needed: plot and tables from that CSV

Writes docs/figures/perf_<gpu>.svg and .png, and rewrites every results table in README.md
and docs/*.md that sits between ``<!-- results <gpu> <versions> -->`` and
``<!-- /results -->`` from the CSV, so no measured number is typed by hand.
"""

import argparse
import csv
import importlib
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

import harness  # noqa: E402

REPO = harness.REPO
FIGURES = REPO / "docs" / "figures"
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"(<!-- results (\S+) (\S+) -->\n)(.*?)(<!-- /results -->)", re.S)


# one or two shapes of each class a version is judged on (M x N x K; C = A @ B.T)
BENCHMARK_SIZES = [
    "4096", "8192",  # square
    "4096x14336x4096", "4096x4096x14336",  # LLM-like: an MLP's up and down projection, 4096 tokens
    "128x8192x8192", "256x14336x4096",  # skinny: M <= 256
    "16384x1024x4096", "2048x2048x8192",  # few tiles: under 4 waves of 128 x 256 tiles on 132 SMs
]


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


def _ordered_sizes(rows: list[dict]) -> list[str]:
    """Sizes grouped by shape class, then by M, N, K."""

    def key(size: str):
        m, n, k = (int(x) for x in size.split("x"))
        return CLASS_ORDER.index(shape_class(m, n, k)), m, n, k

    return sorted({_size(r) for r in rows}, key=key)


def results_table(rows: list[dict], versions: list[str]) -> str:
    """Markdown table of the versions' results, cuBLAS last; one version also shows its schedule."""
    sizes = _ordered_sizes(rows)
    by_key = {(r["version"], _size(r)): r for r in rows}
    if len(versions) == 1:
        (version,) = versions
        lines = [f"| size | {version} TFLOPS | % of cuBLAS | cuBLAS TFLOPS | rel. error | schedule chosen |", "|---|---|---|---|---|---|"]
        for size in sizes:
            ours, theirs = by_key.get((version, size)), by_key.get(("cublas", size))
            if ours and theirs:
                lines.append(
                    f"| {size} | {ours['tflops']} | {ours['pct_of_cublas']} | {theirs['tflops']} | "
                    f"{ours['rel_err']} | `{ours['config']}` |"
                )
    else:
        names = ["cuBLAS" if v == "cublas" else v for v in [*versions, "cublas"]]
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
            m, n, k = (int(x) for x in size.split("x"))
            lines.append(f"| {shape_class(m, n, k)} | {size} | " + " | ".join(cells) + " |")
        lines.append("")
        lines.append("Each cell: TFLOPS (% of cuBLAS in the same run).")
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


def update_documents(csv_dir: Path = harness.RESULTS_DIR, documents: list[Path] = DOCUMENTS) -> list[Path]:
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


def plot(rows: list[dict], slug: str, out_dir: Path = FIGURES) -> list[Path]:
    versions = sorted({r["version"] for r in rows} - {"cublas"}) + ["cublas"]
    sizes = _ordered_sizes(rows)
    by_key = {(r["version"], _size(r)): r for r in rows}
    plt.rcParams["svg.hashsalt"] = "tilus-gemm-tutorial"
    fig, ax = plt.subplots(figsize=(max(8, 1.4 * len(sizes)), 3.8))
    width = 0.8 / len(versions)
    for i, version in enumerate(versions):
        xs, heights, labels = [], [], []
        for j, size in enumerate(sizes):
            row = by_key.get((version, size))
            if row is not None:
                xs.append(j + (i - (len(versions) - 1) / 2) * width)
                heights.append(float(row["tflops"]))
                labels.append("" if version == "cublas" else f"{float(row['pct_of_cublas']):.0f}%")
        color = "0.35" if version == "cublas" else None
        bars = ax.bar(xs, heights, width, label="cuBLAS" if version == "cublas" else version, color=color)
        ax.bar_label(bars, labels=labels, fontsize=6, padding=2)
    tick_labels = [f"{size}\n{shape_class(*(int(x) for x in size.split('x')))}" for size in sizes]
    ax.set_xticks(range(len(sizes)), tick_labels, fontsize=7)
    ax.set_ylabel("TFLOPS")
    gpu = rows[0]["gpu"]
    ax.set_title(f"fp16 GEMM C = A @ B.T on {gpu}: each stage and cuBLAS (labels: % of cuBLAS, same run)", fontsize=9)
    ax.legend(fontsize=8, ncol=len(versions), loc="lower center", bbox_to_anchor=(0.5, -0.32), frameon=False)
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"perf_{slug}.svg", out_dir / f"perf_{slug}.png"]
    fig.savefig(paths[0], metadata={"Date": None})
    fig.savefig(paths[1], dpi=150, metadata={"Software": None})
    plt.close(fig)
    return paths


def benchmark(sizes: list[str]) -> Path:
    """Time every stage and cuBLAS on this GPU; each stage's rows go to results/<gpu>.csv."""
    failed = []
    for stage in stages():
        module = importlib.import_module(stage)
        version = stage.removeprefix("matmul_")
        if harness.main(version, module.KERNELS, module.matmul, ["--save", "--sizes", *sizes]) != 0:
            failed.append(stage)
    if failed:
        raise SystemExit(f"not plotted: {', '.join(failed)} failed their check")
    return harness.RESULTS_DIR / f"{harness.gpu_slug(torch.cuda.get_device_name())}.csv"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", type=Path, help="plot this results CSV instead of benchmarking")
    parser.add_argument("--sizes", nargs="+", default=BENCHMARK_SIZES,
                        help="sizes to benchmark (N or MxNxK); default: one or two of each shape class")
    args = parser.parse_args(argv)
    sources = [args.source] if args.source else []
    if not sources:
        try:
            harness.gpu_arch()
            sources = [benchmark(args.sizes)]
        except harness.UnsupportedGPUError as reason:
            sources = sorted(harness.RESULTS_DIR.glob("*.csv"))
            print(f"No Hopper or Blackwell GPU here ({reason}): re-plotting {len(sources)} results file(s) instead.")
    for source in sources:
        if not source.exists():
            parser.error(f"{source} does not exist")
        for path in plot(read_rows(source), source.stem):
            print(f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    for document in update_documents():
        print(f"updated the results tables in {document.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
