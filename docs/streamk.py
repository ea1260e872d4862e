"""Stream-K (v8): where each SM's time goes at 4096^3, and how much of the memory bandwidth decode reaches.

Two figures:

- figures/streamk_4096.svg is a model, not a measurement. Every SM of an H100 (132) over
  time at 4096^3, with time counted as MMA work: one K block of a 128 x 256 tile takes
  1/64 of a unit (K = 4096 is 64 blocks of 64), one of a 128 x 128 tile half that. Loads,
  epilogues and the fix-up's reads of the workspace take no time, except that a tile's
  owner cannot end before its sharers' sums were saved. The schedules are v7's
  ``PersistentTileScheduler`` (whole tiles, every 132nd) and v8's ``StreamKTileScheduler``
  (whole waves, then worker w takes K blocks [w * I // 132, (w + 1) * I // 132) of the
  rest, its pieces last tile first), written out again here in plain Python. The
  scheduler's cap on sharers (``MAX_SHARERS``) does not bind at 4096^3: every range is
  longer than a tile, so all 132 workers take one.
- figures/decode_roofline.svg is measured: the decode rows (M = 1, 16, 64; fp16;
  back-to-back) of results/h100.csv, each as the share of a device-to-device copy's
  bandwidth measured in the same run (column ``pct_of_bandwidth``), for v8, v9, the Triton
  peer and cuBLAS. Versions without rows are left out, with a note.

streamk_4096.svg is shown in v8.md, decode_roofline.svg in v9.md.

    python docs/streamk.py [results.csv]     draws both figures (default results/h100.csv)
"""

import csv
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after matplotlib.use: the backend has to be chosen first
from matplotlib.patches import Patch

DOCS = Path(__file__).resolve().parent
FIGURES = DOCS / "figures"
RESULTS = DOCS.parent / "results" / "h100.csv"

SMS = 132  # workers: one CTA per SM of an H100 SXM
SIZE = 4096
BLOCK_K = 64
K_BLOCKS = SIZE // BLOCK_K
DECODE_M = ("1", "16", "64")
DECODE_VERSIONS = {"v8": "#9ecae1", "v9": "#08519c", "triton": "0.65", "cublas": "0.35"}
LABELS = {"triton": "Triton (torch.compile)", "cublas": "cuBLAS"}


def data_parallel(units: int, workers: int) -> list[list[tuple[int, int, int]]]:
    """v7: worker w computes whole units w, w + workers, ...: per worker, its pieces (unit, k_begin, k_end)."""
    return [[(unit, 0, K_BLOCKS) for unit in range(w, units, workers)] for w in range(workers)]


def dp_units(units: int, workers: int) -> int:
    """v8: the units that stay whole: every one if the waves are whole, else all but the last whole wave and the
    partial one (none with fewer units than workers)."""
    if units % workers == 0:
        return units
    return (units // workers - 1) * workers if units >= workers else 0


def stream_k(units: int, workers: int) -> list[list[tuple[int, int, int]]]:
    """v8: StreamKTileScheduler's pieces per worker, in the order the worker computes them."""
    whole = dp_units(units, workers)
    sk_blocks = (units - whole) * K_BLOCKS
    schedule = []
    for w, pieces in enumerate(data_parallel(whole, workers)):
        begin, end = w * sk_blocks // workers, (w + 1) * sk_blocks // workers
        for sk_unit in range((end - 1) // K_BLOCKS, begin // K_BLOCKS - 1, -1):  # the range's last unit first
            first = sk_unit * K_BLOCKS
            pieces.append((whole + sk_unit, max(begin - first, 0), min(end - first, K_BLOCKS)))
        schedule.append(pieces)
    return schedule


def timeline(schedule: list[list[tuple[int, int, int]]], block_time: float) -> list[list[tuple]]:
    """Per worker, (start, length, unit, k_begin, k_end) of each piece; an owner ends after its sharers' saves.

    A sharer's piece (ending before the unit's last K block) saves its sum and waits for
    nothing; the owner's (ending there, starting later) adds the sums, so it cannot end
    before they are saved. Sharers are lower workers: walking the workers in order finds
    their saves.
    """
    saves = {}  # unit -> when each sharer's sum was in the workspace
    bars = []
    for pieces in schedule:
        clock, row = 0.0, []
        for unit, k_begin, k_end in pieces:
            start, clock = clock, clock + (k_end - k_begin) * block_time
            if k_end < K_BLOCKS:
                saves.setdefault(unit, []).append(clock)
            elif k_begin > 0:
                clock = max(clock, *saves[unit])
            row.append((start, clock - start, unit, k_begin, k_end))
        bars.append(row)
    return bars


def draw_schedule(ax, bars: list[list[tuple]], whole: int, title: str) -> None:
    """One panel: a thin row per SM, whole tiles in grey, stream-K pieces coloured by tile, a line at the end."""
    palette = plt.get_cmap("tab10").colors
    waves = {}  # (start, length, shade) -> its SMs: a wave's whole tiles are drawn as one block (a smaller file)
    for sm, row in enumerate(bars):
        for start, length, unit, k_begin, k_end in row:
            if unit < whole:
                waves.setdefault((start, length, unit // SMS % 2), []).append(sm)
                continue
            # a piece whose sum goes to the workspace is drawn faint, one that stores its tile solid; a thin
            # white edge keeps neighbouring pieces and rows apart
            ax.barh(sm, length, left=start, height=1.0, color=palette[unit % len(palette)],
                    alpha=0.4 if k_end < K_BLOCKS else 1.0, edgecolor="white", linewidth=0.2)
    for (start, length, shade), sms in waves.items():  # SMs 0 to n - 1 of the wave: a contiguous run
        ax.barh((sms[0] + sms[-1]) / 2, length, left=start, height=len(sms), color=("0.55", "0.75")[shade],
                linewidth=0)
    end = max(start + length for row in bars for start, length, *_ in row)
    ax.axvline(end, color="black", linestyle="--", linewidth=0.8)
    ax.text(end, -3, f" ends at {end:.2f}", fontsize=7, va="bottom")
    ax.set_ylim(len(bars), -8)  # SM 0 on top, room above it for the label
    ax.set_yticks([0, 33, 66, 99, 131])
    ax.set_xlim(0, 4.6)
    ax.set_xlabel("time: one 128 x 256 tile's K loop = 1 (MMA work only)", fontsize=7)
    ax.set_title(title, fontsize=8)
    ax.tick_params(labelsize=7)


def stream_k_title(name: str, units: int) -> str:
    """What a stream-K panel shows: its waves of whole tiles and each SM's share of the rest."""
    whole = dp_units(units, SMS)
    share, extra = divmod((units - whole) * K_BLOCKS, SMS)
    return (f"{name}\n{whole // SMS} waves of whole tiles, then {share} or {share + 1} K blocks per SM "
            f"({extra} get {share + 1})")


def draw_4096(path: Path = FIGURES / "streamk_4096.svg") -> Path:
    """v7's whole tiles against stream-K at 4096^3, at v7's tile and at the tile v8 offers stream-K with."""
    tiles_256, tiles_128 = (SIZE // 128) * (SIZE // 256), (SIZE // 128) * (SIZE // 128)
    waves, last = divmod(tiles_256, SMS)
    panels = [
        (data_parallel(tiles_256, SMS), tiles_256, 1 / K_BLOCKS,
         f"v7: whole 128 x 256 tiles, {tiles_256} for {SMS} SMs\n{waves + 1} waves, the last one {last} tiles"),
        (stream_k(tiles_256, SMS), dp_units(tiles_256, SMS), 1 / K_BLOCKS,
         stream_k_title("stream-K at the same tile (v8: in clusters of two only)", tiles_256)),
        (stream_k(tiles_128, SMS), dp_units(tiles_128, SMS), 0.5 / K_BLOCKS,  # half the MMA work per K block
         stream_k_title("v8's stream-K, 128 x 128 tiles", tiles_128)),
    ]
    plt.rcParams["svg.hashsalt"] = "tilus-gemm-tutorial"
    fig, axes = plt.subplots(1, len(panels), figsize=(13, 5.6), sharey=True)
    balanced = tiles_256 / SMS
    for ax, (schedule, whole, block_time, title) in zip(axes, panels):
        draw_schedule(ax, timeline(schedule, block_time), whole, title)
        ax.axvline(balanced, color="0.3", linestyle=":", linewidth=0.8)
    axes[0].set_ylabel(f"SM (worker) 0 to {SMS - 1}", fontsize=7)
    piece = plt.get_cmap("tab10").colors[0]
    fig.legend(handles=[
        Patch(color="0.55", label="whole tiles (two shades: alternate waves)"),
        Patch(color=piece, label="stream-K piece that ends at the tile's last K block: stores it"),
        Patch(color=piece, alpha=0.4,
              label="stream-K piece that ends earlier: its sum goes to the workspace for the tile's owner"),
        plt.Line2D([], [], color="0.3", linestyle=":", label=f"every SM busy to the end: {balanced:.2f}"),
    ], loc="lower center", ncol=2, fontsize=7, frameon=False)
    fig.suptitle(f"{SIZE}^3 on {SMS} SMs, a model (MMA work only; loads, stores and fix-ups free): "
                 "which SM computes which K blocks, when", fontsize=9)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    return _save(fig, path)


def decode_rows(path: Path) -> dict[tuple[str, str], dict]:
    """{(version, M x N x K): row} of the fp16 back-to-back decode rows of the versions drawn."""
    with path.open() as f:
        return {(row["version"], f"{row['m']}x{row['n']}x{row['k']}"): row for row in csv.DictReader(f)
                if row["dtype"] == "fp16" and row["regime"] == "back-to-back" and row["m"] in DECODE_M
                and row["version"] in DECODE_VERSIONS and row["pct_of_bandwidth"]}


def draw_decode(results: Path = RESULTS, path: Path = FIGURES / "decode_roofline.svg") -> Path:
    """Grouped bars: each decode shape's share of the copy bandwidth, per version, against a line at 100%."""
    rows = decode_rows(results)
    if not rows:
        sys.exit(f"{results} has no back-to-back fp16 decode rows")
    present = {version for version, _ in rows}
    versions = [v for v in DECODE_VERSIONS if v in present]
    for missing in (v for v in DECODE_VERSIONS if v not in present):
        print(f"note: {results.name} has no back-to-back fp16 decode rows for {missing}: drawn without it")
    shapes = sorted({size for _, size in rows}, key=lambda size: [int(x) for x in size.split("x")])
    width = 0.8 / len(versions)
    plt.rcParams["svg.hashsalt"] = "tilus-gemm-tutorial"
    fig, ax = plt.subplots(figsize=(10, 4))
    for i, version in enumerate(versions):
        points = [(j, float(rows[version, size]["pct_of_bandwidth"])) for j, size in enumerate(shapes)
                  if (version, size) in rows]
        bars = ax.bar([j + (i - (len(versions) - 1) / 2) * width for j, _ in points], [pct for _, pct in points],
                      width, color=DECODE_VERSIONS[version], label=LABELS.get(version, version))
        ax.bar_label(bars, labels=[f"{pct:.0f}" for _, pct in points], fontsize=5, padding=1)
    ax.axhline(100, color="black", linestyle="--", linewidth=0.8)
    ax.text(-0.5, 100, " device-to-device copy (same run)", fontsize=7, va="bottom")
    ax.set_xlim(-0.5, len(shapes) - 0.5)
    ax.set_ylim(0, max(115, *(1.1 * float(row["pct_of_bandwidth"]) for row in rows.values())))
    ax.set_xticks(range(len(shapes)), shapes, fontsize=7)
    ax.set_xlabel("M x N x K (M tokens through N x K weights)", fontsize=8)
    ax.set_ylabel("% of the copy's bandwidth\n(bytes of A, B and C over the time)", fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    ax.legend(fontsize=7, ncol=len(versions), loc="upper left", bbox_to_anchor=(0, -0.16), frameon=False)
    gpu = next(iter(rows.values()))["gpu"]
    ax.set_title(f"Decode shapes, fp16, back-to-back on {gpu}: measured ({results.name})", fontsize=9)
    fig.tight_layout()
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Date": None})
    plt.close(fig)
    return path


def main(results: Path = RESULTS) -> list[Path]:
    return [draw_4096(), draw_decode(results)]


if __name__ == "__main__":
    for written in main(*(Path(arg) for arg in sys.argv[1:2])):
        print(f"wrote {written.relative_to(DOCS.parent)}")
