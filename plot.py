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


def stages() -> list[str]:
    return sorted(path.stem for path in REPO.glob("matmul_v*.py"))


def read_rows(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def _size(row: dict) -> str:
    return f"{row['m']}x{row['n']}x{row['k']}"


def results_table(rows: list[dict], versions: list[str]) -> str:
    """Markdown table of the versions' results, cuBLAS last; one version also shows its schedule."""
    sizes = sorted({_size(r) for r in rows}, key=lambda s: [int(x) for x in s.split("x")])
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
        lines = ["| stage | " + " | ".join(sizes) + " |", "|---|" + "---|" * len(sizes)]
        for version in [*versions, "cublas"]:
            cells = []
            for size in sizes:
                row = by_key.get((version, size))
                if row is None:
                    cells.append("-")
                elif version == "cublas":
                    cells.append(f"{row['tflops']} TFLOPS")
                else:
                    cells.append(f"{row['tflops']} TFLOPS ({row['pct_of_cublas']}%)")
            lines.append(f"| {'cuBLAS' if version == 'cublas' else version} | " + " | ".join(cells) + " |")
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
    sizes = sorted({_size(r) for r in rows}, key=lambda s: [int(x) for x in s.split("x")])
    by_key = {(r["version"], _size(r)): r for r in rows}
    plt.rcParams["svg.hashsalt"] = "tilus-gemm-tutorial"
    fig, ax = plt.subplots(figsize=(8, 3.6))
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
        ax.bar_label(bars, labels=labels, fontsize=7, padding=2)
    ax.set_xticks(range(len(sizes)), sizes)
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
    parser.add_argument("--sizes", nargs="+", default=harness.DEFAULT_SIZES, help="sizes to benchmark (N or MxNxK)")
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
