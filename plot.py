"""Benchmark every version against cuBLAS (and a Triton peer) in both regimes, or re-plot measured results.

    python plot.py                            on a Hopper/Blackwell GPU: time v1..vN and cuBLAS on
                                              two or three shapes of each class, the nine decode
                                              shapes and square sizes from 512 to 16384, burst and
                                              back-to-back, all contenders in one process
    python plot.py --peer                     also time the Triton GEMM torch reaches (below)
    python plot.py --csv-only                 benchmark and write results/<gpu>.csv, draw nothing
    python plot.py --from results/h100.csv    no GPU needed: figures and tables from that CSV
    python plot.py --relabel v5=v7 --measured-at <commit>
                                              keep a renamed version's rows: only where every schedule's
                                              tilus program is the one measured (support/provenance.py)

At each size every contender is checked, then timed in both regimes of ``support/bench.py``
(burst: the kernel alone; back-to-back: a program's loop through its entry point), the
contenders in a fresh random order each round, so that clock drift hits all alike
(``support.cli.benchmark``). At the end of the fp16 run it measures REPEAT_SIZES a second
time, into results/<gpu>_repeat.csv, to show how far two measurements of one build agree.
The peer is what a user would pick instead of hand-written kernels: ``torch.compile`` of
``a @ b.T`` with ``mode="max-autotune-no-cudagraphs"``, Inductor restricted to its Triton
GEMM templates with the persistent TMA template enabled (rows with version ``triton``).

Writes docs/figures/perf_<gpu>.* (bars, one group per shape of each class, a panel per
regime), sizes_<gpu>.* (TFLOPS across square sizes) and classes_<gpu>.* (a panel per shape
class, back-to-back; decode in TB/s against the copy bandwidth measured in the same run),
with the GPU's dense fp16 peak where known, and rewrites every table block in README.md and
docs/*.md (``<!-- kind <gpu> args -->`` ... ``<!-- /kind -->``: results, the README's versions
table, each page's before/after ``compare`` table, the repeat, launch, dtypes and trails
tables of docs/results.md), so no measured number is typed by hand. It also redraws the figures that come from
models (docs/timeline.py, docs/raster.py, docs/streamk.py) and rewrites each version's build evidence table
from the builds (docs/evidence.py; no GPU needed, slow only the first time).
"""

import argparse
import ast
import csv
import importlib
import importlib.util
import re
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import torch  # noqa: E402

from support import bench, cache, cli, gpu, measure, provenance, scaled, versions  # noqa: E402
from support.bench import Contender  # noqa: E402

REPO = cache.REPO
FIGURES = REPO / "docs" / "figures"
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# <!-- kind slug args --> ... <!-- /kind -->: a table written from results/<slug>.csv (see update_documents)
BLOCK = re.compile(r"(<!-- (results|launch|dtypes|trails|compare|versions|repeat|model|fp8) (\S+)((?: \S+)*) -->\n)(.*?)"
                   r"(<!-- /\2 -->)", re.S)


# two or three shapes of each class a version is judged on (M x N x K; C = A @ B.T)
CLASS_SIZES = [
    "4096", "8192",  # square
    "4096x14336x4096", "4096x4096x14336",  # LLM-like: an MLP's up and down projection, 4096 tokens
    "128x8192x8192", "256x14336x4096",  # skinny: M <= 256
    "16384x1024x4096", "2048x2048x8192",  # few tiles: under 4 waves of 128 x 256 tiles on 132 SMs
    "3000x5000x2056",  # few tiles, and K no multiple of a ring trip (33 K blocks of 64)
    # decode: 1, 16 or 64 tokens through an LLM layer's weights (N x K): memory-bound
    *(f"{m}x{nk}" for m in (1, 16, 64) for nk in ("4096x4096", "14336x4096", "4096x14336")),
]
SQUARE_SIZES = ["512", "1024", "2048", "4096", "8192", "16384"]
BENCHMARK_SIZES = CLASS_SIZES + [size for size in SQUARE_SIZES if size not in CLASS_SIZES]
# measured a second time at the end of a run, to show how far two measurements of one build agree
REPEAT_SIZES = ["4096", "8192", "128x8192x8192"]
# bf16: every version at the squares of the class sizes (the README's progression holds in both dtypes)
BF16_SIZES = ["4096", "8192"]

# dense fp16 tensor-core peak from NVIDIA's datasheets, TFLOPS (without sparsity)
PEAK_TFLOPS = {"h100": 989.4, "h200": 989.4, "h100-pcie": 756.5}
PEER = "triton"
PEER_CONFIG = "torch.compile max-autotune-no-cudagraphs; Inductor Triton templates, persistent TMA"
STYLE = {"cublas": {"color": "0.35", "label": "cuBLAS"}, PEER: {"color": "0.65", "label": "Triton (torch.compile)"}}
REGIMES = {"back-to-back": "a program's loop through each entry point, host cost included",
           "burst": "the kernel alone: L2 flushed, launches queued ahead"}


def versions_on_disk() -> list[str]:
    """The 16-bit versions this benchmark times (module names, v1 first); fp8's are matmul_v10.py's and v11's."""
    return versions.sixteen_bit()


def shape_class(m: int, n: int, k: int) -> str:
    """The class a shape is judged in: square, LLM-like, skinny (M <= 256), few tiles or decode (M <= 64)."""
    if m <= 64:
        return "decode"
    if m <= 256:
        return "skinny"
    if m == n == k:
        return "square"
    if {n, k} & {11008, 14336}:
        return "LLM-like"
    if -(-m // 128) * -(-n // 256) < 4 * 132:
        return "few tiles"
    return "other"


read_rows = cli.read_rows


def _size(row: dict) -> str:
    return f"{row['m']}x{row['n']}x{row['k']}"


CLASS_ORDER = ["square", "LLM-like", "skinny", "few tiles", "decode", "other"]


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
    """Versions in order, then the peer, then cuBLAS."""
    found = {r["version"] for r in rows}
    return sorted(found - {"cublas", PEER}) + [v for v in (PEER, "cublas") if v in found]


def _timed(rows: list[dict], regime: str, dtype: str = "fp16") -> list[dict]:
    return [r for r in rows if r["regime"] == regime and r["dtype"] == dtype and r["ms"]]


def _tb_per_s(row: dict) -> float:
    """Bytes of A, B and C over the time (TB/s): a decode shape's measure."""
    m, n, k = _dims(_size(row))
    return (m * k + n * k + m * n) * 2 / (float(row["ms"]) * 1e-3) / 1e12


def _copy_tb_per_s(rows: list[dict]) -> float | None:
    """The device-to-device copy bandwidth the run measured, recovered from any row's share of it."""
    for row in rows:
        if row.get("pct_of_bandwidth"):
            return _tb_per_s(row) / (float(row["pct_of_bandwidth"]) / 100)
    return None


def _pct(row: dict) -> str:
    """% of cuBLAS in the same run, with half the spread (max - min over the rounds) where it was measured."""
    spread = f" ±{float(row['pct_spread']) / 2:.1f}" if row.get("pct_spread") else ""
    return f"{float(row['pct_of_cublas']):.1f}%{spread}"


def _cell(row: dict | None, version: str) -> str:
    if row is None:
        return "-"
    decode = shape_class(*_dims(_size(row))) == "decode"
    value = f"{_tb_per_s(row):.2f} TB/s" if decode else f"{float(row['tflops']):.1f}"
    if version != "cublas":
        return f"{value} ({_pct(row)})"
    clock = f", {float(row['sm_mhz']):.0f} MHz" if row["sm_mhz"] else ""
    share = f", {float(row['pct_of_bandwidth']):.0f}% of copy" if decode and row["pct_of_bandwidth"] else ""
    return value + ("" if decode else " TFLOPS") + share + clock


def _comparison_table(rows: list[dict], versions: list[str], regime: str, dtype: str) -> list[str]:
    sizes = _class_sizes(_timed(rows, regime, dtype))
    by_key = {(r["version"], _size(r)): r for r in _timed(rows, regime, dtype)}
    names = [_label(v) for v in [*versions, "cublas"]]
    lines = [f"**{regime}**: {REGIMES[regime]}", "", "| class | size | " + " | ".join(names) + " |",
             "|---|---|" + "---|" * len(names)]
    for size in sizes:
        cells = [_cell(by_key.get((version, size)), version) for version in [*versions, "cublas"]]
        lines.append(f"| {shape_class(*_dims(size))} | {size} | " + " | ".join(cells) + " |")
    return lines + [""]


def _host_line(rows: list[dict], versions: list[str], dtype: str) -> list[str]:
    """Host µs per call of each entry point: the median over the measured sizes, and the range."""
    cells = []
    for version in [*versions, "cublas"]:
        values = sorted(float(r["host_us"]) for r in _timed(rows, "back-to-back", dtype) if r["version"] == version
                        and r["host_us"])
        if values:
            cells.append(f"{statistics.median(values):.1f} ({values[0]:.1f}-{values[-1]:.1f})")
        else:
            cells.append("-")
    names = [_label(v) if v != "cublas" else "cuBLAS (torch.matmul)" for v in [*versions, "cublas"]]
    return ["**host µs per call** (CPU time of the Python entry point, no sync; median over the sizes, and range)", "",
            "| " + " | ".join(names) + " |", "|" + "---|" * len(names), "| " + " | ".join(cells) + " |", ""]


def _energy_table(rows: list[dict], versions: list[str], dtype: str) -> list[str]:
    """Back to back: each contender's TFLOPS per watt and energy per GEMM, from NVML's energy counter."""
    timed = [r for r in _timed(rows, "back-to-back", dtype) if r.get("tflops_per_w")]
    if not timed:
        return []
    by_key = {(r["version"], _size(r)): r for r in timed}
    names = [_label(v) for v in [*versions, "cublas"]]
    lines = ["**energy, back-to-back**: TFLOPS per watt, and mJ per GEMM (NVML's energy counter over the windows)", "",
             "| class | size | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for size in _class_sizes(timed):
        cells = [f"{float(r['tflops_per_w']):.2f} ({float(r['mj_per_gemm']):.3g} mJ)" if (r := by_key.get((v, size)))
                 else "-" for v in [*versions, "cublas"]]
        lines.append(f"| {shape_class(*_dims(size))} | {size} | " + " | ".join(cells) + " |")
    return lines + [""]


def _single_version_table(rows: list[dict], version: str, dtype: str) -> list[str]:
    """One version in both regimes, with the clock, power and per-clock efficiency of each measurement."""
    lines = ["| class | size | regime | TFLOPS | % of cuBLAS | host µs | SM MHz | W | TFLOPS/GHz (% of peak) | "
             "TB/s (% of copy) | rel. error | schedule chosen |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    by_key = {(r["regime"], _size(r)): r for r in rows if r["version"] == version and r["dtype"] == dtype and r["ms"]}
    for size in _class_sizes(rows):
        for regime in REGIMES:
            row = by_key.get((regime, size))
            if row is None:
                continue
            per_clock = (f"{float(row['tflops_per_ghz']):.1f} ({float(row['pct_of_clock_peak']):.1f}%)"
                         if row["tflops_per_ghz"] else "-")
            bandwidth = (f"{_tb_per_s(row):.2f} ({float(row['pct_of_bandwidth']):.0f}%)"
                         if row["pct_of_bandwidth"] and shape_class(*_dims(size)) == "decode" else "-")
            lines.append(
                f"| {shape_class(*_dims(size))} | {size} | {regime} | {float(row['tflops']):.1f} | "
                f"{float(row['pct_of_cublas']):.1f} | {_number(row['host_us'], 1)} | {_number(row['sm_mhz'], 0)} | "
                f"{_number(row['power_w'], 0)} | {per_clock} | {bandwidth} | {float(row['rel_err']):.1e} | `{row['config']}` |"
            )
    return lines


def peer_from_another_run(rows: list[dict]) -> bool:
    """Whether the peer's rows were timed in another run than the cuBLAS rows beside them.

    A row's % of cuBLAS is against the cuBLAS of its own run, so the cuBLAS time it implies
    (ms x % / 100) is the cuBLAS row's own only when both came from one run.
    """
    cublas = {(r["regime"], _size(r)): float(r["ms"]) for r in rows if r["version"] == "cublas"}
    return any(
        abs(float(r["ms"]) * float(r["pct_of_cublas"]) / 100 / cublas[r["regime"], _size(r)] - 1) > 1e-3
        for r in rows if r["version"] == PEER and (r["regime"], _size(r)) in cublas
    )


def _number(text: str, digits: int) -> str:
    return f"{float(text):.{digits}f}" if text else "-"


def results_table(rows: list[dict], versions: list[str], dtype: str = "fp16") -> str:
    """Markdown tables of the versions' results in one dtype, both regimes, cuBLAS last; one version gets its own detail."""
    rows = [r for r in rows if r["dtype"] == dtype]
    if len(versions) == 1:
        # back to back the GPU may run at its power limit: then the energy of a GEMM, beside cuBLAS's, sets the pace
        energy = _energy_table(rows, versions, dtype)
        lines = [*_single_version_table(rows, versions[0], dtype), *([""] + energy[:-1] if energy else [])]
    else:
        lines = [*_comparison_table(rows, versions, "back-to-back", dtype),
                 *_comparison_table(rows, versions, "burst", dtype), *_energy_table(rows, versions, dtype),
                 *_host_line(rows, versions, dtype)]
        lines.append("Each cell: TFLOPS, or for decode shapes the bytes of A, B and C over the time. Beside it, the % "
                     "of cuBLAS timed in the same run, ± half its spread (max - min of the round's % of cuBLAS). "
                     "The cuBLAS column gives its mean SM clock over its timed windows. For decode it also gives its "
                     "share of a device-to-device copy measured in the same run."
                     + (f" The {STYLE[PEER]['label']} column is from an earlier run than the others (`python plot.py "
                        "--peer` times it beside them): its % is against the cuBLAS of its own run."
                        if PEER in versions and peer_from_another_run(rows) else ""))
    gpus = sorted({r["gpu"] for r in rows})
    dates = sorted({r["date"] for r in rows})
    copy = _copy_tb_per_s(rows)
    lines.append("")
    lines.append(
        f"{', '.join(gpus)}: {dtype} in and out, fp32 accumulate, cuBLAS in {dtype}. {cli.METHOD}"
        + (f" Copy bandwidth: {copy:.2f} TB/s." if copy else "")
        + f" Measured {dates[0]}" + (f" to {dates[-1]}" if len(dates) > 1 else "")
        + f" with tilus {rows[0]['tilus']}, torch {rows[0]['torch']}."
    )
    return "\n".join(lines) + "\n"


def launch_table(rows: list[dict], version: str) -> str:
    """Shape by shape: host µs per call against GPU µs per call, for a version's matmul() and torch.matmul.

    In a program's loop a call costs about the larger of the two: the host's time to issue it
    (``host_us``) or the GPU's time to run it (the burst time). Back-to-back shows which.
    """
    by_key = {(r["version"], r["regime"], _size(r)): r for r in rows if r["dtype"] == "fp16" and r["ms"]}
    lines = [f"| class | size | {version}: host µs | {version}: GPU µs (burst) | {version}: µs per call back to back | "
             "torch.matmul: host µs | cuBLAS: GPU µs (burst) | cuBLAS: µs per call back to back | "
             f"{version} % of cuBLAS, back to back |", "|---|---|---|---|---|---|---|---|---|"]
    for size in _class_sizes(rows):
        cells = []
        for name in (version, "cublas"):
            burst, loop = by_key.get((name, "burst", size)), by_key.get((name, "back-to-back", size))
            if burst is None or loop is None:
                break
            host, gpu_us, loop_us = float(loop["host_us"]), 1000 * float(burst["ms"]), 1000 * float(loop["ms"])
            bound = "**" if host > gpu_us else ""  # the host sets the pace
            cells += [f"{bound}{host:.1f}{bound}", f"{gpu_us:.1f}", f"{loop_us:.1f}"]
        else:
            pct = float(by_key[(version, "back-to-back", size)]["pct_of_cublas"])
            lines.append(f"| {shape_class(*_dims(size))} | {size} | " + " | ".join(cells) + f" | {pct:.1f} |")
    lines += ["", "Bold: the host needs longer to issue a call than the GPU needs to run it, so in a loop the host "
              "sets the pace. From the same runs as the results tables."]
    return "\n".join(lines) + "\n"


def _tile(config: str) -> str:
    """A schedule's tile and ring depth, and v6's decomposition where it is not v5's (swapped operands, stream-K)."""
    fields = dict(item.split("=") for item in config.split())
    return (f"{fields.get('block_m')} x {fields.get('block_n')}"
            + (f", {fields['stages']} stages" if "stages" in fields else "")
            + (f", clusters of {fields['cluster_m']}" if fields.get("cluster_m", "1") != "1" else "")
            + (", A and B swapped" if fields.get("swap_ab") == "True" else "")
            + (", stream-K" if fields.get("stream_k") == "True" else ""))


def trails_table(rows: list[dict], version: str, dtype: str = "fp16") -> str:
    """Every class shape and regime where a version ran slower than the version before it, from the results rows.

    Both are given as % of cuBLAS timed in the same run, with their TFLOPS per GHz of SM
    clock compared (back to back the clock moves from window to window, so a gap there may
    be the clock's, not the kernel's) and the tile and ring depth each version's tuner
    picked, so a reader sees whether the two ran the same schedule. A gap no larger than the
    larger of the two rows' spreads (max - min over the rounds) is not a finding, and is not
    listed.
    """
    previous = f"v{int(version.removeprefix('v')) - 1}"
    by_key = {(r["version"], r["regime"], _size(r)): r for r in rows if r["dtype"] == dtype and r["ms"]}
    lines = [f"| class | size | regime | {previous}: % of cuBLAS | {version}: % of cuBLAS | difference | spread | "
             f"per clock, {version} against {previous} | {previous}: tile, ring | {version}: tile, ring |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for size in _class_sizes(rows):
        for regime in REGIMES:
            before, after = by_key.get((previous, regime, size)), by_key.get((version, regime, size))
            if before is None or after is None:
                continue
            old, new = float(before["pct_of_cublas"]), float(after["pct_of_cublas"])
            spread = max(float(before.get("pct_spread") or 0), float(after.get("pct_spread") or 0))
            if round(new - old, 1) < 0 and old - new > spread:
                per_clock = (f"{100 * (float(after['tflops_per_ghz']) / float(before['tflops_per_ghz']) - 1):+.1f}%"
                             if before["tflops_per_ghz"] and after["tflops_per_ghz"] else "-")
                tiles = (_tile(before["config"]), _tile(after["config"]))
                lines.append(f"| {shape_class(*_dims(size))} | {size} | {regime} | {old:.1f} | {new:.1f} | "
                             f"{new - old:.1f} | {spread:.1f} | {per_clock} | {tiles[0]} | "
                             f"{'the same' if tiles[0] == tiles[1] else tiles[1]} |")
    if len(lines) == 2:
        return (f"{version} is at least as fast as {previous} at every class shape, in both regimes, within the spread "
                "of the two rows.\n")
    return "\n".join(lines) + "\n"


def dtype_table(rows: list[dict], version: str) -> str:
    """A version's % of cuBLAS in fp16 and in bf16 (cuBLAS in the same dtype), shape by shape, both regimes."""
    by_key = {(r["dtype"], r["regime"], _size(r)): r for r in rows if r["version"] == version and r["ms"]}
    lines = [f"| class | size | regime | {version} fp16: % of cuBLAS | {version} bf16: % of cuBLAS | bf16 - fp16 |",
             "|---|---|---|---|---|---|"]
    for size in _class_sizes(rows):
        for regime in REGIMES:
            fp16, bf16 = by_key.get(("fp16", regime, size)), by_key.get(("bf16", regime, size))
            if fp16 and bf16:
                a, b = float(fp16["pct_of_cublas"]), float(bf16["pct_of_cublas"])
                lines.append(f"| {shape_class(*_dims(size))} | {size} | {regime} | {a:.1f} | {b:.1f} | {b - a:+.1f} |")
    dates = sorted({r["date"] for r in rows})
    lines += ["", f"{rows[0]['gpu']}: both dtypes in one run ({', '.join(dates)}), each against cuBLAS in its own "
              f"dtype. {cli.METHOD}"]
    return "\n".join(lines) + "\n"


def _shape(size: str) -> str:
    m, n, k = _dims(size)
    return f"{m}³" if m == n == k else size


def _repeat_pairs(rows: list[dict], again: list[dict]) -> dict[tuple, tuple[dict, dict]]:
    """(version, regime, size) -> (first, second) measurement of one build in one run: the fp16 rows of the main
    CSV and of the repeat CSV measured on the same day (a version measured anew since has no pair)."""
    first = {(r["version"], r["regime"], _size(r)): r for r in rows if r["dtype"] == "fp16" and r["ms"]}
    return {key: (first[key], r) for r in again if r["dtype"] == "fp16" and r["ms"] and r["version"] != "cublas"
            and (key := (r["version"], r["regime"], _size(r))) in first and first[key]["date"] == r["date"]}


def repeatability(rows: list[dict], again: list[dict]) -> dict[tuple[str, str], float]:
    """(shape class, regime) -> the largest gap, in points of % of cuBLAS, between two measurements of one build;
    ('any', regime) the largest over every class measured twice, for the classes that were not.

    Only this repository's versions count: the tables that use it compare versions, and the peer's call
    goes through torch.compile's Python wrapper, whose host cost is not the method's noise.
    """
    gaps: dict[tuple[str, str], float] = {}
    for (version, regime, size), (a, b) in _repeat_pairs(rows, again).items():
        if version == PEER:
            continue
        gap = abs(float(b["pct_of_cublas"]) - float(a["pct_of_cublas"]))
        for cls in (shape_class(*_dims(size)), "any"):
            gaps[cls, regime] = max(gaps.get((cls, regime), 0.0), gap)
    return gaps


def compare_table(rows: list[dict], before: str, after: str, sizes: list[str], dtype: str = "fp16",
                  again: list[dict] = ()) -> str:
    """A version against the one before it at a few shapes, both regimes: a page's before/after table.

    The change's ± is the larger of half the within-run spread of either row and the class's
    repeatability (``repeatability``, from ``again``, the second measurement): a change within
    it is level.
    """
    by_key = {(r["version"], r["regime"], _size(r)): r for r in rows if r["dtype"] == dtype and r["ms"]}
    noise = repeatability(rows, again)
    lines = [f"| shape | regime | {before}: % of cuBLAS | {after}: % of cuBLAS | change | {after}'s tile |",
             "|---|---|---|---|---|---|"]
    for size in ("x".join(map(str, cli.parse_size(s))) for s in sizes):
        cls = shape_class(*_dims(size))
        for regime in REGIMES:
            old, new = by_key.get((before, regime, size)), by_key.get((after, regime, size))
            if old and new:
                a, b = float(old["pct_of_cublas"]), float(new["pct_of_cublas"])
                bound = max(float(old.get("pct_spread") or 0) / 2, float(new.get("pct_spread") or 0) / 2,
                            noise.get((cls, regime), noise.get(("any", regime), 0.0)))
                change = f"{b - a:+.1f} ±{bound:.1f}" + (", level" if abs(b - a) <= bound else "")
                lines.append(f"| {_shape(size)} ({cls}) | {regime} | {a:.1f}% | {b:.1f}% | {change} | "
                             f"{_tile(new['config'])} |")
    gpu_name = rows[0]["gpu"].removeprefix("NVIDIA ") if rows else ""
    dates = sorted({r["date"] for key, r in by_key.items() if key[0] in (before, after)})
    return "\n".join(lines) + (
        f"\n\n{gpu_name}, {dtype}, {', '.join(dates)}; each % against cuBLAS in its own run. ± is the larger of half "
        "the spread over the rounds and the largest gap between two measurements of one build in that class "
        "([repeatability](results.md#repeatability); the largest of any class where this one was not measured "
        "twice): a change within it is level.\n")


def _idea(version: str) -> str:
    """The first line of a version's module docstring, less its "vN: " prefix."""
    docstring = ast.get_docstring(ast.parse((REPO / f"matmul_{version}.py").read_text())) or ""
    return docstring.splitlines()[0].removeprefix(f"{version}: ").rstrip(".") if docstring else ""


def versions_table(rows: list[dict], size: str, dtype: str = "fp16", fp8_rows: list[dict] = ()) -> str:
    """The README's table: each version, its idea and its walkthrough, with one shape's progression in both regimes.

    The fp8 versions' cells come from ``fp8_rows`` (results/<gpu>_fp8.csv): the first scaling each
    runs (v10 per-tensor, v11 block-wise), with its % of the cuBLAS fp8 kernel that adds as it
    does, where that was timed in the same run (``_fp8_pct``).
    """
    size = "x".join(map(str, cli.parse_size(size)))
    by_key = {(r["version"], r["regime"]): r for r in rows if r["dtype"] == dtype and r["ms"] and _size(r) == size}
    fp8_by_key = _fp8_rows(fp8_rows)
    fp8 = {(r["version"], r["regime"]): r for r in fp8_rows if r.get("regime") and _size(r) == size}
    regimes = list(REGIMES)[::-1]  # burst (the kernel alone) first
    lines = [f"| file | idea | {_shape(size)}, " + f" | {_shape(size)}, ".join(regimes) + " | walkthrough |",
             "|---|---|" + "---|" * len(regimes) + "---|"]
    for version in (v.removeprefix("matmul_") for v in versions.lesson()):
        scaling = next((s for s in scaled.SCALINGS if any(name == f"{version} {s}" for name, _ in fp8)), None)
        cells = []
        for regime in regimes:
            if (r := by_key.get((version, regime))):
                cells.append(f"{float(r['tflops']):.0f} TFLOPS ({_pct(r)})")
            elif scaling and (r := fp8.get((f"{version} {scaling}", regime))):
                pct = _fp8_pct(r, fp8_by_key)
                versus = "cuBLAS block-wise" if scaling == "block" else "cuBLAS fast"
                cells.append(f"{float(r['tflops']):.0f} TFLOPS fp8 {_fp8_label(scaling)}"
                             + (f" ({pct} of {versus})" if pct else ""))
            else:
                cells.append("-")
        lines.append(f"| `matmul_{version}.py` | {_idea(version)} | " + " | ".join(cells)
                     + f" | [docs/{version}.md](docs/{version}.md) |")
    cublas = [f"{float(r['tflops']):.0f} TFLOPS, {float(r['sm_mhz']):.0f} MHz" if (r := by_key.get(("cublas", regime)))
              else "-" for regime in regimes]
    lines.append("| cuBLAS | `torch.matmul` | " + " | ".join(cublas) + " | |")
    shown = [r for (name, _), r in [*by_key.items(), *fp8.items()] if name.split()[0] in
             {"cublas", *(v.removeprefix("matmul_") for v in versions.lesson())}]
    dates = sorted({r["date"] for r in shown})
    return "\n".join(lines) + (f"\n\n{rows[0]['gpu']}, {dtype} (v10 and v11: fp8 e4m3 with bf16 C), measured "
                               f"{', '.join(dates)}: % of cuBLAS timed in the same run, ± half the spread over the "
                               "rounds ([how](docs/reference.md#how-the-numbers-are-measured), [every shape](docs/"
                               "results.md)). fp8: % of cuBLAS adding as the kernel does: v10 in the fp8 tensor "
                               "core's accumulator (cuBLAS fast: use_fast_accum=True), v11 promoting into fp32 "
                               "(cuBLAS's default); no % where that one was not timed in the same run.\n")


def repeat_table(rows: list[dict], again: list[dict]) -> str:
    """The same build measured twice in one run: each contender's % of cuBLAS in both measurements, and the largest gap."""
    pairs = _repeat_pairs(rows, again)
    versions = [v for v in _versions(again) if any(key[0] == v for key in pairs)]
    lines = ["| size | regime | " + " | ".join(_label(v) for v in versions) + " |", "|---|---|" + "---|" * len(versions)]
    gaps = {regime: 0.0 for regime in REGIMES}
    peer_gaps = dict(gaps)
    for size in sorted({_size(r) for r in again}, key=_dims):
        for regime in REGIMES:
            cells = []
            for version in versions:
                a, b = pairs.get((version, regime, size), (None, None))
                if a and b:
                    x, y = float(a["pct_of_cublas"]), float(b["pct_of_cublas"])
                    worst = peer_gaps if version == PEER else gaps
                    worst[regime] = max(worst[regime], abs(y - x))
                    cells.append(f"{x:.1f} / {y:.1f}")
                else:
                    cells.append("-")
            lines.append(f"| {size} | {regime} | " + " | ".join(cells) + " |")
    dates = sorted({b["date"] for _, b in pairs.values()})
    lines += ["", f"% of cuBLAS, first / second measurement, {again[0]['gpu']}, fp16, {', '.join(dates)}. The second is "
              "the same build measured again at the end of the run, by the same method. A version measured anew "
              "since, at a size, has no pair there. Largest difference between two measurements of a version: "
              + ", ".join(f"{regime} {gap:.1f} points" for regime, gap in gaps.items())
              + (f"; of {_label(PEER)}: " + ", ".join(f"{regime} {gap:.1f} points" for regime, gap in peer_gaps.items())
                 if PEER in versions else "") + "."]
    return "\n".join(lines) + "\n"


def model_table(rows: list[dict], run: str = "v9") -> str:
    """model_llama.py's rows of one run (its --version): tokens per second of the model on cuBLAS and on a version,
    each scenario and mode; an fp8 run's table is ``fp8_model_table``'s."""
    rows = [r for r in rows if r.get("run", "v9") == run]  # rows from before the run column are v9's
    if not rows:
        # model_llama's run_name: 'v11-fused-gated' is --quantizer fused --gated, 'v11-o_proj=fused' --quantizer o_proj=fused
        version, *flags = run.split("-")
        options = "".join(f" --quantizer {f}" if f == "fused" or "=" in f else f" --{f}" for f in flags)
        return f"Not measured yet: `python model_llama.py --version {version}{options}` measures it.\n"
    if any("fp8" in r["backend"] for r in rows):
        return fp8_model_table(rows)
    versions = sorted({r["backend"] for r in rows} - {"cublas"})
    by_key = {(r["backend"], r["scenario"], r["mode"]): r for r in rows}
    lines = ["| scenario | mode | cuBLAS: tokens/s | " + " | ".join(f"{v}: tokens/s (% of cuBLAS)" for v in versions)
             + " | share of GPU time in GEMMs (eager) |", "|---|---|---|" + "---|" * len(versions) + "---|"]
    for scenario, mode in dict.fromkeys((r["scenario"], r["mode"]) for r in rows):
        cublas = by_key.get(("cublas", scenario, mode))
        cells = [f"{float(r['tokens_per_s']):,.0f} ({float(r['pct_of_cublas']):.1f}% ±{float(r['pct_spread']) / 2:.1f})"
                 if (r := by_key.get((v, scenario, mode))) else "-" for v in versions]
        shares = " / ".join(f"{100 * float(r['gemm_share']):.0f}%" for v in ["cublas", *versions]
                            if (r := by_key.get((v, scenario, mode))) and r["gemm_share"]) or "-"
        lines.append(f"| {scenario} | {mode} | {float(cublas['tokens_per_s']):,.0f} | " + " | ".join(cells)
                     + f" | {shares} |")
    first, version = rows[0], next(r for r in rows if r["backend"] != "cublas")
    lines += ["", f"{first['model']} (random bf16 weights), {first['gpu']}, {first['date']}, torch {first['torch']}, "
              f"transformers {first['transformers']}: median of 3 windows per backend, backends in a fresh random order "
              "each round, ± half the spread; GEMM share cuBLAS / version. Logits against the cuBLAS model: relative "
              f"error {float(version['logits_rel_err']):.1e}, the same next token at "
              f"{100 * float(version['top1_agree']):.0f}% of positions; graph breaks under torch.compile(fullgraph=True): "
              f"{sum(int(r['graph_breaks'] or 0) for r in rows)}."]
    return "\n".join(lines) + "\n"


def fp8_model_table(rows: list[dict]) -> str:
    """An fp8 run of model_llama.py: the bf16 model on cuBLAS, the fp8 model on a version's op and on
    torch._scaled_mm (the peer), tokens per second in each scenario and mode."""
    fp8 = next(r["backend"] for r in rows if "fp8" in r["backend"] and "scaled_mm" not in r["backend"])
    peer = next((r["backend"] for r in rows if "scaled_mm" in r["backend"]), None)
    backends = [fp8] + ([peer] if peer else [])
    by_key = {(r["backend"], r["scenario"], r["mode"]): r for r in rows}
    lines = ["| scenario | mode | bf16 cuBLAS: tokens/s | " + " | ".join(f"{b}: tokens/s (% of bf16)" for b in backends)
             + (f" | {fp8.split()[0]} / scaled_mm" if peer else "") + " | share of GPU time in GEMMs (eager) |",
             "|---|---|---|" + "---|" * len(backends) + ("---|" if peer else "") + "---|"]
    for scenario, mode in dict.fromkeys((r["scenario"], r["mode"]) for r in rows):
        cublas = by_key.get(("cublas", scenario, mode))
        cells = [f"{float(r['tokens_per_s']):,.0f} ({float(r['pct_of_cublas']):.1f}% ±{float(r['pct_spread']) / 2:.1f})"
                 if (r := by_key.get((b, scenario, mode))) else "-" for b in backends]
        if peer:
            mine, theirs = by_key.get((fp8, scenario, mode)), by_key.get((peer, scenario, mode))
            cells.append(f"{float(mine['tokens_per_s']) / float(theirs['tokens_per_s']):.2f}x" if mine and theirs
                         else "-")
        shares = " / ".join(f"{100 * float(r['gemm_share']):.0f}%" for b in ["cublas", *backends]
                            if (r := by_key.get((b, scenario, mode))) and r["gemm_share"]) or "-"
        lines.append(f"| {scenario} | {mode} | {float(cublas['tokens_per_s']):,.0f} | " + " | ".join(cells)
                     + f" | {shares} |")
    first = rows[0]
    errors = "; ".join(f"{b} {float(r['logits_rel_err']):.1e}, the same next token at {100 * float(r['top1_agree']):.1f}%"
                       for b in backends if (r := next((r for r in rows if r["backend"] == b), None)))
    lines += ["", f"{first['model']} (random bf16 weights), {first['gpu']}, {first['date']}, torch {first['torch']}, "
              f"transformers {first['transformers']}: median of 3 windows per backend, backends in a fresh random order "
              "each round, ± half the spread; GEMM share bf16 cuBLAS / " + " / ".join(backends) + ". The LM head "
              "stays bf16 in every model. Logits against the bf16 model, relative Frobenius error: " + errors
              + f". Graph breaks under torch.compile(fullgraph=True): {sum(int(r['graph_breaks'] or 0) for r in rows)}."]
    return "\n".join(lines) + "\n"


def quant_table(rows: list[dict]) -> str:
    """model_llama.py --quant's rows: the activation quantizer's time at prefill shapes in both regimes, against a
    copy's bandwidth and against the GEMM it feeds."""
    if not rows:
        return "Not measured yet: `python model_llama.py --version v11 --quant` measures it.\n"
    lines = ["| quantizer | M x K | GEMM (M x N x K) | regime | quantizer µs | % of copy bandwidth | copy of x µs | % of a "
             "copy of x's bandwidth | GEMM µs | quantizer / GEMM | host µs, eager |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    fused = [r for r in rows if r.get("regime") == "in the model, fused"]
    as_run = [r for r in rows if r.get("regime", "").startswith("in the model as run")]
    for r in rows:
        m, k = int(r["m"]), int(r["k"])
        if r in fused or r in as_run:
            # what it adds to the kernels before the GEMMs that x feeds, against those GEMMs
            lines.append(f"| {r['granularity']} ({r['version']}){', fused' if r in fused else ''} | {m} x {k} | "
                         f"{m}x{r['n']}x{k} "
                         f"({r['linears']}) | {r['regime']} | {1e3 * float(r['quant_ms']):.1f} "
                         f"±{float(r['quant_spread_us']) / 2:.1f} µs | - | - | - | {1e3 * float(r['gemm_ms']):.1f} | "
                         f"{float(r['pct_of_gemm']):.1f}% | - |")
            continue
        copy = "- | -"  # in the model: no copy of x runs there
        if r["copy_ms"]:
            # a copy of x moves 4 bytes an element (2 read, 2 written) in copy_ms: the bandwidth a copy reaches here
            copy_tb_s = 4 * m * k / (float(r["copy_ms"]) * 1e-3) / 1e12
            copy = f"{1e3 * float(r['copy_ms']):.1f} | {100 * float(r['quant_tb_s']) / copy_tb_s:.1f}%"
        spread = f" ±{float(r['quant_spread_pct']) / 2:.1f}%" if r.get("quant_spread_pct") else ""
        lines.append(f"| {r['granularity']} ({r['version']}) | {m} x {k} | {m}x{r['n']}x{k} | "
                     f"{r.get('regime') or 'burst'} | {1e3 * float(r['quant_ms']):.1f}{spread} | "
                     f"{float(r['pct_of_bandwidth']):.1f}% | {copy} | {1e3 * float(r['gemm_ms']):.1f} | "
                     f"{float(r['pct_of_gemm']):.1f}% | {r.get('host_us') or '-'} |")
    first = next((r for r in rows if r not in fused + as_run), rows[0])
    in_model = ("In the model: one prefill of 1 x 2048 tokens of the compiled fp8 Llama, kernel times from "
                "torch.profiler, the median over the layers ± half their spread: the o projection's quantizer and GEMM "
                "at 2048x4096x4096, gate's at 2048x14336x4096, down's at 2048x4096x14336. There x was just written by "
                "the op before (attention, the norm, SiLU(gate) x up), and part of it is still in L2. "
                if any(r.get("regime") == "in the model" for r in rows) else "")
    in_model += ("Fused (quantizer='fused'): the same arithmetic in torch, which Inductor joins to the op that writes "
                 "x; it has no kernel of its own. Its µs: what it adds to that op, the kernels before those GEMMs in "
                 "its prefill less the same in the kernel quantizer's prefill without quantize.py's kernels, the "
                 "median over the layers ± half their spread. Its GEMMs: every one that op's x feeds. "
                 if fused else "")
    in_model += ("As run: the compiled fp8 model as model_llama.py times it (quantizers shared, each Linear's own, "
                 "gated MLPs where the regime says so). Its µs: the kernels before each group's GEMMs less those "
                 "before the same GEMMs in the bf16 model's prefill, the median over the layers ± half their spread: "
                 "what quantizing adds to the model (a gated down projection's quantizer: what it adds to SiLU x up). "
                 if as_run else "")
    worst = max(float(r["x8_mismatch"]) for r in rows)
    gib_copy_tb_s = float(first["quant_tb_s"]) / (float(first["pct_of_bandwidth"]) / 100)
    lines += ["", f"{first['gpu']}, {first['date']}, torch {first['torch']}. Burst: each launch alone, L2 flushed, "
              "median of the burst's runs. Back to back: as a compiled model runs them, each captured in a CUDA graph "
              "of calls over inputs (and weights) rotated past L2, each call writing outputs of its own, replayed in "
              "~1-s windows, the three in a fresh random order each of 3 rounds, after 2 s of load: the median, ± half "
              "the quantizer's spread over the rounds. The GEMM and the copy of x are timed the same way as the "
              f"quantizer in each row. {in_model}Host µs: the CPU time of one eager call of the quantizer's entry "
              "point, queued with no sync. Bytes: the bf16 input read (2 an element), the e4m3 output (1) and the "
              "float32 scales written. Copy bandwidth: a 1-GiB device-to-device copy's in the same run, "
              f"{gib_copy_tb_s:.2f} TB/s (bytes read and written); a copy of x moves 4 bytes an element. Largest "
              f"share of e4m3 values unlike scaled.quantize's: {worst:.1e}; largest relative difference of a scale "
              f"from its: {max(float(r.get('scale_max_rel_diff') or 0) for r in rows):.1e}."]
    return "\n".join(lines) + "\n"


def model_block(csv_dir: Path, slug: str, args: list[str]) -> str:
    """<!-- model <slug> [run | quant] -->: a run's model table, or the activation quantizer's."""
    if args and args[0] == "quant":
        path = csv_dir / f"{slug}_quant.csv"
        return quant_table(cli.read_csv(path) if path.exists() else [])
    return model_table(cli.read_csv(csv_dir / f"{slug}_model.csv"), args[0] if args else "v9")


def _fp8_rows(rows: list[dict]) -> dict[tuple, dict]:
    """results/<gpu>_fp8.csv's timed rows by (contender, regime, M, N, K)."""
    return {(r["version"], r["regime"], int(r["m"]), int(r["n"]), int(r["k"])): r for r in rows if r.get("regime")}


def _fp8_kernel(rows, scaling: str, promoted: bool = False) -> str:
    """The contender name of the version that runs a scaling, from the rows ('v10 tensor', 'v11 block', with
    ``promoted`` 'v11 tensor promoted'): the earliest version with such rows."""
    pattern = re.compile(rf"v(\d+) {scaling}" + (" promoted" if promoted and scaling != "block" else ""))
    found = sorted({r["version"] for r in rows if pattern.fullmatch(r["version"])},
                   key=lambda name: int(name[1:].split()[0]))
    return found[0] if found else f"v? {scaling}"


def _fp8_pct(r: dict, by_key: dict) -> str:
    """A row's % of the contender that adds as it does (``scaled.versus_of``), with half the spread: '95.5% ±1.0';
    '' where that contender has no row of the same size, regime and date (a row from before the fast contenders
    were timed, or a shape where torch takes no such scales), and for a cuBLAS row itself."""
    size = (int(r["m"]), int(r["n"]), int(r["k"]))
    names = {key[0] for key in by_key if key[1] == r["regime"] and key[2:] == size}
    versus = scaled.versus_of(r["version"], names)
    other = by_key.get((versus, r["regime"], *size)) if versus and versus != r["version"] else None
    if other is None or other["date"] != r["date"] or not r.get("pct_of_cublas"):
        return ""
    return _pct(r)


def _fp8_cell(by_key: dict, name: str, regime: str, size: tuple) -> str:
    """A contender's TFLOPS at a size and regime, with its % of the cuBLAS that adds alike; "-" where not measured."""
    r = by_key.get((name, regime, *size))
    if r is None:
        return "-"
    pct = _fp8_pct(r, by_key)
    return f"{float(r['tflops']):,.0f}" + (f" ({pct})" if pct else "")


def _fp8_label(scaling: str) -> str:
    return {"tensor": "per-tensor", "row": "row-wise", "block": "block-wise"}[scaling]


FP8_INPUTS = ("Inputs: random normal bf16, quantized per tensor, per row, or in 1 x 128 (A) and 128 x 128 (B) blocks; "
              "C bf16. Burst and back to back as in docs/reference.md.")
FP8_VERSUS = ("Each % is of cuBLAS (torch._scaled_mm) with the same scaling, adding as the kernel does: per-tensor and "
              "row-wise with use_fast_accum=True (cuBLAS fast), block-wise its default (both promote). ± is half the "
              "spread over the rounds. No % where that cuBLAS was not timed in the same run.")


def fp8_table(rows: list[dict], decode: bool) -> str:
    """The fp8 versions' rows (matmul_v10.py, matmul_v11.py): each scaling against torch._scaled_mm adding alike, and
    the 16-bit version and cuBLAS in bf16.

    Large shapes in TFLOPS, decode shapes (M <= 64) in % of the copy bandwidth; each fp8 cell
    also gives its % of cuBLAS adding alike (``_fp8_pct``) where that was timed in its run.
    """
    by_key = _fp8_rows(rows)
    sizes = sorted({key[2:] for key in by_key if (key[2] <= 64) == decode}, key=lambda s: (s[0] * s[1] * s[2], s))
    value = (lambda r: f"{float(r['pct_of_bandwidth']):.0f}%") if decode else (lambda r: f"{float(r['tflops']):,.0f}")

    def cell(name, regime, size, versus=False):
        r = by_key.get((name, regime, *size))
        if r is None:
            return "-"
        pct = _fp8_pct(r, by_key) if versus else ""
        return value(r) + (f" ({pct})" if pct else "")

    unit = "% of copy bandwidth" if decode else "TFLOPS"
    bf16 = next((r["version"] for r in rows if r["dtype"] == "bf16" and r["version"] != "cublas"), "v?")
    names = {s: _fp8_kernel(rows, s) for s in scaled.SCALINGS}
    tensor = names["tensor"]
    cublas = {s: scaled.cublas_name(s, "promoted" if s == "block" else "fast") for s in scaled.SCALINGS}
    lines = [f"| size | regime | bf16: cuBLAS / {bf16} | " + " | ".join(
                 f"{_fp8_label(s)}: cuBLAS{' fast' if s != 'block' else ''} / {names[s].split()[0]}"
                 for s in scaled.SCALINGS) + f" | {tensor.split()[0]} per-tensor / {bf16} speed |",
             "|---|---|---|---|---|---|---|"]
    for size in sizes:
        for regime in ("burst", "back-to-back"):
            old, new = by_key.get((bf16, regime, *size)), by_key.get((tensor, regime, *size))
            speedup = f"{float(old['ms']) / float(new['ms']):.2f}x" if old and new else "-"
            lines.append(f"| {'x'.join(map(str, size))} | {regime} | {cell('cublas', regime, size)} / "
                         f"{cell(bf16, regime, size)} | " + " | ".join(
                             f"{cell(cublas[s], regime, size)} / {cell(names[s], regime, size, True)}"
                             for s in scaled.SCALINGS) + f" | {speedup} |")
    dates = sorted({r["date"] for r in rows})
    first = rows[0]
    lines += ["", f"{first['gpu']}, {', '.join(dates)}, tilus {first['tilus']}, torch {first['torch']}: {unit}. "
              f"{FP8_VERSUS} {FP8_INPUTS}"]
    return "\n".join(lines) + "\n"


def fp8_blockwise_table(rows: list[dict]) -> str:
    """The block-wise kernel (v11) against cuBLAS's block-wise and the fast per-tensor kernel (v10), at every size:
    TFLOPS (% of the copy bandwidth at decode), and block-wise's speed over per-tensor's."""
    by_key = _fp8_rows(rows)
    block, tensor = _fp8_kernel(rows, "block"), _fp8_kernel(rows, "tensor")
    sizes = sorted({key[2:] for key in by_key if key[0] == block}, key=lambda s: (s[0] > 64, s[0] * s[1] * s[2], s))

    def value(r):
        return f"{float(r['pct_of_bandwidth']):.0f}% of copy" if int(r["m"]) <= 64 else f"{float(r['tflops']):,.0f}"

    lines = [f"| size | regime | cuBLAS block-wise | {block} (% of cuBLAS block-wise) | {tensor} (fast) | "
             f"{block.split()[0]} / {tensor.split()[0]} speed |", "|---|---|---|---|---|---|"]
    for size in sizes:
        for regime in ("burst", "back-to-back"):
            ours, cublas, per_tensor = (by_key.get((name, regime, *size)) for name in (block, "cublas fp8 block", tensor))
            if ours is None:
                continue
            pct = _fp8_pct(ours, by_key)
            speed = f"{float(per_tensor['ms']) / float(ours['ms']):.2f}" if per_tensor else "-"
            lines.append(f"| {'x'.join(map(str, size))} | {regime} | {value(cublas) if cublas else '-'} | "
                         f"{value(ours)}{f' ({pct})' if pct else ''} | {value(per_tensor) if per_tensor else '-'} | "
                         f"{speed} |")
    first = rows[0]
    lines += ["", f"{first['gpu']}, {', '.join(sorted({r['date'] for r in rows}))}: TFLOPS, or % of the copy bandwidth "
              "at decode (M <= 64). cuBLAS is torch._scaled_mm with the same 1 x 128 and 128 x 128 scales, which "
              "promotes as v11 does; - where torch takes none at that shape. ± is half the spread over the rounds."]
    return "\n".join(lines) + "\n"


def fp8_accumulation_table(rows: list[dict], sizes: list[str] | None = None) -> str:
    """Per-tensor and row-wise scales both ways, at the large shapes (or ``sizes``): the fast kernel (v10) against
    cuBLAS fast, the promoting one (v11's accumulate="promoted") against cuBLAS's default, what promoting costs each
    in time, and each one's error."""
    by_key = _fp8_rows(rows)
    promoted = {s: _fp8_kernel(rows, s, promoted=True) for s in ("tensor", "row")}
    fast = {s: _fp8_kernel(rows, s) for s in ("tensor", "row")}
    wanted = {cli.parse_size(size) for size in sizes} if sizes else None
    shown = sorted({key[2:] for key in by_key if key[0] in promoted.values() and key[2] > 64
                    and (wanted is None or key[2:] in wanted)}, key=lambda s: (s[0] * s[1] * s[2], s))
    if not shown:
        return "Not measured yet: `python matmul_v11.py --full` measures it.\n"

    def cost(slow, quick, regime, size):
        a, b = by_key.get((slow, regime, *size)), by_key.get((quick, regime, *size))
        return f"{float(a['ms']) / float(b['ms']):.2f}x" if a and b and a["date"] == b["date"] else "-"

    def error(name, regime, size):
        r = by_key.get((name, regime, *size))
        return f"{float(r['rel_err']):.2e}" if r and r.get("rel_err") else "-"

    ours_fast, ours_promoted = fast["tensor"].split()[0], promoted["tensor"].split()[0]
    lines = [f"| size | scaling | regime | fast: cuBLAS fast / {ours_fast} | promoted: cuBLAS / {ours_promoted} | "
             f"time, promoted over fast: cuBLAS / ours | error, fast: cuBLAS / {ours_fast} | error, promoted: "
             f"cuBLAS / {ours_promoted} |", "|---|---|---|---|---|---|---|---|"]
    for size in shown:
        for s in ("tensor", "row"):
            quick, slow = scaled.cublas_name(s, "fast"), scaled.cublas_name(s, "promoted")
            for regime in ("burst", "back-to-back"):
                lines.append(f"| {'x'.join(map(str, size))} | {_fp8_label(s)} | {regime} | "
                             f"{_fp8_cell(by_key, quick, regime, size)} / {_fp8_cell(by_key, fast[s], regime, size)} | "
                             f"{_fp8_cell(by_key, slow, regime, size)} / {_fp8_cell(by_key, promoted[s], regime, size)} | "
                             f"{cost(slow, quick, regime, size)} / {cost(promoted[s], fast[s], regime, size)} | "
                             f"{error(quick, regime, size)} / {error(fast[s], regime, size)} | "
                             f"{error(slow, regime, size)} / {error(promoted[s], regime, size)} |")
    first = rows[0]
    lines += ["", f"{first['gpu']}, {', '.join(sorted({r['date'] for r in rows}))}: TFLOPS. Fast: each sum over all "
              "of K in the fp8 wgmma's accumulator (torch._scaled_mm's use_fast_accum=True). Promoted: each K block's "
              "sum added into fp32 (its default). Each % is of cuBLAS adding alike, ± half the spread over the "
              "rounds. Time: promoted ms over fast ms, same run. Error: the worst 64 x 64 tile's relative error against the "
              f"fp32 product of the dequantized inputs; rounding C to bf16 alone gives "
              f"{measure.rounding_error(torch.bfloat16):.2e}."]
    return "\n".join(lines) + "\n"


def fp8_peer_table(rows: list[dict]) -> str:
    """The Triton kernels torch.compile makes of torch._scaled_mm(..., use_fast_accum=True) (``matmul_v10.py --peer``)
    beside cuBLAS and v10, all adding in the fp8 wgmma's accumulator."""
    by_key = _fp8_rows(rows)
    sizes = sorted({key[2:] for key in by_key if key[0].startswith("triton") and key[0].endswith("fast")},
                   key=lambda s: (s[0] * s[1] * s[2], s))
    if not sizes:
        version = _fp8_kernel(rows, "tensor").split()[0]
        script = f"`python matmul_{version}.py --peer`" if version != "v?" else "the fp8 version's script with --peer"
        return f"Not measured yet: {script} measures it.\n"

    names = {s: _fp8_kernel(rows, s) for s in ("tensor", "row")}
    version = names["tensor"].split()[0]
    lines = [f"| size | regime | per-tensor: Triton / {version} | row-wise: Triton / {version} |", "|---|---|---|---|"]
    for size in sizes:
        for regime in ("burst", "back-to-back"):
            lines.append(f"| {'x'.join(map(str, size))} | {regime} | " + " | ".join(
                f"{_fp8_cell(by_key, f'triton fp8 {s} fast', regime, size)} / {_fp8_cell(by_key, names[s], regime, size)}"
                for s in ("tensor", "row")) + " |")
    first = next(r for key, r in by_key.items() if key[0].startswith("triton"))
    lines += ["", f"{first['gpu']}, {first['date']}, torch {first['torch']}: TFLOPS (% of cuBLAS fast with the same "
              "scaling, same run); Triton: torch.compile of the same torch._scaled_mm(..., use_fast_accum=True) call, "
              "max-autotune-no-cudagraphs, Inductor's Triton templates only (support/bench.py, compile_peer)."]
    return "\n".join(lines) + "\n"


def fp8_errors_table(rows: list[dict]) -> str:
    """Each scaling's relative error against the fp32 product of its dequantized inputs, by K (the large shapes),
    for each accumulation: the fast kernel and cuBLAS fast, the promoting kernel and cuBLAS's default."""
    errors = {(r["version"], int(r["m"]), int(r["n"]), int(r["k"])): float(r["rel_err"]) for r in rows if r["rel_err"]}
    sizes = sorted({key[1:] for key in errors if key[1] > 64}, key=lambda s: (s[2], s))
    fast = {s: _fp8_kernel(rows, s) for s in ("tensor", "row")}
    promoted = {s: _fp8_kernel(rows, s, promoted=True) for s in scaled.SCALINGS}

    def error(name, size):
        return f"{errors[(name, *size)]:.2e}" if (name, *size) in errors else "-"

    lines = [f"| size | K | scaling | fast: {fast['tensor'].split()[0]} / cuBLAS fast | "
             f"promoted: {promoted['block'].split()[0]} / cuBLAS |", "|---|---|---|---|---|"]
    for size in sizes:
        for s in scaled.SCALINGS:
            if not any((name, *size) in errors for name in (fast.get(s), promoted[s], scaled.cublas_name(s, "fast"),
                                                             scaled.cublas_name(s, "promoted"))):
                continue
            quick = f"{error(fast[s], size)} / {error(scaled.cublas_name(s, 'fast'), size)}" if s in fast else "-"
            lines.append(f"| {'x'.join(map(str, size))} | {size[2]:,} | {_fp8_label(s)} | {quick} | "
                         f"{error(promoted[s], size)} / {error(scaled.cublas_name(s, 'promoted'), size)} |")
    first = rows[0]
    lines += ["", f"{first['gpu']}, {', '.join(sorted({r['date'] for r in rows}))}: the worst 64 x 64 tile's "
              "relative error of C (bf16, measure.relative_error) against the fp32 product of the same dequantized "
              "inputs; rounding C to bf16 alone gives "
              f"{measure.rounding_error(torch.bfloat16):.2e} (measure.rounding_error). Block-wise scales are always "
              "promoted."]
    return "\n".join(lines) + "\n"


def update_documents(csv_dir: Path = cli.RESULTS_DIR, documents: list[Path] = DOCUMENTS) -> list[Path]:
    """Rewrite each table block from results/<gpu>.csv (and <gpu>_repeat.csv); return the documents that changed."""
    changed = []
    for document in documents:
        text = document.read_text()

        def render(match):
            kind, slug, args = match.group(2), match.group(3), match.group(4).split()
            rows = read_rows(csv_dir / f"{slug}.csv") if kind not in ("model", "fp8") else []
            dtype = args[1] if len(args) > 1 and args[1] in cli.DTYPE_NAMES else "fp16"
            first = args[0].split(",") if args else []
            table = {"results": lambda: results_table(rows, first, dtype),
                     "launch": lambda: launch_table(rows, first[0]), "dtypes": lambda: dtype_table(rows, first[0]),
                     "trails": lambda: trails_table(rows, first[0], dtype),
                     "compare": lambda: compare_table(rows, *first, args[1].split(","), "fp16", read_rows(again)
                                                      if (again := csv_dir / f"{slug}_repeat.csv").exists() else []),
                     "versions": lambda: versions_table(rows, first[0], "fp16", cli.read_csv(fp8)
                                                        if (fp8 := csv_dir / f"{slug}_fp8.csv").exists() else []),
                     "model": lambda: model_block(csv_dir, slug, args),
                     "fp8": lambda: {"errors": fp8_errors_table, "peer": fp8_peer_table, "blockwise": fp8_blockwise_table,
                                     "accumulation": lambda r: fp8_accumulation_table(
                                         r, args[1].split(",") if len(args) > 1 else None),
                                     "large": lambda r: fp8_table(r, False), "decode": lambda r: fp8_table(r, True)}[
                         first[0]](cli.read_csv(csv_dir / f"{slug}_fp8.csv")),
                     "repeat": lambda: repeat_table(rows, read_rows(again)) if (again := csv_dir / f"{slug}_repeat.csv")
                     .exists() else "Not measured yet: `python plot.py` measures it at the end of a run.\n"}[kind]()
            return match.group(1) + table + match.group(6)

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


def _value(row: dict) -> float:
    """What a bar shows: TB/s for decode shapes, TFLOPS otherwise."""
    return _tb_per_s(row) if shape_class(*_dims(_size(row))) == "decode" else float(row["tflops"])


def _top(rows: list[dict], slug: str, decode: bool = False) -> float:
    """The y-axis top: room above the ceiling line and the fastest measurement."""
    ceiling = (_copy_tb_per_s(rows) or 0) if decode else PEAK_TFLOPS.get(slug, 0)
    return max(ceiling, *(_value(r) for r in rows)) * 1.12


def _ceiling_line(ax, rows: list[dict], slug: str, decode: bool) -> None:
    """The dense fp16 peak (datasheet), or for decode the copy bandwidth measured in the same run."""
    ceiling = _copy_tb_per_s(rows) if decode else PEAK_TFLOPS.get(slug)
    if ceiling:
        text = (f" device-to-device copy (same run): {ceiling:.2f} TB/s" if decode
                else f" dense fp16 peak (datasheet): {ceiling:.0f}")
        ax.axhline(ceiling, color="black", linestyle="--", linewidth=0.8)
        ax.text(ax.get_xlim()[0], ceiling, text, fontsize=6, va="bottom")


def _bars(ax, rows: list[dict], sizes: list[str], slug: str) -> None:
    versions = _versions(rows)
    by_key = {(r["version"], _size(r)): r for r in rows}
    width = 0.8 / len(versions)
    decode = all(shape_class(*_dims(size)) == "decode" for size in sizes)
    for i, version in enumerate(versions):
        xs, heights, labels = [], [], []
        for j, size in enumerate(sizes):
            row = by_key.get((version, size))
            if row is not None:
                xs.append(j + (i - (len(versions) - 1) / 2) * width)
                heights.append(_value(row))
                labels.append("" if version == "cublas" else f"{float(row['pct_of_cublas']):.0f}%")
        bars = ax.bar(xs, heights, width, label=_label(version), color=STYLE.get(version, {}).get("color"))
        ax.bar_label(bars, labels=labels, fontsize=5, padding=2)
    ax.set_xticks(range(len(sizes)), sizes, fontsize=6)
    ax.set_ylabel("TB/s (A, B and C over the time)" if decode else "TFLOPS", fontsize=7)
    ax.tick_params(axis="y", labelsize=6)
    ax.set_ylim(0, _top([r for r in rows if _size(r) in sizes], slug, decode))
    _ceiling_line(ax, rows, slug, decode)


def plot(rows: list[dict], slug: str, out_dir: Path = FIGURES) -> list[Path]:
    """perf_<slug>: every class shape (both regimes); sizes_<slug>: square sizes; classes_<slug>: a panel per class,
    and classes_bf16_<slug> for bf16 where measured."""
    bf16 = [r for r in rows if r["dtype"] == "bf16" and r["ms"]]
    rows = [r for r in rows if r["dtype"] == "fp16" and r["ms"]]
    gpu_name = rows[0]["gpu"]
    plt.rcParams["svg.hashsalt"] = "tilus-gemm-tutorial"
    regimes = [regime for regime in REGIMES if any(r["regime"] == regime for r in rows)]
    paths = []

    sizes = [size for size in _class_sizes(rows) if shape_class(*_dims(size)) != "decode"]
    fig, axes = plt.subplots(len(regimes), 1, figsize=(max(8, 1.4 * len(sizes)), 3.6 * len(regimes)), squeeze=False)
    for ax, regime in zip(axes[:, 0], regimes):
        _bars(ax, _timed(rows, regime), sizes, slug)
        ax.set_xticks(range(len(sizes)), [f"{size}\n{shape_class(*_dims(size))}" for size in sizes], fontsize=7)
        ax.set_title(f"{regime}: {REGIMES[regime]} (labels: % of cuBLAS, same run)", fontsize=8)
    axes[-1][0].legend(fontsize=8, ncol=len(_versions(rows)), loc="upper center", bbox_to_anchor=(0.5, -0.2),
                       frameon=False)
    fig.suptitle(f"fp16 GEMM C = A @ B.T on {gpu_name}: each version, the peer and cuBLAS", fontsize=9)
    paths += _save(fig, out_dir, f"perf_{slug}")

    fig, axes = plt.subplots(1, len(regimes), figsize=(6 * len(regimes), 4), squeeze=False)
    for ax, regime in zip(axes[0], regimes):
        timed = [r for r in _timed(rows, regime) if r["m"] == r["n"] == r["k"]]
        squares = sorted({int(r["m"]) for r in timed})
        by_key = {(r["version"], int(r["m"])): r for r in timed}
        for version in _versions(timed):
            points = [(n, float(by_key[version, n]["tflops"])) for n in squares if (version, n) in by_key]
            style = STYLE.get(version, {})
            ax.plot([n for n, _ in points], [t for _, t in points], marker="o", markersize=3, label=_label(version),
                    color=style.get("color"), linewidth=2 if version in STYLE else 1.2)
        ax.set_xscale("log", base=2)
        ax.set_xticks(squares, [str(n) for n in squares], fontsize=7)
        ax.set_xlabel("M = N = K", fontsize=8)
        ax.set_ylabel("TFLOPS", fontsize=8)
        ax.set_ylim(0, _top(timed, slug))
        _ceiling_line(ax, timed, slug, decode=False)
        ax.set_title(f"{regime}", fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"Square fp16 GEMMs on {gpu_name}", fontsize=9)
    paths += _save(fig, out_dir, f"sizes_{slug}")

    paths += _classes_figure(rows, slug, out_dir, "fp16")
    if bf16:
        paths += _classes_figure(bf16, slug, out_dir, "bf16")
    return paths


def _classes_figure(rows: list[dict], slug: str, out_dir: Path, dtype: str) -> list[Path]:
    """A panel per compute-bound class, decode below against the copy bandwidth; back-to-back where measured."""
    sizes = _class_sizes(rows)
    timed = _timed(rows, "back-to-back", dtype) or _timed(rows, "burst", dtype)
    classes = [c for c in CLASS_ORDER if c != "decode" and any(shape_class(*_dims(size)) == c for size in sizes)]
    decode = [size for size in sizes if shape_class(*_dims(size)) == "decode"]
    fig = plt.figure(figsize=(3.6 * max(len(classes), 3), 3.6 * (1 + bool(decode))))
    grid = fig.add_gridspec(1 + bool(decode), max(len(classes), 1))
    for column, name in enumerate(classes):
        ax = fig.add_subplot(grid[0, column])
        _bars(ax, timed, [size for size in sizes if shape_class(*_dims(size)) == name], slug)
        ax.set_title(name, fontsize=9)
        if column == 0:
            ax.legend(fontsize=6, loc="lower left")
    if decode:
        ax = fig.add_subplot(grid[1, :])
        _bars(ax, timed, decode, slug)
        ax.set_title("decode (memory-bound: bytes of A, B and C over the time, against a copy)", fontsize=9)
    fig.suptitle(f"{dtype} GEMM, each shape class on {timed[0]['gpu']}, {timed[0]['regime']} (labels: % of cuBLAS "
                 f"in {dtype}, same run)", fontsize=9)
    return _save(fig, out_dir, "classes_" + ("" if dtype == "fp16" else f"{dtype}_") + slug)


def peer_contender(m: int, n: int, k: int) -> Contender:
    """The Triton GEMM torch.compile reaches for this shape (compiled and autotuned on its first call)."""
    print(f"{PEER} peer at {m}x{n}x{k}: torch.compile autotunes its Triton templates on the first call...", flush=True)
    compiled = bench.compile_peer(lambda x, y: x @ y.T)
    return Contender(PEER, lambda a, b, out: compiled(a, b), PEER_CONFIG)


def benchmark(sizes: list[str], peer: bool, dtype: str = "fp16", names: list[str] | None = None,
              out: Path | None = None, repeat: int = 50) -> Path:
    """Time the versions (all, or ``names``), the peer if asked, and cuBLAS at each size in both regimes, in
    one dtype; rows to results/<gpu>.csv (or ``out``)."""
    versions, arch = {}, gpu.gpu_arch()
    for name in versions_on_disk():
        if names is None or name.removeprefix("matmul_") in names:
            module = importlib.import_module(name)
            if arch not in module.KERNELS:  # v6, v7 on Blackwell: their ideas have no Blackwell kernel
                print(f"{name.removeprefix('matmul_')} left out: {module.KERNELS.missing_reason(arch)}", flush=True)
                continue
            versions[name.removeprefix("matmul_")] = (module.KERNELS, module.matmul)
    path = out or cli.RESULTS_DIR / f"{gpu.gpu_label()}.csv"
    rows = cli.benchmark(versions, [cli.parse_size(size) for size in sizes], repeat, 60.0, dtype,
                         peers=[peer_contender] if peer else [],
                         on_size=lambda size_rows: cli.print_rows(size_rows) or cli.save_rows(size_rows, path))
    for name in versions:  # the programs these rows were measured with (support/provenance.py)
        provenance.record_measured(name, path)
    wrong = sorted({f"{r['version']} at {_size(r)}" for r in rows if not cli.row_passes(r)})
    if wrong:
        raise SystemExit(f"not plotted: wrong results from {', '.join(wrong)}")
    return path


def relabel(pairs: list[str], commit: str, files: list[Path] | None = None) -> int:
    """Rename versions' rows (OLD=NEW each) in ``files`` (default: every results CSV), where the programs of OLD at
    ``commit`` (the code that measured them) are those of NEW on disk, schedule by schedule; record the hashes.
    Exit status."""
    renames = dict(pair.split("=") for pair in pairs)
    for old, new in renames.items():
        before, after = provenance.hashes_at(commit, f"matmul_{old}"), provenance.hashes(f"matmul_{new}")
        if before != after:
            differ = sorted(set(before) ^ set(after) | {s for s in before if before[s] != after.get(s)})
            print(f"{old} at {commit} and {new} are not the same kernels: {differ[:3]}", file=sys.stderr)
            return 1
    relabelled = []
    for path in [p.resolve() for p in files] if files else sorted(cli.RESULTS_DIR.glob("*.csv")):
        rows = cli.read_csv(path)
        column = "backend" if rows and "backend" in rows[0] else "version"
        if not any(row[column] in renames for row in rows):
            continue
        relabelled.append(path)
        for row in rows:
            row[column] = renames.get(row[column], row[column])
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        print(f"relabelled {', '.join(f'{a} -> {b}' for a, b in renames.items())} in {path.relative_to(REPO)}")
    for old, new in renames.items():
        provenance.record(new, provenance.hashes(f"matmul_{new}"), measured_as=old, commit=commit, files=relabelled)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", type=Path, help="plot this results CSV instead of benchmarking")
    parser.add_argument("--sizes", nargs="+", default=BENCHMARK_SIZES,
                        help="sizes to benchmark (N or MxNxK); default: two or three of each shape class, the "
                             "decode shapes and square sizes from 512 to 16384")
    parser.add_argument("--peer", action="store_true", help="also time the Triton GEMM torch.compile reaches")
    parser.add_argument("--dtype", choices=["fp16", "bf16", "both"], default="both",
                        help="fp16: every version at every size; bf16: every version at the square class sizes "
                             "(or --sizes and --versions); default: both")
    parser.add_argument("--versions", nargs="+", metavar="VN", help="time only these versions (e.g. v4 v5)")
    parser.add_argument("--out", type=Path, help="with --csv-only: write the rows to this CSV, not results/<gpu>.csv")
    parser.add_argument("--relabel", nargs="+", metavar="OLD=NEW",
                        help="rename these versions' rows, where each one's kernels are the ones measured (below)")
    parser.add_argument("--measured-at", metavar="COMMIT", help="with --relabel: the commit whose code measured them")
    parser.add_argument("--in", dest="files", nargs="+", type=Path, metavar="CSV",
                        help="with --relabel: only these results files (default: all)")
    parser.add_argument("--csv-only", action="store_true",
                        help="benchmark and write results/<gpu>.csv only (re-plot later with --from)")
    parser.add_argument("--second-measurement", choices=["yes", "no", "only"], default="yes",
                        help=f"after the fp16 run, measure {', '.join(REPEAT_SIZES)} again with the same contenders "
                             "into results/<gpu>_repeat.csv, to show how far two measurements agree (only: nothing "
                             "else); default: yes")
    args = parser.parse_args(argv)
    if args.relabel:
        if not args.measured_at:
            parser.error("--relabel needs --measured-at, the commit whose code measured the rows")
        return relabel(args.relabel, args.measured_at, args.files)
    sources = [args.source] if args.source else []
    if not sources:
        try:
            gpu.gpu_arch()
            if args.dtype in ("fp16", "both") and args.second_measurement != "only":
                sources = [benchmark(args.sizes, args.peer, "fp16", args.versions, args.out)]
            if args.dtype in ("fp16", "both") and args.second_measurement != "no":
                again = cli.RESULTS_DIR / f"{gpu.gpu_label()}_repeat.csv"
                print(f"the second measurement, of {', '.join(REPEAT_SIZES)}, into {again.relative_to(REPO)}", flush=True)
                benchmark(REPEAT_SIZES, args.peer, "fp16", args.versions, again)
                sources = sources or [cli.RESULTS_DIR / f"{gpu.gpu_label()}.csv"]
            if args.dtype in ("bf16", "both") and args.second_measurement != "only":
                sizes = args.sizes if args.sizes is not BENCHMARK_SIZES else BF16_SIZES
                sources = [benchmark(sizes, args.peer, "bf16", args.versions, args.out)]
            if args.csv_only:
                return 0
        except gpu.UnsupportedGPUError as reason:
            sources = sorted(path for path in cli.RESULTS_DIR.glob("*.csv") if "_" not in path.stem)
            print(f"No Hopper or Blackwell GPU here ({reason}): re-plotting {len(sources)} results file(s) instead.")
    for source in sources:
        if not source.exists():
            parser.error(f"{source} does not exist")
        for path in plot(read_rows(source), source.stem):
            print(f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    for document in update_documents():
        print(f"updated the results tables in {document.relative_to(REPO)}")
    for path in model_figures():
        print(f"wrote {path.relative_to(REPO)} (a model)")
    for path in _docs_script("streamk").main():
        print(f"wrote {path.relative_to(REPO)} (docs/streamk.py)")
    print("build evidence: building every schedule without a GPU (cached after the first time)...", flush=True)
    for document in _docs_script("evidence").update_all(progress=lambda line: None):
        print(f"updated the build evidence tables in {document.relative_to(REPO)}")
    return 0


def _docs_script(name: str):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "docs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def model_figures() -> list[Path]:
    """The figures drawn from models, not measurements: the timelines of v1-v3 and v4's tile order."""
    raster = _docs_script("raster")
    raster.update_page()
    return [*_docs_script("timeline").main(), raster.draw()]


if __name__ == "__main__":
    sys.exit(main())
