"""Diagrams of the ring's phases, the warp roles of v3 and v7 (Hopper), and v6's swizzled output tile.

Drawn from the facts below, each taken from the code it names (tests/test_docs.py checks
them against that code and that the committed figures are what this script writes):

    python docs/diagrams.py     writes figures/ring_phases.svg, roles_v3.svg, roles_v7.svg, swizzle_v6.svg

- ring_phases: pipeline.py's contract over two and a half trips round a ring of 4 slots:
  each slot's full and empty barrier, the phase each is in and when it completes, and
  the producer's and the consumer's (stage, phase) cursors. Time is schematic.
- roles_v3, roles_v7: which warps of a Hopper block do what, and the barriers between
  them with their arrival counts.
- swizzle_v6: where the 16-byte chunks of an output tile's rows land in shared memory,
  v5's row-major tile against v6's 128-byte swizzle, and the banks one stmatrix hits.

The SVGs are deterministic (fixed ids, text as text, no date), so a rerun gives identical
files.
"""

import itertools
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.patches as mpatches  # after matplotlib.use: the backend has to be chosen first
import matplotlib.path
import matplotlib.pyplot as plt

DOCS = Path(__file__).resolve().parent
FIGURES = DOCS / "figures"
# fixed ids, text kept as text (the metrics are DejaVu Sans', which matplotlib ships; a viewer
# without it falls back to a narrower sans-serif)
RC = {"svg.hashsalt": "gemm-diagrams", "svg.fonttype": "none", "font.family": "sans-serif",
      "font.sans-serif": ["DejaVu Sans", "Arial", "Helvetica"]}

# ---------------------------------------------------------------------------------------
# The facts, and where each comes from

# tilus' mbarrier.producer_initial_phase and consumer_initial_phase, which Pipeline starts with
PRODUCER_INITIAL_PHASE, CONSUMER_INITIAL_PHASE = 1, 0
# HopperMatmulV3: 9 warps, the producer from thread 256; full count 1, empty count 256 (every
# thread of both consumer warpgroups arrives after wait_group(1)); 128 x 256 tiles take 2 or
# 3 slots of 48 KiB (the diagram draws 3)
V3_WARPS, V3_PRODUCER_THREAD, V3_EMPTY_COUNT, V3_STAGES = 9, 256, 256, 3
# HopperMatmulV7 at its 128 x 256 schedule: a ring of 4, 9 warps, empty count 2 warpgroups x
# cluster_m CTAs, s_c_free[0..1] of count 1 each
V7_STAGES, V7_WARPS, V7_CLUSTER = 4, 9, 2
V7_EMPTY_COUNT = 2 * V7_CLUSTER
BLOCK_M, BLOCK_N, BLOCK_K = 128, 256, 64  # v3's and v7's Hopper tile, fp16
# matmul_v6.py's output tile: 64-column boxes with Swizzle(base=3, bits=3, shift=3)
SWIZZLE = {"base": 3, "bits": 3, "shift": 3}
BOX_COLUMNS = 64  # fp16: 128 bytes a row, the widest row TMA's 128-byte swizzle takes
V5_ROW_COLUMNS = BLOCK_N  # v5's row-major output tile: 64 rows of 256 fp16, 512 bytes a row
CHUNK_BYTES = 16  # a 16-byte chunk: 8 fp16, one row of an stmatrix 8 x 8 matrix; 4 banks
BANKS, BANK_BYTES = 32, 4

KIB = 1024
A_SLOT = BLOCK_M * BLOCK_K * 2 // KIB  # 16 KiB: two 64-row halves, one per consumer warpgroup
B_SLOT = BLOCK_N * BLOCK_K * 2 // KIB  # 32 KiB
C_TILE = BLOCK_M // 2 * BLOCK_N * 2 // KIB  # 32 KiB: one warpgroup's 64 x 256 rows of C

# colours, shared with docs/timeline.py where they mean the same
BLUE, ORANGE, DARK, GREEN, TEAL = "#4C78A8", "#F58518", "#404040", "#54A24B", "#72B7B2"
GREY, RED, PURPLE = "#D9D9D9", "#C0392B", "#8E6BB0"
PHASE_FACE = ("#E3ECF6", "#FBE3C6")  # a barrier in phase 0, in phase 1


def _save(fig, path):
    svg = Path(path).suffix == ".svg"
    fig.savefig(path, format=Path(path).suffix[1:], metadata={"Date": None} if svg else None, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------
# 1. The ring's phases


RING_STEPS = 10  # K steps drawn: two trips round V7_STAGES slots and the start of a third
# schematic time units: the consumer's work on one slot takes 1; a load takes longer than a
# trip's worth of the producer's issues, so the consumer waits for the first load, and from
# the second trip on the producer waits for the consumer to free a slot
RING_ISSUE, RING_LOAD, RING_WORK = 0.5, 2.5, 1.0


def ring_steps(stages=V7_STAGES, steps=RING_STEPS):
    """One dict per K step j: its slot, both cursors' phases, and the times (schematic) when

    ask/issue: the producer starts waiting on empty[slot] / passes it and issues the loads,
    full: the loads have landed (full[slot] completes), take/work: the consumer starts
    waiting on full[slot] / starts its work, free: it frees the slot (empty[slot] completes).
    The cursors follow Pipeline: stage + 1 mod stages, the phase flips when the stage wraps.
    """
    rows = []
    producer_phase, consumer_phase = PRODUCER_INITIAL_PHASE, CONSUMER_INITIAL_PHASE
    for j in range(steps):
        stage = j % stages
        if j and stage == 0:
            producer_phase ^= 1
            consumer_phase ^= 1
        ask = rows[-1]["issue"] + RING_ISSUE if rows else 0.0
        if j < stages:
            # phase 1 looks completed before the barrier began: the first trip passes at once
            assert producer_phase == 1
            issue = ask
        else:
            # the wait completes with empty[stage]'s completion number j // stages - 1, whose
            # phase is that number mod 2: the phase the producer's cursor holds
            assert (j // stages - 1) % 2 == producer_phase
            issue = max(ask, rows[j - stages]["free"])
        full = issue + RING_LOAD
        assert (j // stages) % 2 == consumer_phase  # the same rule on the full side
        take = rows[-1]["free"] if rows else 0.0
        work = max(take, full)
        rows.append({"step": j, "stage": stage, "producer_phase": producer_phase,
                     "consumer_phase": consumer_phase, "ask": ask, "issue": issue, "full": full,
                     "take": take, "work": work, "free": work + RING_WORK})
    return rows


def draw_ring_phases(path, stages=V7_STAGES, steps=RING_STEPS):
    rows = ring_steps(stages, steps)
    end = rows[-1]["free"] + 1.1
    lanes = ["producer"] + [f"{kind}[{s}]" for s in range(stages) for kind in ("full", "empty")] + ["consumer"]
    y = {lane: len(lanes) - 1 - n for n, lane in enumerate(lanes)}
    fig = plt.figure(figsize=(10.0, 6.2))
    ax = fig.add_axes((0.1, 0.07, 0.88, 0.69))
    ax.set_xlim(-0.1, end)
    ax.set_ylim(-0.75, len(lanes) + 0.15)
    h = 0.62

    def bar(lane, x0, x1, face, label="", color="black", size=7, edge="white", height=h, hatch=None):
        ax.add_patch(mpatches.Rectangle((x0, y[lane] - height / 2), x1 - x0, height, facecolor=face,
                                        edgecolor=edge, linewidth=0.6, hatch=hatch))
        if label:
            ax.text((x0 + x1) / 2, y[lane], label, ha="center", va="center", fontsize=size, color=color)

    # the barriers: the phase each is in, and its completions
    for s in range(stages):
        for kind, when in (("full", "full"), ("empty", "free")):
            lane = f"{kind}[{s}]"
            times = [r[when] for r in rows if r["stage"] == s]
            edges = [0.0, *times, end]
            for k, (x0, x1) in enumerate(itertools.pairwise(edges)):
                bar(lane, x0, x1, PHASE_FACE[k % 2], edge="none", height=0.8)
                if x1 - x0 > 0.9:
                    ax.text(x0 + 0.08, y[lane] + 0.27, f"phase {k % 2}", fontsize=6, color=DARK, va="center")
            for k, (r, t) in enumerate(zip((r for r in rows if r["stage"] == s), times)):
                # what fills (a load in flight) or holds (the consumer's work) the slot
                if kind == "full":
                    bar(lane, r["issue"], t, BLUE, f"load {r['step']}", "white", 6.5, height=0.32)
                else:
                    bar(lane, r["work"], t, ORANGE, f"use {r['step']}", "black", 6.5, height=0.32)
                ax.plot([t], [y[lane]], marker="D", markersize=5, color="black", zorder=5)
                ax.text(t + 0.06, y[lane] - 0.3, f"phase {k % 2} completes", fontsize=5.5, va="center",
                        color="black")
        ax.axhspan(y[f"empty[{s}]"] - 0.5, y[f"full[{s}]"] + 0.5, xmin=0, xmax=1, facecolor="none",
                   edgecolor="#BBBBBB", linewidth=0.5)

    # the producer: wait for an empty slot (at once on the first trip), arrive, issue the loads
    for r in rows:
        wait = f"empty[{r['stage']}], phase {r['producer_phase']}"
        if r["issue"] > r["ask"] + 1e-9:
            bar("producer", r["ask"], r["issue"], GREY, "", DARK)
            ax.plot([r["issue"]] * 2, [y["producer"] - h / 2, y[f"empty[{r['stage']}]"]], ls=":",
                    color=DARK, linewidth=0.8, zorder=4)
        bar("producer", r["issue"], r["issue"] + RING_ISSUE, BLUE, str(r["step"]), "white", 6.5, edge="black")
        ax.text(r["issue"] + RING_ISSUE / 2, y["producer"] + 0.36, f"({r['stage']},{r['producer_phase']})",
                fontsize=6, ha="center", va="bottom")
        if r["issue"] - r["ask"] > 1.2:
            ax.text((r["ask"] + r["issue"]) / 2, y["producer"], f"waits {wait}", fontsize=5.5, ha="center",
                    va="center", color=DARK)
    # the consumer: wait for a full slot, work, free it
    for r in rows:
        if r["work"] > r["take"] + 1e-9:
            bar("consumer", r["take"], r["work"], PHASE_FACE[0], f"waits full[{r['stage']}], phase "
                f"{r['consumer_phase']}", DARK, 5.5)
            ax.plot([r["work"]] * 2, [y["consumer"] + h / 2, y[f"full[{r['stage']}]"]], ls=":",
                    color=DARK, linewidth=0.8, zorder=4)
        bar("consumer", r["work"], r["work"] + RING_WORK, ORANGE, f"step {r['step']}\n({r['stage']},"
            f"{r['consumer_phase']})", "black", 6.2, edge="black")
    # the wraps: stage back to 0, phase flipped
    for r in rows:
        if r["step"] and r["stage"] == 0:
            for lane, x, key, dy in (("producer", r["issue"], "producer_phase", 0.72),
                                     ("consumer", r["work"], "consumer_phase", -0.5)):
                ax.plot([x - 0.03] * 2, [y[lane] - 0.4, y[lane] + 0.4], color=RED, linewidth=1.6, zorder=6)
                ax.text(x + 0.02, y[lane] + dy, f"stage wraps to 0: phase {r[key] ^ 1} -> {r[key]}", fontsize=6,
                        color=RED, ha="left", va="center")
    ax.text(0, y["producer"] + 1.0, (f"first trip: the waits for phase {PRODUCER_INITIAL_PHASE} pass at once "
                                    "(it looks completed)"), fontsize=6, color=DARK, va="center")
    names = {"producer": "producer\n(stage, phase)", "consumer": "consumer\n(stage, phase)"}
    ax.set_yticks([y[lane] for lane in lanes], [names.get(lane, lane) for lane in lanes], fontsize=8)
    ax.tick_params(axis="y", length=0)
    ax.set_xticks([])
    ax.set_xlabel("time (schematic) ->", fontsize=8)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.text(0.1, 0.965, f"The ring's phases: {stages} slots, {steps} K steps, two trips round and a bit",
             fontsize=10, fontweight="bold", va="center")
    fig.text(0.1, 0.93, (f"Every barrier starts in phase 0; a wait for phase p passes once phase p has completed. "
                         f"The producer's cursor starts at (0, {PRODUCER_INITIAL_PHASE}), the consumer's at "
                         f"(0, {CONSUMER_INITIAL_PHASE});"), fontsize=7.5, color=DARK, va="center")
    fig.text(0.1, 0.905, ("each flips its phase when its stage wraps to 0. full[s] completes when slot s's load "
                          "lands, empty[s] when the consumer frees slot s (pipeline.py)."),
             fontsize=7.5, color=DARK, va="center")
    handles = [mpatches.Patch(facecolor=PHASE_FACE[0], label="barrier in phase 0"),
               mpatches.Patch(facecolor=PHASE_FACE[1], label="barrier in phase 1"),
               plt.Line2D([], [], marker="D", color="black", linestyle="none", markersize=5,
                          label="a phase completes"),
               mpatches.Patch(facecolor=BLUE, label="producer issues / load in flight"),
               mpatches.Patch(facecolor=ORANGE, label="consumer uses the slot"),
               mpatches.Patch(facecolor=GREY, label="producer waits for empty"),
               plt.Line2D([], [], color=DARK, ls=":", label="the wait passes")]
    fig.legend(handles=handles, loc="center left", ncol=4, frameon=False, fontsize=7,
               bbox_to_anchor=(0.095, 0.84), handlelength=1.4, columnspacing=1.2)
    return _save(fig, path)


# ---------------------------------------------------------------------------------------
# 2. The warp roles of v3 and v7 (Hopper)


def _box(ax, x, y, w, h, text, face="white", edge=DARK, size=7.0, bold=False, color="black", lw=0.9, ls="-"):
    ax.add_patch(mpatches.FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0,rounding_size=0.06",
                                         facecolor=face, edgecolor=edge, linewidth=lw, linestyle=ls))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size, color=color,
                fontweight="bold" if bold else "normal", linespacing=1.3)


def _arrow(ax, start, end, color=DARK, rad=0.0, ls="-", lw=1.0):
    ax.add_patch(mpatches.FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=9, color=color,
                                          linewidth=lw, linestyle=ls, connectionstyle=f"arc3,rad={rad}",
                                          shrinkA=1, shrinkB=1, zorder=3))


def _route(ax, points, color=DARK, ls="-", lw=1.0):
    """An arrow along a polyline (x, y), ...: for a signal that has to go round things."""
    polyline = matplotlib.path.Path
    path = polyline(points, [polyline.MOVETO] + [polyline.LINETO] * (len(points) - 1))
    ax.add_patch(mpatches.FancyArrowPatch(path=path, arrowstyle="-|>", mutation_scale=9, color=color,
                                          linewidth=lw, linestyle=ls, zorder=3))


def _label(ax, x, y, text, color=DARK, size=6.3, ha="center"):
    ax.text(x, y, text, fontsize=size, color=color, ha=ha, va="center", linespacing=1.25, zorder=4)


def _canvas(width, height):
    fig = plt.figure(figsize=(width, height))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.axis("off")
    return fig, ax


BLOCK_HEIGHT = 3.6  # inches: one CTA of the role diagrams
ROLE_LEGEND = [mpatches.Patch(facecolor=BLUE, label="loads, full barriers"),
               mpatches.Patch(facecolor=DARK, label="empty barriers"),
               mpatches.Patch(facecolor=ORANGE, label="consumers: wgmma"),
               mpatches.Patch(facecolor=GREEN, label="epilogue: the output tile")]


def _block(ax, y0, stages, cluster=1, rank=0, flip=False):
    """One Hopper CTA of v3 (cluster 1) or v7: its warps, its shared memory, the barriers between.

    Coordinates are inches; y is relative to the block's bottom, mirrored when flip (so two
    CTAs of a cluster face each other with their rings). Returns named anchor points.
    """
    def Y(y, h=0.0):  # the bottom of something at relative height y, h high
        return y0 + (BLOCK_HEIGHT - y - h if flip else y)

    def box(x, y, w, h, *args, **kwargs):
        _box(ax, x, Y(y, h), w, h, *args, **kwargs)

    def arrow(a, b, *args, **kwargs):
        _arrow(ax, (a[0], Y(a[1])), (b[0], Y(b[1])), *args, **kwargs)

    def label(x, y, *args, **kwargs):
        _label(ax, x, Y(y), *args, **kwargs)

    v7 = cluster > 1
    # the producer and the TMA engine
    b_what = f"A, B part {rank}" if v7 else "A, B"
    box(0.25, 2.15, 2.3, 1.3, f"producer: warp 8\nthreads {V3_PRODUCER_THREAD}-{V3_PRODUCER_THREAD + 31}\n"
        "one thread arrives,\nthe warp issues the loads"
        + ("\n(runs on from tile to tile)" if v7 else ""), "#EDEDED", size=6.6)
    box(0.25, 0.2, 2.3, 0.75, "TMA engine", "#DCE6F2", BLUE, 7.5, bold=True)
    arrow((1.4, 2.15), (1.4, 0.95), BLUE)
    label(1.45, 1.55, f"issues the loads:\n{b_what}", BLUE, ha="left")
    # shared memory: barriers, the ring
    box(3.6, 0.1, 3.7, 3.4, "", "#FAFAFA", "#999999", lw=0.7, ls="--")
    label(3.7, 3.38, "shared memory", "#777777", 6.2, ha="left")
    full = f"full_barriers[s]: count 1 + {A_SLOT + B_SLOT} KiB" + (f"\n({B_SLOT // 2} KiB of it from the peer)" if v7 else "")
    box(3.8, 2.75, 3.3, 0.5, full, "#E3ECF6", BLUE, 6.4)
    empty = (f"empty_barriers[s]: count {V7_EMPTY_COUNT}\n= 2 warpgroups x {cluster} CTAs" if v7
             else f"empty_barriers[s]: count {V3_EMPTY_COUNT}\n= 2 warpgroups x 128 threads")
    box(3.8, 2.15, 3.3, 0.5, empty, "#EDEDED", DARK, 6.4)
    slot_w = (3.3 - 0.08 * (stages - 1)) / stages
    for s in range(stages):
        x = 3.8 + s * (slot_w + 0.08)
        box(x, 1.2, slot_w, 0.24, "A 0-63", "#DCE6F2", BLUE, 5.2)
        box(x, 0.94, slot_w, 0.24, "A 64-127", "#DCE6F2", BLUE, 5.2)
        if v7:
            for part in range(cluster):
                own = part == rank  # the peer's part nearest the peer, where its multicast comes in
                box(x, 0.25 + 0.33 * own, slot_w, 0.31, f"B part {part}",
                    "#C9D7E8" if own else "#E8E0F0", BLUE if own else PURPLE, 5.2)
        else:
            box(x, 0.25, slot_w, 0.66, f"B\n{BLOCK_N} x {BLOCK_K}", "#C9D7E8", BLUE, 5.2)
        label(x + slot_w / 2, 1.58, f"slot {s}", size=6.2)
    label(5.45, 1.88, f"the ring: {stages} slots (stages) of {A_SLOT} + {B_SLOT} KiB", size=6.2)
    arrow((2.55, 0.6), (3.8, 0.6), BLUE)
    label(3.17, 0.95, "loads land;\nbytes count\ndown full[s]", BLUE, 5.8)
    # the producer's side of the barriers
    arrow((2.55, 3.0), (3.8, 3.0), BLUE)
    label(3.17, 3.32, "arrive_and_\nexpect_tx", BLUE, 5.8)
    arrow((3.8, 2.4), (2.55, 2.4), DARK)
    label(3.17, 2.05, "wait(empty[s],\nproducer\nphase)", DARK, 5.8)
    # the consumers
    box(8.2, 1.95, 2.65, 1.55, "", "white", ORANGE, lw=0.8)
    label(9.52, 3.33, "consumers: 2 warpgroups", ORANGE, 6.4)
    for wg in range(2):
        box(8.3 + wg * 1.27, 2.05, 1.18, 1.1, f"warpgroup {wg}\nwarps {4 * wg}-{4 * wg + 3}\nrows {64 * wg}-"
            f"{64 * wg + 63}:\n64 x {BLOCK_N} fp32,\n{BLOCK_M // 2 * BLOCK_N // 128} regs/thread", "#FDEBD3", ORANGE, 5.8)
    arrow((7.1, 3.0), (8.2, 3.0), BLUE)
    label(7.65, 3.3, "wait(full[s],\nconsumer phase)", BLUE, 5.8)
    arrow((8.2, 2.4), (7.1, 2.4), DARK)
    label(7.65, 2.7, "after wait_group: 1\nthread each arrives" + ("\nhere and on the peer's" if v7 else "")
          if v7 else "after wait_group(1):\nevery thread arrives", DARK, 5.8)
    arrow((7.1, 0.75), (8.2, 2.0), ORANGE)
    label(7.68, 1.0, "wgmma\nreads", ORANGE, 5.8)
    # the epilogue
    if v7:
        box(8.2, 0.15, 2.65, 1.35, f"s_c (shared): 64 x 256 fp16, {C_TILE} KiB,\n4 swizzled 64-column boxes,\n"
            "one warpgroup's rows at a time:\ns_c_free[0], s_c_free[1] (count 1):\nwarpgroup 0 first; each hands\n"
            "it to the other after its store", "#E5F2E3", GREEN, 5.6)
    else:
        for wg in range(2):
            box(8.3 + wg * 1.27, 0.15, 1.18, 1.35, f"s_c of\nwarpgroup {wg}\n(shared)\n64 x 256 fp16\n{C_TILE} KiB",
                "#E5F2E3", GREEN, 5.8)
    for wg in range(2):
        arrow((8.89 + wg * 1.27, 2.05), (8.89 + wg * 1.27, 1.5), GREEN)
    label(9.52, 1.76, "wait_group(0), the\nflush; then write", GREEN, 5.6)
    return {"tma": (2.55, Y(0.5)), "ring_edge": Y(0.25), "Y": Y}


def draw_roles_v3(path):
    fig, ax = _canvas(11.0, 5.9)
    ax.text(0.25, 5.65, f"v3 (Hopper): one block of {V3_WARPS} warps per 128 x 256 tile", fontsize=10,
            fontweight="bold", va="center")
    ax.text(0.25, 5.4, ("A producer warp fills the ring; two consumer warpgroups each multiply their 64 rows of A by "
                        "the whole B slot and store their own rows of C."), fontsize=7.5, color=DARK, va="center")
    fig.legend(handles=ROLE_LEGEND, loc="center left", ncol=4, frameon=False, fontsize=7,
               bbox_to_anchor=(0.015, 5.12 / 5.9), handlelength=1.2)
    _block(ax, 1.25, V3_STAGES)
    _box(ax, 0.25, 0.2, 2.3, 0.65, "global memory:\nA (M x K), B (N x K)", size=6.6)
    _arrow(ax, (1.4, 0.85), (1.4, 1.45), BLUE)
    _box(ax, 8.2, 0.2, 2.65, 0.65, "global memory: C (M x N)", size=6.6)
    for wg in range(2):
        _arrow(ax, (8.89 + wg * 1.27, 1.4), (8.89 + wg * 1.27, 0.85), TEAL)
    _label(ax, 9.52, 1.12, "TMA store", TEAL, 5.8)
    _label(ax, 3.7, 0.5, (f"shared memory: {V3_STAGES} x {A_SLOT + B_SLOT} + 2 x {C_TILE} = "
                          f"{V3_STAGES * (A_SLOT + B_SLOT) + 2 * C_TILE} KiB of the 227 a block may have"),
           DARK, 6.3, ha="left")
    return _save(fig, path)


def draw_roles_v7(path):
    gap, frame = 0.8, 0.3  # inches between the two CTAs, and for each CTA's name
    height = 1.3 + 2 * (BLOCK_HEIGHT + frame) + gap
    fig, ax = _canvas(11.0, height)
    ax.text(0.25, height - 0.25, (f"v7 (Hopper): a cluster of {V7_CLUSTER} CTAs, each a persistent block of "
                                  f"{V7_WARPS} warps"), fontsize=10, fontweight="bold", va="center")
    ax.text(0.25, height - 0.5, ("Each CTA walks tiles t, t + grid, ...; the two compute the tiles above each other, "
                                 "which share B: each loads one half and multicasts it into both."),
            fontsize=7.5, color=DARK, va="center")
    ax.text(0.25, height - 0.72, ("The two consumer warpgroups take turns with one output tile: one stores while the "
                                  "other multiplies the next tile."), fontsize=7.5, color=DARK, va="center")
    fig.legend(handles=ROLE_LEGEND + [mpatches.Patch(facecolor=PURPLE, label="across the cluster")],
               loc="center left", ncol=5, frameon=False, fontsize=7,
               bbox_to_anchor=(0.015, (height - 0.97) / height), handlelength=1.2)
    bottom = 0.1 + frame
    top = bottom + BLOCK_HEIGHT + gap
    for rank, y0 in ((0, top), (1, bottom)):
        outer = y0 + BLOCK_HEIGHT + frame - 0.15 if rank == 0 else y0 - frame + 0.15
        _box(ax, 0.1, y0 - (0.05 if rank == 0 else frame), 10.85, BLOCK_HEIGHT + frame + 0.05, "", "none",
             "#AAAAAA", lw=0.8)
        _label(ax, 0.25, outer, f"CTA rank {rank}", "black", 7.5, ha="left")
    zero = _block(ax, top, V7_STAGES, V7_CLUSTER, 0)
    one = _block(ax, bottom, V7_STAGES, V7_CLUSTER, 1, flip=True)
    middle = bottom + BLOCK_HEIGHT + gap / 2
    # B: each CTA's TMA engine writes its part into the same slot of both CTAs
    _arrow(ax, zero["tma"], (4.4, one["ring_edge"]), PURPLE, ls="--")
    _arrow(ax, one["tma"], (5.2, zero["ring_edge"]), PURPLE, ls="--")
    _label(ax, 3.1, middle, "B part 0, B part 1:\nmulticast into both", PURPLE, 6.3, ha="right")
    # empty: one thread of each consumer warpgroup arrives on the peer's barrier too
    Y0, Y1 = zero["Y"], one["Y"]
    _route(ax, [(8.2, Y0(2.1)), (7.95, Y0(2.1)), (7.95, Y1(2.28)), (7.1, Y1(2.28))], PURPLE, ls="--")
    _route(ax, [(8.2, Y1(2.0)), (7.42, Y1(2.0)), (7.42, Y0(2.22)), (7.1, Y0(2.22))], PURPLE, ls="--")
    _label(ax, 8.1, middle, "remote arrive on the peer's empty[s]\n(at CTA scope: nothing to publish)",
           PURPLE, 6.3, ha="left")
    return _save(fig, path)


# ---------------------------------------------------------------------------------------
# 3. The swizzled output tile


def swizzle(offset, base=SWIZZLE["base"], bits=SWIZZLE["bits"], shift=SWIZZLE["shift"]):
    """tilus' Swizzle on an element offset: XOR bits [base, base + bits) with the bits shift above."""
    y_mask = ((1 << bits) - 1) << (base + shift)
    return offset ^ ((offset & y_mask) >> shift)


def chunk_bank_group(byte_address):
    """The group of 4 banks a 16-byte chunk at this address falls in: banks 4g .. 4g + 3."""
    return (byte_address // BANK_BYTES) % BANKS // (CHUNK_BYTES // BANK_BYTES)


def row_major_chunks(rows=8, chunks=8):
    """v5: {(row, chunk): bank group} for a row-major 64 x 256 fp16 tile."""
    return {(r, c): chunk_bank_group(r * V5_ROW_COLUMNS * 2 + c * CHUNK_BYTES) for r in range(rows)
            for c in range(chunks)}


def swizzled_chunks(rows=8):
    """v6: {(row, logical chunk): physical chunk = bank group} within one 64-column box."""
    elements = CHUNK_BYTES // 2
    return {(r, c): swizzle(r * BOX_COLUMNS + c * elements) % BOX_COLUMNS // elements
            for r in range(rows) for c in range(BOX_COLUMNS // elements)}


def draw_swizzle(path):
    chunk_colors = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#EECA3B", "#B279A2", "#9D755D"]
    fig, axes = plt.subplots(1, 2, figsize=(10.0, 5.0))
    fig.subplots_adjust(left=0.09, right=0.98, top=0.74, bottom=0.2, wspace=0.3)
    v5, v6 = row_major_chunks(), swizzled_chunks()
    panels = (
        (axes[0], "v5: row-major 64 x 256, 512 bytes a row",
         {(r, v5[r, c]): c for r, c in v5},
         "the 8 rows of one stmatrix (chunk 0) all in banks 0-3:\nan 8-way conflict, 8 passes"),
        (axes[1], "v6: a 64-column box, 128-byte swizzle",
         {(r, p): c for (r, c), p in v6.items()},
         "chunk 0 of rows 0-7 in 8 different bank groups:\nall 32 banks once, 1 pass"),
    )
    for (ax, title, placed, note), row_bytes in zip(panels, (V5_ROW_COLUMNS * 2, BOX_COLUMNS * 2)):
        for (r, p), c in placed.items():
            face = chunk_colors[c]
            ax.add_patch(mpatches.Rectangle((p, r), 1, 1, facecolor=face, alpha=1.0 if c == 0 else 0.35,
                                            edgecolor="white", linewidth=1.0))
            ax.text(p + 0.5, r + 0.5, str(c), ha="center", va="center", fontsize=8,
                    color="white" if c == 0 else "black", fontweight="bold" if c == 0 else "normal")
        for r in range(8):
            p = next(p for (rr, p), c in placed.items() if rr == r and c == 0)
            ax.add_patch(mpatches.Rectangle((p, r), 1, 1, facecolor="none", edgecolor=RED, linewidth=1.6))
        ax.set_xlim(0, 8)
        ax.set_ylim(8, 0)
        ax.set_aspect("equal")
        ax.set_xticks([p + 0.5 for p in range(8)], [f"{4 * p}-{4 * p + 3}" for p in range(8)], fontsize=6.5)
        ax.set_yticks([r + 0.5 for r in range(8)], [f"row {r}: +{r * row_bytes} B" for r in range(8)], fontsize=7)
        ax.tick_params(length=0)
        ax.xaxis.set_label_position("top")
        ax.xaxis.tick_top()
        ax.set_xlabel("banks of the 16-byte position a chunk lands in", fontsize=7)
        ax.set_title(title, fontsize=9, fontweight="bold", pad=24)
        ax.text(4, 8.35, note, ha="center", va="top", fontsize=7.5, color=RED)
        for side in ax.spines.values():
            side.set_visible(False)
    axes[0].text(8.15, 4, f"...\n{V5_ROW_COLUMNS * 2 // CHUNK_BYTES - 8} more\nchunks\na row", fontsize=6.5,
                 va="center", color=DARK)
    fig.legend(handles=[mpatches.Patch(facecolor=chunk_colors[0], edgecolor=RED, linewidth=1.6,
                                       label="chunk 0 of rows 0-7: the 8 rows one stmatrix 8 x 8 matrix writes"),
                        mpatches.Patch(facecolor=chunk_colors[1], alpha=0.35, label="other chunks (colour: chunk c)")],
               loc="center left", ncol=2, frameon=False, fontsize=7.5, bbox_to_anchor=(0.065, 0.06))
    fig.text(0.07, 0.95, "Where one warpgroup's rows of C land in shared memory (fp16, 16-byte chunks of 8 values)",
             fontsize=10, fontweight="bold", va="center")
    fig.text(0.07, 0.905, ("Number in a cell: the logical chunk c of its row (columns 8c .. 8c + 7 of the box). "
                           "Bank = (byte address / 4) % 32, so a 16-byte chunk covers 4 banks."),
             fontsize=7.5, color=DARK, va="center")
    fig.text(0.07, 0.87, ("Left: a row is 512 bytes, a multiple of 128, so chunk c of every row is in the same banks. "
                          "Right: chunk c of row r sits at c ^ (r % 8); rows 8-15 repeat rows 0-7."),
             fontsize=7.5, color=DARK, va="center")
    return _save(fig, path)


# ---------------------------------------------------------------------------------------

DRAWINGS = {"ring_phases": draw_ring_phases, "roles_v3": draw_roles_v3, "roles_v7": draw_roles_v7,
            "swizzle_v6": draw_swizzle}


def main(out_dir=FIGURES, suffix=".svg"):
    """Write every diagram into out_dir (suffix .png for a preview); returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with plt.rc_context(RC):
        return [draw(out_dir / f"{name}{suffix}") for name, draw in DRAWINGS.items()]


if __name__ == "__main__":
    for written in main():
        print(f"wrote {written.relative_to(DOCS.parent) if written.is_relative_to(DOCS.parent) else written}")
