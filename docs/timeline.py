"""Schematic timelines of one thread block's K loop for v1, v2 and v3, and of v5's tile loop.

A model, not a measurement: every bar is computed from the constants below and the
rules in schedule_v1, schedule_v2_blackwell/_hopper, schedule_v3_blackwell/_hopper and
schedule_v5_hopper, so the figures show how the stages differ in which unit waits for
which, not how long a real kernel takes. Run: python docs/timeline.py (writes
figures/timeline_v1..v3.svg and timeline_v5.svg; v2 and v3 have one panel per GPU, because
their Blackwell and Hopper kernels free slots differently; v5 has one panel with its
epilogue overlapped with the next tile's K loop and one without). v1, v2 and v3 are drawn
with the same 128 x 128 tile (and v2 and v3 with the same ring), so each figure differs from
the last only in the idea its version adds; v5 is drawn with its own 128 x 256 tile.

Each schedule_* function is a small simulation of one kernel's K loop as written in
matmul_v*.py: every role (a warp, a warpgroup) runs its own loop and yields the same
operations in the same order as the kernel (issue a load, wait on a barrier, issue an
MMA, sync, arrive); simulate() runs them against a TMA engine that serves any number of
loads and stores at once and tensor cores that run one MMA at a time, in the order they
were issued.
The numbers are the H100's (the GPU the measurements come from) for both GPUs:
Blackwell's tensor cores do more per cycle, which would make each MMA shorter and the
load harder to hide; the Blackwell kernels have not been run.
"""

import heapq
from collections import namedtuple
from pathlib import Path

import matplotlib
import matplotlib.patches

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after matplotlib.use: the backend has to be chosen first

# The model's constants, from the H100 SXM's datasheet numbers:
#   989 TFLOPS dense fp16 / (132 SMs * 1.83e9 cycles/s) = 4094, so ~4096 FLOP/cycle/SM
#   a TMA round trip to L2/HBM of ~1 us = 1e-6 s * 1.83e9 cycles/s = 1830 cycles, ~1800
CLOCK_GHZ = 1.83
FLOP_PER_CYCLE = 4096  # tensor-core FLOP per cycle per SM
LOAD = 1800  # cycles from issuing a TMA load of one K step's tiles until its mbarrier completes


def mma_cycles(m, n, k):
    """Tensor-core cycles for one m x n x k MMA: 2 * m * n * k FLOP at FLOP_PER_CYCLE."""
    return 2 * m * n * k // FLOP_PER_CYCLE


TILE = (128, 128)  # the tile v1, v2 and v3 are drawn with
MMA = mma_cycles(*TILE, 64)  # 2 * 128 * 128 * 64 = 2,097,152 FLOP / 4096 = 512 cycles
ISSUE = 40  # cycles a warp spends on one operation: issuing a load or an MMA, a sync, an arrive
STEPS = 8  # K steps drawn
STAGES = 3  # ring depth for v2 and v3 (the depth v3 chose on the H100; in v2's autotune space)
# v3 is drawn with v2's tile and ring, 128 x 128 and 3 slots (Hopper: two consumers of
# 64 x 128), both in v3's autotune space, so the v2 and v3 figures differ only in the warp
# specialisation. At 512-cycle steps the two steps queued behind a refill (1024 cycles) do
# not cover a load (1800), so in both figures the MMAs wait for loads. The larger tile that
# v3's second consumer makes possible (and that v3 ran on the H100) is v5's figure's:
# 128 x 256, whose 1024-cycle steps hide a load behind two.
V5_TILE = (128, 256)

# v5 (Hopper): a persistent block walks several tiles; a few short tiles show the overlap.
V5_TILES = 3  # tiles drawn, one after the other on one SM
V5_STEPS = 4  # K steps per tile: one whole trip round the ring, as v5 pads K to whole trips
V5_STAGES = 4  # v5's ring for its 128 x 256 tile (HopperMatmulV5's autotune space)
# The epilogue of one consumer warpgroup, in cycles; both are arithmetic, not measured:
# its 64 x 256 fp16 rows are 32 KiB, and shared memory moves at most 128 bytes per cycle,
# so writing them from registers (stmatrix, conflict free with the swizzled tile) takes at
# least 32768 / 128 = 256 cycles; converting 128 fp32 registers a thread to fp16 and
# issuing the stores about doubles that. The TMA engine reads the 32 KiB back out at the
# same rate (the write to global memory goes on after; nothing waits for it).
EPILOGUE_WRITE = 2 * 64 * 256 * 2 // 128  # 512 cycles: registers -> shared, one warpgroup
STORE_READ = 64 * 256 * 2 // 128  # 256 cycles: the TMA store reads one warpgroup's rows

# lanes: the units and the roles that issue to them
TMA = "TMA engine"
TC = "tensor cores"
WARP = "issuing warp(s)"  # v1: one warp (Blackwell) or one warpgroup (Hopper), alike here
WARP_V2_BW = "issuing warp"  # v2 Blackwell: one warp issues loads and MMAs
WARP_V2_HP = "warpgroup"  # v2 Hopper: the four warps that issue wgmma also issue the loads
PRODUCER = "producer warp"
MMA_WARP = "MMA warp"  # v3 Blackwell's consumer
CONSUMERS = ("consumer\nwarpgroup 0", "consumer\nwarpgroup 1")  # v3 Hopper
CONSUMER_TAGS = ("a", "b")  # MMA labels on Hopper v3: "3a" is step 3 of warpgroup 0

# One bar of a timeline. kind is "load" or "store" (TMA engine), "mma" (tensor cores),
# "wait" (a role waits on a barrier), "issue" (a role spends ISSUE cycles on an operation;
# what says which: "load", "mma", "store", "sync", "arrive", "commit"), or "work" (v5: a
# role writes its accumulator to shared memory). step: the K step a load, an MMA or an
# issue belongs to (None for others). by: the role that issued a load, a store or an MMA.
Bar = namedtuple("Bar", "lane start duration kind what step by label")


def _end(bar):
    return bar.start + bar.duration


# ---------------------------------------------------------------------------------------
# The simulation. A role is a generator that yields commands; simulate() runs every role
# in cycle order, so operations reach the TMA engine and the tensor cores in the order a
# real block would issue them.


def load(step, label=None):
    """Issue the TMA loads of one K step; the event ("loaded", step) happens when they land."""
    return ("load", step, label)


def store(event, label):
    """Issue a TMA store of the output tile; `event` happens once the TMA engine has read
    it out of shared memory (what tma.wait_group(0, read=True) waits for)."""
    return ("store", event, label)


def work(what, cycles, label, step=None):
    """The role itself is busy for `cycles`: v5's registers -> shared write of its rows."""
    return ("work", what, cycles, label, step)


def mma(step, cycles, commit=None, label=None):
    """Issue an MMA (and, on Blackwell, the tcgen05.commit after it, which makes the
    hardware complete the event `commit` when this MMA and all earlier ones finished).
    The event ("mma", step, role) happens when the MMA finishes."""
    return ("mma", step, cycles, commit, label)


def wait(event, label):
    """Wait on a barrier until the event has happened."""
    return ("wait", event, label)


def op(what, arrive=None, step=None):
    """A bookkeeping operation of ISSUE cycles: a sync, or an arrive on `arrive`."""
    return ("op", what, arrive, step)


def simulate(roles, arrivals=None):
    """Run roles {lane: generator} to completion; returns the list of Bars, by start.

    arrivals: {event name: count}, how many arrives complete an event whose key starts
    with that name (default 1), as an mbarrier's arrival count does.
    """
    arrivals = arrivals or {}
    bars = []
    happened = {}  # event -> the cycle it happens (possibly later than now)
    arrived = {}  # event -> arrives so far
    parked = {}  # event -> [(lane, cycle it started waiting, label)]
    tc_free = 0  # the cycle the tensor cores finish the last MMA issued so far
    order = {lane: n for n, lane in enumerate(roles)}
    ready = [(0, order[lane], lane) for lane in roles]  # (cycle, tie-break, lane)
    heapq.heapify(ready)

    def resume(lane, since, cycle, event, label):
        if cycle > since:
            bars.append(Bar(lane, since, cycle - since, "wait", event[0], None, None, label))
        heapq.heappush(ready, (max(since, cycle), order[lane], lane))

    def happen(event, cycle):
        happened[event] = cycle
        for lane, since, label in parked.pop(event, []):
            resume(lane, since, cycle, event, label)

    while ready:
        now, _, lane = heapq.heappop(ready)
        command = next(roles[lane], None)
        if command is None:
            continue
        kind = command[0]
        if kind == "wait":
            _, event, label = command
            if event in happened:
                resume(lane, now, happened[event], event, label)
            else:
                parked.setdefault(event, []).append((lane, now, label))
            continue
        issued = now + ISSUE
        if kind == "work":
            _, what, cycles, label, step = command
            bars.append(Bar(lane, now, cycles, "work", what, step, lane, label))
            heapq.heappush(ready, (now + cycles, order[lane], lane))
            continue
        if kind == "load":
            _, step, label = command
            bars.append(Bar(lane, now, ISSUE, "issue", "load", step, lane, ""))
            bars.append(Bar(TMA, issued, LOAD, "load", "load", step, lane,
                            str(step) if label is None else label))
            happen(("loaded", step), issued + LOAD)
        elif kind == "store":
            _, event, label = command
            bars.append(Bar(lane, now, ISSUE, "issue", "store", None, lane, ""))
            bars.append(Bar(TMA, issued, STORE_READ, "store", "store", None, lane, label))
            happen(event, issued + STORE_READ)
        elif kind == "mma":
            _, step, cycles, commit, label = command
            start = max(issued, tc_free)  # the tensor cores run MMAs one at a time, in order
            tc_free = start + cycles
            bars.append(Bar(lane, now, ISSUE, "issue", "mma", step, lane, ""))
            bars.append(Bar(TC, start, cycles, "mma", "mma", step, lane,
                            str(step) if label is None else label))
            happen(("mma", step, lane), tc_free)
            if commit is not None:
                happen(commit, tc_free)
        else:  # "op"
            _, what, event, step = command
            bars.append(Bar(lane, now, ISSUE, "issue", what, step, lane, ""))
            if event is not None:
                arrived[event] = arrived.get(event, 0) + 1
                if arrived[event] == arrivals.get(event[0], 1):
                    happen(event, issued)
        heapq.heappush(ready, (issued, order[lane], lane))
    assert not parked, f"deadlock: {sorted(parked)} never happened"
    return sorted(bars, key=lambda b: (b.start, b.lane))


# ---------------------------------------------------------------------------------------
# The kernels' K loops, one generator per role, in the order matmul_v*.py issues them.


def schedule_v1(steps=STEPS, tile=TILE):
    """v1 (both GPUs): load a step, wait for it, multiply, wait for the MMA, sync."""
    cycles = mma_cycles(tile[0], tile[1], 64)

    def warp():
        for i in range(steps):
            yield load(i)
            yield wait(("loaded", i), f"load {i}")
            yield mma(i, cycles)  # Blackwell: + tcgen05.commit(mma_barrier); Hopper: commit_group
            yield wait(("mma", i, WARP), f"MMA {i}")  # mbarrier.wait / wgmma.wait_group(0)
            yield op("sync")

    return simulate({WARP: warp()})


def schedule_v2_blackwell(steps=STEPS, stages=STAGES, tile=TILE):
    """v2 Blackwell: one warp. The prologue loads one slot per stage; each step waits for
    its slot, issues the MMA, commits to mma_barrier and waits for it, then refills the
    same slot with the step `stages` ahead."""
    cycles = mma_cycles(tile[0], tile[1], 64)

    def warp():
        for s in range(min(stages, steps)):
            yield load(s)
        for i in range(steps):
            yield wait(("loaded", i), f"load {i}")
            yield mma(i, cycles)  # + tcgen05.commit(mma_barrier)
            yield wait(("mma", i, WARP_V2_BW), f"MMA {i}")
            if i + stages < steps:
                yield load(i + stages)

    return simulate({WARP_V2_BW: warp()})


def schedule_v2_hopper(steps=STEPS, stages=STAGES, tile=TILE):
    """v2 Hopper: one warpgroup. The prologue fills stages - 1 slots; each step waits for
    its slot, issues the wgmma, wait_group(1) waits for the previous wgmma only (it is the
    whole warpgroup's, so no sync is needed), then one warp refills the slot the previous
    step used with step i + stages - 1. After the loop, wait_group(0) and a sync."""
    cycles = mma_cycles(tile[0], tile[1], 64)

    def warpgroup():
        for s in range(min(stages - 1, steps)):
            yield load(s)
        for i in range(steps):
            yield wait(("loaded", i), f"load {i}")
            yield mma(i, cycles)  # wgmma.fence, wgmma.mma, wgmma.commit_group
            if i > 0:
                yield wait(("mma", i - 1, WARP_V2_HP), f"wgmma {i - 1}")  # wait_group(1)
            if i + stages - 1 < steps:
                yield load(i + stages - 1)
        yield wait(("mma", steps - 1, WARP_V2_HP), f"wgmma {steps - 1}")  # wait_group(0)
        yield op("sync")

    return simulate({WARP_V2_HP: warpgroup()})


def schedule_v2():
    """Both v2 kernels: {"blackwell": bars, "hopper": bars}."""
    return {"blackwell": schedule_v2_blackwell(), "hopper": schedule_v2_hopper()}


def _producer(steps, stages):
    """v3's producer warp: wait until slot j % stages is empty, then load step j into it.
    Its phase starts at 1, so its first trip round the ring does not wait; after that it
    waits until the consumer(s) freed the slot that step j - stages used."""
    for j in range(steps):
        if j >= stages:  # first trip: the wait for phase 1 passes at once
            yield wait(("freed", j - stages), f"empty[{j % stages}]")
        yield load(j)


def schedule_v3_blackwell(steps=STEPS, stages=STAGES, tile=TILE):
    """v3 Blackwell: a producer warp and an MMA warp. The MMA warp waits for a slot, issues
    the MMA and tcgen05.commit(empty_barriers[stage]) and goes on without waiting: the
    hardware frees the slot when the MMA finishes. A flush commit and wait end the loop."""
    cycles = mma_cycles(tile[0], tile[1], 64)

    def mma_warp():
        for i in range(steps):
            yield wait(("loaded", i), f"load {i}")
            yield mma(i, cycles, commit=("freed", i))
        yield op("commit")  # tcgen05.commit(flush_barrier)
        yield wait(("mma", steps - 1, MMA_WARP), "flush")

    return simulate({PRODUCER: _producer(steps, stages),
                     MMA_WARP: mma_warp()})


def schedule_v3_hopper(steps=STEPS, stages=STAGES, tile=TILE):
    """v3 Hopper: a producer warp and two consumer warpgroups, each multiplying its half of
    the A slot's rows by the whole B slot. A consumer releases the previous step's slot
    (one thread of each arrives on empty_barriers, 2 complete it) after wait_group(1) of
    the next step; wait_group(0) after the loop is the flush."""
    cycles = mma_cycles(tile[0] // 2, tile[1], 64)

    def consumer(c):
        lane = CONSUMERS[c]
        for i in range(steps):
            yield wait(("loaded", i), f"load {i}")
            yield mma(i, cycles, label=f"{i}{CONSUMER_TAGS[c]}")
            if i > 0:
                yield wait(("mma", i - 1, lane), f"wgmma {i - 1}")  # wait_group(1)
                yield op("arrive", arrive=("freed", i - 1), step=i - 1)
        yield wait(("mma", steps - 1, lane), "flush")  # wait_group(0)

    return simulate({PRODUCER: _producer(steps, stages),
                     CONSUMERS[0]: consumer(0), CONSUMERS[1]: consumer(1)},
                    arrivals={"freed": 2})


def schedule_v3():
    """Both v3 kernels: {"blackwell": bars, "hopper": bars}."""
    return {"blackwell": schedule_v3_blackwell(), "hopper": schedule_v3_hopper()}


def schedule_v5_hopper(tiles=V5_TILES, steps=V5_STEPS, stages=V5_STAGES, tile=V5_TILE, overlap=True):
    """v5 Hopper: one persistent block walks `tiles` tiles of `steps` K steps each.

    K steps are numbered across tiles: step g is step g % steps of tile g // steps, in slot
    g % stages (every tile takes whole trips round the ring, so each starts at slot 0).
    The producer warp runs on from tile to tile: it refills a slot once both consumer
    warpgroups released it, whichever tile that slot held. Each consumer runs v3's K loop,
    releases its last slot after wait_group(0), and then takes its turn with the one
    output tile s_c: warpgroup 0 first; each writes its rows (EPILOGUE_WRITE), fences and
    syncs, issues the TMA store, waits until the TMA engine has read s_c and arrives on the
    other warpgroup's s_c_free. With overlap (v5) a warpgroup goes on to its next tile at
    once; without (as in v4, where a block ends with its tile), the producer waits until
    both warpgroups have stored the last tile (the model's "tile_done") before it loads the
    next one.
    """
    assert steps % stages == 0, "v5 pads K to whole trips round the ring"
    cycles = mma_cycles(tile[0] // 2, tile[1], 64)

    def producer():
        for t in range(tiles):
            if not overlap and t > 0:
                yield wait(("tile_done", t - 1), "tile_done")
            for j in range(steps):
                g = t * steps + j
                if g >= stages:  # first trip: the wait for phase 1 passes at once
                    yield wait(("freed", g - stages), f"empty[{g % stages}]")
                yield load(g, label=f"{t}.{j}")

    def consumer(c):
        lane = CONSUMERS[c]
        for t in range(tiles):
            for j in range(steps):
                g = t * steps + j
                yield wait(("loaded", g), f"load {t}.{j}")
                yield mma(g, cycles, label=f"{j}{CONSUMER_TAGS[c]}")
                if j > 0:
                    yield wait(("mma", g - 1, lane), "")  # wait_group(1)
                    yield op("arrive", arrive=("freed", g - 1), step=g - 1)
            last = t * steps + steps - 1
            yield wait(("mma", last, lane), "flush")  # wait_group(0)
            yield op("arrive", arrive=("freed", last), step=last)
            # 5. epilogue: warpgroup 0's first turn passes at once (its phase starts at 1)
            if c == 1 or t > 0:
                yield wait(("c_free", c, t), f"s_c_free[{c}]")
            yield work("write", EPILOGUE_WRITE, str(t), step=t)
            yield op("sync")  # fence.proxy_async, then the warpgroup's sync
            yield store(("stored", c, t), f"{t}{CONSUMER_TAGS[c]}")
            yield wait(("stored", c, t), "read")  # tma.wait_group(0, read=True)
            # warpgroup 0 hands s_c to warpgroup 1 for this tile, warpgroup 1 back for the next
            yield op("arrive", arrive=("c_free", 1 - c, t + c))
            if not overlap:
                yield op("arrive", arrive=("tile_done", t))

    return simulate({PRODUCER: producer(), CONSUMERS[0]: consumer(0), CONSUMERS[1]: consumer(1)},
                    arrivals={"freed": 2, "tile_done": 2})


def schedule_v5():
    """v5 Hopper with and without the overlapped epilogue: {"overlap": bars, "no overlap": bars}."""
    return {"overlap": schedule_v5_hopper(), "no overlap": schedule_v5_hopper(overlap=False)}


def total(bars):
    """Model cycles from the first issue to the end of the last bar."""
    return max(_end(b) for b in bars)


def tensor_busy(bars):
    """Fraction of the total time the tensor cores run an MMA (MMAs never overlap)."""
    return sum(b.duration for b in bars if b.lane == TC) / total(bars)


# ---------------------------------------------------------------------------------------
# Drawing


def _sub_rows(bars):
    """Give each bar the first sub-row where it overlaps no other, so overlaps stay visible."""
    row_ends = []
    rows = []
    for bar in bars:
        for k, end in enumerate(row_ends):
            if end <= bar.start:
                row_ends[k] = _end(bar)
                rows.append(k)
                break
        else:
            row_ends.append(_end(bar))
            rows.append(len(row_ends) - 1)
    return rows, max(len(row_ends), 1)


BLUE, ORANGE, LIGHT_ORANGE, DARK = "#4C78A8", "#F58518", "#FFBF79", "#404040"
GREEN, TEAL = "#54A24B", "#72B7B2"  # v5's epilogue: the write to shared memory, the TMA store
# a wait takes a pale shade of what it waits for: a load, an MMA, or a slot to be emptied;
# in v5 also the output tile (its turn with s_c, or tile_done) or the TMA store's read
WAIT_FACE = {"loaded": "#C9D7E8", "mma": "#FBDDBD", "freed": "#D9D9D9",
             "c_free": "#CDE6C9", "tile_done": "#E5D4E8", "stored": "#D2EAE8"}
LEGEND = (  # (kind, what) of the bars it explains, face, text
    (("load", "load"), BLUE, "TMA load of one K step"),
    (("mma", "mma"), ORANGE, "MMA on the tensor cores"),
    (("work", "write"), GREEN, "registers -> shared"),
    (("store", "store"), TEAL, "TMA store (read)"),
    (("issue", None), DARK, "a role issues: load, MMA, sync, arrive"),
    (("wait", "loaded"), WAIT_FACE["loaded"], "waits for a load"),
    (("wait", "mma"), WAIT_FACE["mma"], "waits for an MMA"),
    (("wait", "freed"), WAIT_FACE["freed"], "waits for an empty slot"),
    (("wait", "c_free"), WAIT_FACE["c_free"], "waits for the output tile"),
    (("wait", "stored"), WAIT_FACE["stored"], "waits for the store's read"),
    (("wait", "tile_done"), WAIT_FACE["tile_done"], "waits for both stores"),
)
LEGEND_COLUMNS = 4  # entries per legend row when they do not fit on one (six do)


def _style(bar):
    """face colour, text colour, label size of a bar"""
    if bar.kind == "load":
        return BLUE, "white", 7
    if bar.kind == "store":
        return TEAL, "black", 6
    if bar.kind == "work":
        return GREEN, "white", 6
    if bar.kind == "mma":
        return (LIGHT_ORANGE if bar.by == CONSUMERS[1] else ORANGE), "black", 7
    if bar.kind == "wait":
        return WAIT_FACE[bar.what], DARK, 6
    return DARK, DARK, 6  # a role issuing an operation


WIDTH = 10.0  # inches
LEFT, RIGHT = 1.2, 0.2  # inches beside the axes (lane names on the left)
LANE_INCHES = 0.4  # height of one lane
GAP, FOOTER = 0.55, 0.45  # inches: between panels, below the last (x label)
LANE_HEIGHT = 0.8  # of a lane's unit height: the bars' share


def _draw_panel(fig, rect, bars, lanes, title, xmax):
    ax = fig.add_axes(rect)
    ax.set_xlim(0, xmax)
    ax.set_ylim(-0.5, len(lanes) - 0.5)
    renderer = fig.canvas.get_renderer()
    for lane_index, lane in enumerate(lanes):
        y_top = len(lanes) - 1 - lane_index + LANE_HEIGHT / 2
        lane_bars = sorted((b for b in bars if b.lane == lane), key=lambda b: (b.start, b.label))
        rows, n_rows = _sub_rows(lane_bars)
        height = LANE_HEIGHT / n_rows
        for bar, row in zip(lane_bars, rows):
            face, color, size = _style(bar)
            y = y_top - (row + 1) * height
            ax.broken_barh([(bar.start, bar.duration)], (y, height * 0.9), facecolors=face,
                           edgecolors=face if bar.kind == "issue" else "white", linewidth=0.5)
            if not bar.label:
                continue
            text = ax.text(bar.start + bar.duration / 2, y + height * 0.45, bar.label,
                           ha="center", va="center", fontsize=size if n_rows < 3 else 6,
                           color=color)
            # Short bars (the x range is v1's long total) drop a label rather than spill it.
            (x0, _), (x1, _) = ax.transData.transform([(bar.start, 0), (_end(bar), 0)])
            if text.get_window_extent(renderer).width > (x1 - x0) * 0.95:
                text.remove()
    ax.set_yticks(range(len(lanes)), list(reversed(lanes)), fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    ax.tick_params(axis="y", length=0)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.set_title(title, loc="left", fontsize=8.5, fontweight="bold", pad=4)
    ax.set_title(f"{total(bars)} cycles, tensor cores busy {tensor_busy(bars):.0%}",
                 loc="right", fontsize=8, pad=4)
    return ax


def _draw(panels, title, subtitle, xmax, path):
    """panels: [(bars, lanes, panel title)], drawn one above the other."""
    heights = [len(lanes) * LANE_INCHES + 0.1 for _, lanes, _ in panels]
    shown = {(b.kind, b.what if b.kind != "issue" else None) for bars, _, _ in panels for b in bars}
    handles = [matplotlib.patches.Patch(facecolor=face, label=text)
               for key, face, text in LEGEND if key in shown]
    columns = len(handles) if len(handles) <= 6 else LEGEND_COLUMNS
    legend_rows = -(-len(handles) // columns)
    # inches: title, subtitle lines, legend
    header = 0.85 + 0.15 * len(subtitle) + 0.17 * (legend_rows - 1)
    height = header + sum(heights) + GAP * (len(panels) - 1) + FOOTER
    fig = plt.figure(figsize=(WIDTH, height))
    fig.text(LEFT / WIDTH, 1 - 0.2 / height, title, fontsize=10, fontweight="bold", va="center")
    for n, line in enumerate(subtitle):
        fig.text(LEFT / WIDTH, 1 - (0.4 + 0.15 * n) / height, line, fontsize=7.5, color=DARK,
                 va="center")
    legend_y = 0.45 + 0.15 * len(subtitle) + 0.085 * (legend_rows - 1)  # inches from the top
    fig.legend(handles=handles, loc="center left", ncol=columns,
               frameon=False, fontsize=7, bbox_to_anchor=(LEFT / WIDTH - 0.01, 1 - legend_y / height),
               handlelength=1.2, columnspacing=1.0, borderaxespad=0)
    y = height - header
    for (bars, lanes, panel_title), h in zip(panels, heights):
        y -= h
        ax = _draw_panel(fig, (LEFT / WIDTH, y / height, 1 - (LEFT + RIGHT) / WIDTH, h / height),
                         bars, lanes, panel_title, xmax)
        y -= GAP
    ax.set_xlabel("cycles (model)", fontsize=8)
    svg = Path(path).suffix == ".svg"
    fig.savefig(path, format=Path(path).suffix[1:], metadata={"Date": None} if svg else None)
    plt.close(fig)


def _constants(ring, consumers=False):
    """The subtitle: the model's constants, one line each; consumers: v3's two on Hopper."""
    m, n = TILE
    lines = [(f"Schematic model, not a measurement, with H100 numbers for both GPUs: a load takes "
              f"{LOAD} cycles (~1 us at {CLOCK_GHZ} GHz)."),
             (f"An m x n x k MMA takes 2*m*n*k / {FLOP_PER_CYCLE} cycles: "
              f"one {m}x{n}x64 K step {mma_cycles(m, n, 64)}.")]
    if consumers:
        lines.append(f"On Hopper that is two {m // 2}x{n}x64 wgmmas of {mma_cycles(m // 2, n, 64)}, "
                     "one per consumer warpgroup: 3a and 3b are step 3 of warpgroup 0 and 1.")
    lines.append(f"Issuing an operation: {ISSUE} cycles. {STEPS} K steps"
                 + (f", a ring of {STAGES} slots" if ring else "")
                 + f". The v1, v2 and v3 figures share their x axis and their {m} x {n} tile.")
    return lines


def _constants_v5():
    """v5's subtitle: the constants it shares with v3, then the epilogue's and the tiles'."""
    m, n = V5_TILE
    return [(f"Schematic model, not a measurement, H100 numbers: a load takes {LOAD} cycles "
             f"(~1 us at {CLOCK_GHZ} GHz), a {m // 2}x{n}x64 wgmma {mma_cycles(m // 2, n, 64)}, "
             f"issuing an operation {ISSUE}."),
            (f"A warpgroup's epilogue: registers -> shared {EPILOGUE_WRITE} cycles (green, numbered "
             f"by tile), then the TMA store reads its 32 KiB rows out of shared memory in {STORE_READ}."),
            (f"One persistent block, {V5_TILES} tiles of {V5_STEPS} K steps each (one trip round a "
             f"ring of {V5_STAGES} slots; real tiles take many): load 1.2 is step 2 of tile 1,"),
            "and 2a, 2b are the wgmmas of warpgroup 0 and 1 for step 2 of the tile they work on."]


def figures():
    """(name, title, subtitle lines, [(bars, lanes, panel title)]) of each figure."""
    v2, v3, v5 = schedule_v2(), schedule_v3(), schedule_v5()
    return (
        ("timeline_v1", "v1: load a K step, then multiply it, one after the other",
         _constants(False),
         [(schedule_v1(), (TMA, TC, WARP),
           "Blackwell and Hopper alike: wait for the load, multiply, wait for the MMA")]),
        ("timeline_v2", f"v2: a ring of {STAGES} slots; the warps that issue the MMAs also issue the loads",
         _constants(True),
         [(v2["blackwell"], (TMA, TC, WARP_V2_BW),
           f"Blackwell: one warp waits for every MMA, then refills its slot with the step {STAGES} ahead"),
          (v2["hopper"], (TMA, TC, WARP_V2_HP),
           "Hopper: wait_group(1) keeps one wgmma in flight, then refill the previous step's slot")]),
        ("timeline_v3", "v3: warp specialised: a producer warp loads, consumers multiply (v2's tile and ring)",
         _constants(True, consumers=True),
         [(v3["blackwell"], (PRODUCER, TMA, TC, MMA_WARP),
           "Blackwell: one MMA warp; tcgen05.commit frees a slot when its MMA ends"),
          (v3["hopper"], (PRODUCER, TMA, TC) + CONSUMERS,
           "Hopper: two consumer warpgroups free a slot after the next step's wait_group(1)")]),
        ("timeline_v5", "v5 (Hopper): a persistent block; one warpgroup's epilogue under the other's MMAs",
         _constants_v5(),
         [(v5["overlap"], (PRODUCER, TMA, TC) + CONSUMERS,
           "v5: warpgroup 0 multiplies the next tile while 1 stores"),
          (v5["no overlap"], (PRODUCER, TMA, TC) + CONSUMERS,
           "as in v4: the next tile's loads wait for both stores")]),
    )


FIGURES = Path(__file__).resolve().parent / "figures"
ROOT = Path(__file__).resolve().parent.parent


def main(out_dir=FIGURES, suffix=".svg"):
    """Write the figures into out_dir (suffix .png for a preview); returns their paths."""
    plt.rcParams["svg.hashsalt"] = "gemm-timeline"  # fixed ids: reruns give identical files
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    xmax = total(schedule_v1())  # one x range for v1-v3 so they compare at a glance
    paths = []
    for name, title, subtitle, panels in figures():
        path = out_dir / f"{name}{suffix}"
        # v5 draws several tiles: its panels share an x range of their own
        shown = max(total(bars) for bars, _, _ in panels) if name == "timeline_v5" else xmax
        _draw(panels, title, subtitle, shown, path)
        paths.append(path)
    return paths


if __name__ == "__main__":
    for written in main():
        shown = written.resolve()
        print(f"wrote {shown.relative_to(ROOT) if shown.is_relative_to(ROOT) else shown}")
