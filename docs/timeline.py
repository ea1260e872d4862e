"""Schematic timelines of one thread block's K loop for v1, v2 and v3.

A model, not a measurement: every bar is computed from the constants below and the
rules in schedule_v1/v2/v3, so the figures show how the stages differ in which unit
waits for which, not how long a real kernel takes. Run: python docs/timeline.py
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend has to be chosen first)

LOAD = 1000  # cycles from issuing a TMA load of one K step's tiles until its mbarrier completes
MMA = 512  # tensor-core cycles for one 128x128x64 step (2.1 MFLOP at ~4096 FLOP/cycle/SM)
ISSUE = 40  # cycles a warp spends issuing/waiting bookkeeping between operations
STEPS = 6  # K steps drawn
STAGES = 3  # ring depth for v2 and v3

TMA = "TMA engine"
TC = "tensor cores"
WARP = "issuing warp(s)"
LANES = (TMA, TC, WARP)  # top to bottom

FIGURES = Path(__file__).resolve().parent / "figures"
ROOT = Path(__file__).resolve().parent.parent

# Each schedule is a list of (unit, start, duration, label) bars; waits of the issuing
# warp(s) are labelled by what they wait on. A warp needs ISSUE cycles between two
# operations it issues. In v1 and v2 the warp that waits also keeps the ring's books, so
# it needs ISSUE cycles after a wait ends before it issues again; in v3 each warp only
# waits on an mbarrier and issues, so it issues as soon as the wait ends.


def _wait(bars, start, end, label):
    """Add a wait bar for the issuing warp(s), if it waits at all."""
    if end > start:
        bars.append((WARP, start, end - start, label))


def schedule_v1():
    """No overlap: load a step, wait for it, multiply, wait for the MMA, load the next."""
    bars = []
    t = 0
    for i in range(STEPS):
        bars.append((TMA, t, LOAD, str(i)))
        _wait(bars, t + ISSUE, t + LOAD, f"load {i}")
        mma_start = t + LOAD + ISSUE
        bars.append((TC, mma_start, MMA, str(i)))
        _wait(bars, mma_start + ISSUE, mma_start + MMA, f"MMA {i}")
        t = mma_start + MMA + ISSUE
    return bars


def schedule_v2():
    """A ring of STAGES slots, one warp (group) issues both the loads and the MMAs."""
    bars = []
    load_end = {}
    # Prologue: fill all but one slot; the last slot is refilled inside the loop.
    for j in range(STAGES - 1):
        bars.append((TMA, j * ISSUE, LOAD, str(j)))
        load_end[j] = j * ISSUE + LOAD
    last_issue = (STAGES - 2) * ISSUE
    mma_end = None
    for i in range(STEPS):
        # MMA i needs its slot full and, as only one MMA may be in flight, MMA i-1 done.
        waits = [(load_end[i], f"load {i}")]
        if mma_end is not None:
            waits.append((mma_end, f"MMA {i - 1}"))
        ready, on = max(waits)
        _wait(bars, last_issue + ISSUE, ready, on)
        mma_start = max(last_issue, ready) + ISSUE
        bars.append((TC, mma_start, MMA, str(i)))
        last_issue = mma_start
        # MMA i-1 has finished by now, so its slot can be refilled with step i+STAGES-1.
        j = i + STAGES - 1
        if j < STEPS:
            last_issue += ISSUE
            bars.append((TMA, last_issue, LOAD, str(j)))
            load_end[j] = last_issue + LOAD
        mma_end = mma_start + MMA
    _wait(bars, last_issue + ISSUE, mma_end, f"MMA {STEPS - 1}")
    return bars


def schedule_v3():
    """Warp specialised: a producer warp refills free slots, a consumer warp queues MMAs."""
    bars = []
    load_end = {}
    mma_end = {}
    producer_issue = -ISSUE  # so that load 0 goes out at cycle 0

    def load(j):
        # The producer waits until MMA j-STAGES has released slot j % STAGES.
        nonlocal producer_issue
        free = mma_end[j - STAGES] if j >= STAGES else 0
        _wait(bars, producer_issue + ISSUE, free, f"MMA {j - STAGES}")
        producer_issue = max(producer_issue + ISSUE, free)
        bars.append((TMA, producer_issue, LOAD, str(j)))
        load_end[j] = producer_issue + LOAD

    for j in range(min(STAGES, STEPS)):
        load(j)
    consumer_issue = -ISSUE
    for i in range(STEPS):
        # The consumer issues MMA i once load i landed and does not wait for it to
        # finish: the tensor cores queue it behind MMA i-1, so no gap opens between them.
        _wait(bars, consumer_issue + ISSUE, load_end[i], f"load {i}")
        consumer_issue = max(consumer_issue + ISSUE, load_end[i])
        mma_start = max(consumer_issue, mma_end.get(i - 1, 0))
        bars.append((TC, mma_start, MMA, str(i)))
        mma_end[i] = mma_start + MMA
        if i + STAGES < STEPS:
            load(i + STAGES)
    # Before the epilogue the consumer waits until the last MMA has finished.
    _wait(bars, consumer_issue + ISSUE, mma_end[STEPS - 1], f"MMA {STEPS - 1}")
    return bars


def total(bars):
    """Model cycles from the first issue to the end of the last bar."""
    return max(start + duration for _, start, duration, _ in bars)


def tensor_busy(bars):
    """Fraction of the total time the tensor cores run an MMA (MMAs never overlap)."""
    return sum(duration for unit, _, duration, _ in bars if unit == TC) / total(bars)


def _sub_rows(bars):
    """Give each bar the first sub-row where it overlaps no other, so overlaps stay visible."""
    row_ends = []
    rows = []
    for _, start, duration, _ in bars:
        for k, end in enumerate(row_ends):
            if end <= start:
                row_ends[k] = start + duration
                rows.append(k)
                break
        else:
            row_ends.append(start + duration)
            rows.append(len(row_ends) - 1)
    return rows, max(len(row_ends), 1)


STYLE = {  # face colour, text colour, label size
    TMA: ("#4C78A8", "white", 7),
    TC: ("#F58518", "black", 7),
    WARP: ("#D9D9D9", "#404040", 6.5),
}
FIGSIZE = (9, 2.6)
AXES = (0.12, 0.2, 0.85, 0.58)  # left, bottom, width, height in figure fractions
LANE_HEIGHT = 0.8


def _draw(bars, title, subtitle, xmax, path):
    fig = plt.figure(figsize=FIGSIZE)
    ax = fig.add_axes(AXES)
    ax.set_xlim(0, xmax)
    ax.set_ylim(-0.5, len(LANES) - 0.5)
    renderer = fig.canvas.get_renderer()
    for lane, unit in enumerate(LANES):
        y_top = len(LANES) - 1 - lane + LANE_HEIGHT / 2
        unit_bars = sorted((b for b in bars if b[0] == unit), key=lambda b: (b[1], b[3]))
        rows, n_rows = _sub_rows(unit_bars)
        height = LANE_HEIGHT / n_rows
        face, color, size = STYLE[unit]
        for (_, start, duration, label), row in zip(unit_bars, rows):
            y = y_top - (row + 1) * height
            ax.broken_barh([(start, duration)], (y, height * 0.9), facecolors=face,
                           edgecolors="white", linewidth=0.5)
            text = ax.text(start + duration / 2, y + height * 0.45, label, ha="center",
                           va="center", fontsize=size, color=color)
            # Short bars (the x range is v1's long total) drop a label rather than spill it.
            (x0, _), (x1, _) = ax.transData.transform([(start, 0), (start + duration, 0)])
            if text.get_window_extent(renderer).width > (x1 - x0) * 0.95:
                text.remove()
    ax.set_yticks(range(len(LANES)), reversed(LANES), fontsize=8)
    ax.set_xlabel("cycles (model)", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.text(AXES[0], 0.93, title, fontsize=10, fontweight="bold")
    fig.text(AXES[0], 0.85, subtitle, fontsize=7.5, color="#404040")
    fig.text(AXES[0] + AXES[2], 0.03,
             f"total {total(bars)} cycles, tensor cores busy {tensor_busy(bars):.0%}",
             fontsize=8.5, fontweight="bold", ha="right")
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)


FIGURE_SPECS = (  # name, schedule, title, whether the ring depth applies
    ("timeline_v1", schedule_v1, "v1: load a K step, then multiply it, one after the other",
     False),
    ("timeline_v2", schedule_v2,
     f"v2: a ring of {STAGES} slots, one warp issues both loads and MMAs", True),
    ("timeline_v3", schedule_v3,
     "v3: warp specialised, a producer warp loads, a consumer warp multiplies", True),
)


def main(out_dir=FIGURES):
    """Write the three figures into out_dir; returns their paths."""
    plt.rcParams["svg.hashsalt"] = "gemm-timeline"  # fixed ids: reruns give identical files
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    xmax = total(schedule_v1())  # one x range for all three so they compare at a glance
    paths = []
    for name, schedule, title, ring in FIGURE_SPECS:
        subtitle = (f"schematic model, not a measurement: load {LOAD} cycles, "
                    f"128x128x64 MMA {MMA} cycles, issue {ISSUE} cycles, {STEPS} K steps"
                    + (f", {STAGES} slots" if ring else ""))
        path = out_dir / f"{name}.svg"
        _draw(schedule(), title, subtitle, xmax, path)
        paths.append(path)
        shown = path.resolve()
        print(f"wrote {shown.relative_to(ROOT) if shown.is_relative_to(ROOT) else shown}")
    return paths


if __name__ == "__main__":
    main()
