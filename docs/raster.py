"""The order blocks visit tiles in (v3 and v4), and what it costs in traffic from HBM.

A model, not a measurement. Blocks start in launch order and about 132 run at once (one
per SM); a "wave" is 132 consecutive blocks. Each block reads a row of A tiles
(block_m x K) and a column of B tiles (block_n x K). Within a wave every A row and B column
is counted once (the blocks sharing it run at the same time, so L2 serves the others), and
nothing is assumed to survive in L2 from one wave to the next. The model's HBM traffic is
then the sum over waves of the distinct A rows and B columns each wave touches.

    python docs/raster.py     draws figures/raster.svg and rewrites the traffic table in v4.md
"""

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after matplotlib.use: the backend has to be chosen first

DOCS = Path(__file__).resolve().parent
FIGURE = DOCS / "figures" / "raster.svg"
PAGE = DOCS / "v4.md"
TABLE = re.compile(r"(<!-- traffic -->\n)(.*?)(<!-- /traffic -->)", re.DOTALL)

SMS = 132  # blocks in flight: one 128 x 256 block per SM of an H100
BLOCK_M, BLOCK_N = 128, 256
GROUPS = (8, 16, 32)
SHAPES = [  # (class, M, N, K)
    ("square", 4096, 4096, 4096),
    ("square", 8192, 8192, 8192),
    ("LLM-like", 4096, 14336, 4096),
    ("LLM-like", 4096, 4096, 14336),
    ("few tiles", 16384, 1024, 4096),
    ("few tiles", 2048, 2048, 8192),
]


def row_order(num_m: int, num_n: int) -> list[tuple[int, int]]:
    """v3: a 2-D grid, blockIdx.x over tile rows; blocks start with x fastest."""
    return [(i % num_m, i // num_m) for i in range(num_m * num_n)]


def grouped_order(num_m: int, num_n: int, group_m: int) -> list[tuple[int, int]]:
    """v4: GroupedTileOrder.grouped_tile, block by block: (tile row, tile column) of block i."""
    tiles = []
    for i in range(num_m * num_n):
        group, in_group = divmod(i, group_m * num_n)
        first_m = group * group_m
        tile_n, row = divmod(in_group, min(group_m, num_m - first_m))
        tiles.append((first_m + row, tile_n))
    return tiles


def hbm_traffic(order: list[tuple[int, int]], m: int, n: int, k: int) -> tuple[float, float]:
    """(MiB touched by the first wave, model HBM traffic in MiB) for tiles visited in this order."""
    a_row, b_column = BLOCK_M * k * 2 / 2**20, BLOCK_N * k * 2 / 2**20
    waves = [order[i : i + SMS] for i in range(0, len(order), SMS)]
    touched = [len({r for r, _ in wave}) * a_row + len({c for _, c in wave}) * b_column for wave in waves]
    return touched[0], sum(touched)


def traffic_table() -> str:
    lines = [
        "| class | M x N x K | tiles | v3 order: wave / total (MiB) | "
        + " | ".join(f"group_m = {g}: wave / total" for g in GROUPS)
        + " | A + B once |",
        "|---|---|---|---|" + "---|" * len(GROUPS) + "---|",
    ]
    for name, m, n, k in SHAPES:
        num_m, num_n = -(-m // BLOCK_M), -(-n // BLOCK_N)
        cells = [hbm_traffic(row_order(num_m, num_n), m, n, k)]
        cells += [hbm_traffic(grouped_order(num_m, num_n, g), m, n, k) for g in GROUPS]
        once = (m + n) * k * 2 / 2**20
        lines.append(
            f"| {name} | {m}x{n}x{k} | {num_m} x {num_n} | "
            + " | ".join(f"{wave:.0f} / {total:.0f}" for wave, total in cells)
            + f" | {once:.0f} |"
        )
    return "\n".join(lines) + "\n"


def draw(path: Path = FIGURE) -> Path:
    """Launch index of every tile of a 16 x 12 grid, first wave (32 blocks in flight) shaded."""
    num_m, num_n, in_flight, group_m = 16, 12, 32, 4
    panels = [("v3: a 2-D grid, tile rows first", row_order(num_m, num_n)),
              (f"v4: groups of {group_m} tile rows", grouped_order(num_m, num_n, group_m))]
    plt.rcParams["svg.hashsalt"] = "tilus-gemm-tutorial"
    fig, axes = plt.subplots(1, 2, figsize=(9, 5.4))
    for ax, (title, order) in zip(axes, panels):
        first = order[:in_flight]
        rows, columns = len({r for r, _ in first}), len({c for _, c in first})
        for index, (r, c) in enumerate(order):
            shade = "#f4a261" if index < in_flight else ("#e9ecef" if (index // in_flight) % 2 else "white")
            ax.add_patch(plt.Rectangle((c, r), 1, 1, facecolor=shade, edgecolor="0.6", linewidth=0.5))
            ax.text(c + 0.5, r + 0.5, str(index), ha="center", va="center", fontsize=6)
        ax.set_xlim(0, num_n)
        ax.set_ylim(num_m, 0)
        ax.set_aspect("equal")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_xlabel(f"tile columns of C (B tiles); the first {in_flight} blocks read\n"
                      f"{rows} rows of A tiles and {columns} columns of B tiles", fontsize=8)
        ax.set_ylabel("tile rows of C (A tiles)", fontsize=8)
        ax.set_title(title, fontsize=9)
    fig.suptitle("Launch order of the blocks (number in each tile); shaded: blocks in flight together", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Date": None})
    plt.close(fig)
    return path


def update_page(page: Path = PAGE) -> bool:
    """Rewrite the traffic table of v4.md; True if it changed."""
    text = page.read_text()
    updated = TABLE.sub(lambda match: match.group(1) + traffic_table() + match.group(3), text)
    if updated != text:
        page.write_text(updated)
    return updated != text


if __name__ == "__main__":
    print(f"wrote {draw().relative_to(DOCS.parent)}")
    if update_page():
        print(f"updated the traffic table in {PAGE.relative_to(DOCS.parent)}")
