"""The schematic timeline model behind docs/figures/timeline_v*.svg.

Each test states a property of one kernel's K loop as matmul_v*.py writes it, and checks
that the model's schedule has it, for the drawn ring depth and for the others in the
kernels' autotune spaces.
"""

import importlib.util
import itertools
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "docs" / "timeline.py"
spec = importlib.util.spec_from_file_location("timeline", SCRIPT)
timeline = importlib.util.module_from_spec(spec)
spec.loader.exec_module(timeline)

TMA, TC = timeline.TMA, timeline.TC
RINGS = (2, 3, 4)  # ring depths to check besides the drawn one
STEPS = timeline.STEPS


def end(bar):
    return bar.start + bar.duration


def overlaps(a, b):
    return a.start < end(b) and b.start < end(a)


def loads(bars):
    return {b.step: b for b in bars if b.lane == TMA}


def mmas(bars):
    return sorted((b for b in bars if b.lane == TC), key=lambda b: b.start)


def issues(bars, what):
    """{(step, role): the bar of the role issuing `what` for that step}"""
    return {(b.step, b.lane): b for b in bars if b.kind == "issue" and b.what == what}


def in_flight(intervals, cycle):
    return sum(start <= cycle < stop for start, stop in intervals)


def most_in_flight(intervals, window):
    """The most intervals (start, stop) that overlap at any one cycle inside window."""
    lo, hi = window
    points = {lo} | {start for start, _ in intervals if lo <= start < hi}
    return max(in_flight(intervals, p) for p in points)


def outstanding_mmas(bars):
    """(issued, finished) of every MMA: from the end of its issue to the end of its run."""
    issued = issues(bars, "mma")
    return [(end(issued[m.step, m.by]), end(m)) for m in mmas(bars)]


def lane_of(bars, lane):
    return [b for b in bars if b.lane == lane]


# ---------------------------------------------------------------------------------------
# The constants


def test_constants_are_the_stated_arithmetic():
    # 989 TFLOPS dense fp16 over 132 SMs at 1.83 GHz is ~4096 FLOP per cycle per SM
    assert abs(989e12 / (132 * timeline.CLOCK_GHZ * 1e9) - timeline.FLOP_PER_CYCLE) < 0.01 * 4096
    # one 128x128x64 step: 2 * 128 * 128 * 64 FLOP / 4096 FLOP per cycle = 512 cycles
    assert timeline.MMA == 2 * 128 * 128 * 64 // 4096 == 512
    # a ~1 us load is 1e-6 s * 1.83e9 cycles/s = 1830 cycles; the model rounds to 1800
    assert abs(timeline.LOAD - 1e-6 * timeline.CLOCK_GHZ * 1e9) < 50
    # v3's 128x256 step is twice that; on Hopper each consumer's 64x256x64 wgmma is 512
    assert timeline.mma_cycles(128, 256, 64) == 1024
    assert timeline.mma_cycles(64, 256, 64) == 512


def test_the_constants_reach_the_subtitles():
    for _, _, subtitle, _ in timeline.figures():
        text = " ".join(subtitle)
        assert "not a measurement" in text
        assert f"{timeline.LOAD} cycles" in text and "~1 us" in text


SCHEDULES = {"v1": (timeline.schedule_v1, 1), "v2 blackwell": (timeline.schedule_v2_blackwell, 1),
             "v2 hopper": (timeline.schedule_v2_hopper, 1), "v3 blackwell": (timeline.schedule_v3_blackwell, 1),
             "v3 hopper": (timeline.schedule_v3_hopper, 2)}


@pytest.mark.parametrize("name", SCHEDULES)
def test_every_step_is_loaded_once_and_multiplied_once_per_consumer(name):
    schedule, consumers = SCHEDULES[name]
    bars = schedule()
    assert sorted(b.step for b in bars if b.lane == TMA) == list(range(STEPS))
    assert sorted(b.step for b in bars if b.lane == TC) == sorted(list(range(STEPS)) * consumers)
    runs = mmas(bars)  # the tensor cores run one MMA at a time
    assert all(end(a) <= b.start for a, b in itertools.pairwise(runs))
    step_loaded = {b.step: end(b) for b in bars if b.lane == TMA}
    assert all(m.start >= step_loaded[m.step] for m in runs)


# ---------------------------------------------------------------------------------------
# v1


def test_v1_never_overlaps_a_load_with_an_mma():
    bars = timeline.schedule_v1()
    assert len(mmas(bars)) == len(loads(bars)) == STEPS
    for load in loads(bars).values():
        for mma in mmas(bars):
            assert not overlaps(load, mma)


def test_v1_multiplies_a_step_only_after_its_load_and_loads_only_after_the_last_mma():
    bars = timeline.schedule_v1()
    load, mma = loads(bars), {m.step: m for m in mmas(bars)}
    for i in range(STEPS):
        assert mma[i].start >= end(load[i])
        if i:
            assert load[i].start >= end(mma[i - 1])


# ---------------------------------------------------------------------------------------
# v2 Blackwell: one warp; waits for every MMA; refills the slot it just used


@pytest.mark.parametrize("stages", RINGS)
def test_v2_blackwell_has_at_most_stages_minus_1_loads_in_flight_during_an_mma(stages):
    bars = timeline.schedule_v2_blackwell(stages=stages)
    intervals = [(b.start, end(b)) for b in loads(bars).values()]
    during = [most_in_flight(intervals, (mma.start, end(mma))) for mma in mmas(bars)]
    # the slot the running MMA reads is refilled only after it, so the bound is reached
    assert max(during) == stages - 1


@pytest.mark.parametrize("stages", RINGS)
def test_v2_blackwell_waits_for_every_mma_before_the_next(stages):
    bars = timeline.schedule_v2_blackwell(stages=stages)
    runs = mmas(bars)
    issued = issues(bars, "mma")
    for before, after in itertools.pairwise(runs):
        assert issued[after.step, timeline.WARP_V2_BW].start >= end(before)
        assert after.start > end(before)  # so a gap opens between every two MMAs
    assert max(in_flight(outstanding_mmas(bars), m.start) for m in runs) == 1


@pytest.mark.parametrize("stages", RINGS)
def test_v2_blackwell_prologue_fills_every_slot(stages):
    bars = timeline.schedule_v2_blackwell(stages=stages)
    first_mma = mmas(bars)[0].start
    assert sorted(s for s, b in loads(bars).items() if b.start < first_mma) == list(range(stages))


# ---------------------------------------------------------------------------------------
# v2 Hopper: one warpgroup; wait_group(1); then refills the previous step's slot


@pytest.mark.parametrize("stages", RINGS)
def test_v2_hopper_overlaps_loads_with_mmas(stages):
    bars = timeline.schedule_v2_hopper(stages=stages)
    assert any(overlaps(load, mma) for load in loads(bars).values() for mma in mmas(bars))


@pytest.mark.parametrize("stages", RINGS)
def test_v2_hopper_keeps_at_most_one_wgmma_queued_behind_the_running_one(stages):
    bars = timeline.schedule_v2_hopper(stages=stages)
    outstanding = outstanding_mmas(bars)
    most = max(in_flight(outstanding, start) for start, _ in outstanding)
    assert most <= 2  # one runs, one may be queued
    # with 2 slots the next load is only issued after wait_group(1): nothing is ever queued
    assert most == (2 if stages > 2 else 1)


@pytest.mark.parametrize("stages", RINGS)
def test_v2_hopper_prologue_fills_all_slots_but_one_and_refills_a_step_late(stages):
    bars = timeline.schedule_v2_hopper(stages=stages)
    first_mma = mmas(bars)[0].start
    assert sorted(s for s, b in loads(bars).items() if b.start < first_mma) == list(range(stages - 1))
    # step j goes into the slot step j - stages used, once step j - stages + 1's wgmma is issued
    issued = issues(bars, "mma")
    for j, load in loads(bars).items():
        if j >= stages:
            assert load.start >= end(issued[j - stages + 1, timeline.WARP_V2_HP])


def test_the_two_v2_kernels_differ_in_what_the_figure_shows():
    v2 = timeline.schedule_v2()
    blackwell, hopper = (outstanding_mmas(v2[gpu]) for gpu in ("blackwell", "hopper"))
    assert max(in_flight(blackwell, s) for s, _ in blackwell) == 1
    assert max(in_flight(hopper, s) for s, _ in hopper) == 2
    (_, _, _, panels), = (f for f in timeline.figures() if f[0] == "timeline_v2")
    assert [title.split(":")[0] for _, _, title in panels] == ["Blackwell", "Hopper"]


# ---------------------------------------------------------------------------------------
# v3: a producer warp, and a consumer (Blackwell: MMA warp; Hopper: two warpgroups)

V3 = {"blackwell": (timeline.schedule_v3_blackwell, (timeline.MMA_WARP,)),
      "hopper": (timeline.schedule_v3_hopper, timeline.CONSUMERS)}


@pytest.mark.parametrize("gpu", V3)
def test_v3_producer_and_consumers_have_lanes_of_their_own(gpu):
    schedule, consumers = V3[gpu]
    bars = schedule()
    producer = lane_of(bars, timeline.PRODUCER)
    assert {b.what for b in producer if b.kind == "issue"} == {"load"}
    assert {b.what for b in producer if b.kind == "wait"} == {"freed"}  # empty barriers only
    for lane in consumers:
        consumer = lane_of(bars, lane)
        assert "load" not in {b.what for b in consumer if b.kind == "issue"}
        assert {b.what for b in consumer if b.kind == "wait"} <= {"loaded", "mma"}
        assert sum(b.what == "mma" for b in consumer if b.kind == "issue") == STEPS
    (_, _, _, panels), = (f for f in timeline.figures() if f[0] == "timeline_v3")
    (_, lanes, _), = (p for p in panels if p[2].lower().startswith(gpu))
    assert lanes == (timeline.PRODUCER, TMA, TC) + consumers


@pytest.mark.parametrize("gpu", V3)
@pytest.mark.parametrize("stages", RINGS)
def test_v3_producer_first_trip_round_the_ring_does_not_wait(gpu, stages):
    bars = V3[gpu][0](stages=stages)
    producer = lane_of(bars, timeline.PRODUCER)
    ring_full = end(issues(bars, "load")[stages - 1, timeline.PRODUCER])
    assert not [b for b in producer if b.kind == "wait" and b.start < ring_full]


@pytest.mark.parametrize("gpu", V3)
def test_v3_mmas_run_back_to_back_once_the_ring_is_full(gpu):
    # at the 128 x 256 tile v3 runs with on the H100 (v5's figure): two 1024-cycle steps cover a load
    bars = V3[gpu][0](tile=timeline.V5_TILE)
    runs = mmas(bars)
    first = next(n for n, m in enumerate(runs) if m.step == timeline.STAGES)
    for before, after in zip(runs[first - 1:], runs[first:]):
        assert after.start == end(before)


@pytest.mark.parametrize("gpu", V3)
@pytest.mark.parametrize("stages", RINGS + (timeline.STAGES,))
def test_v3_refills_a_slot_only_after_the_mmas_that_read_it_finished(gpu, stages):
    bars = V3[gpu][0](stages=stages)
    load = loads(bars)
    for j in range(stages, STEPS):
        readers = [m for m in mmas(bars) if m.step == j - stages]
        assert len(readers) == len(V3[gpu][1])  # every consumer read it
        assert issues(bars, "load")[j, timeline.PRODUCER].start >= max(end(m) for m in readers)
        assert load[j].start >= max(end(m) for m in readers)


@pytest.mark.parametrize("stages", RINGS)
def test_v3_blackwell_mma_warp_never_waits_for_an_mma_until_the_flush(stages):
    bars = timeline.schedule_v3_blackwell(stages=stages)
    waits = [b for b in lane_of(bars, timeline.MMA_WARP) if b.kind == "wait" and b.what == "mma"]
    assert [w.label for w in waits] == ["flush"]
    assert end(waits[0]) == end(mmas(bars)[-1]) == timeline.total(bars)


@pytest.mark.parametrize("stages", RINGS)
def test_v3_hopper_frees_a_slot_after_wait_group_1_of_the_next_step(stages):
    bars = timeline.schedule_v3_hopper(stages=stages)
    issued = issues(bars, "mma")
    arrives = issues(bars, "arrive")
    for lane in timeline.CONSUMERS:
        for i in range(STEPS - 1):
            # step i's slot is released only after step i + 1's wgmma was issued ...
            assert arrives[i, lane].start >= end(issued[i + 1, lane])
            # ... and step i's wgmma has finished (wait_group(1))
            (mma,) = (m for m in mmas(bars) if m.step == i and m.by == lane)
            assert arrives[i, lane].start >= end(mma)
        assert (STEPS - 1, lane) not in arrives  # nothing waits for the last slot
        # each consumer keeps one wgmma in flight besides the one it just issued
        own = [(end(issued[m.step, lane]), end(m)) for m in mmas(bars) if m.by == lane]
        assert max(in_flight(own, s) for s, _ in own) <= 2
        # the flush: wait_group(0) after the loop ends when the consumer's last wgmma does
        last = lane_of(bars, lane)[-1]
        assert last.kind == "wait" and last.label == "flush"
        assert end(last) == max(e for _, e in own)


# ---------------------------------------------------------------------------------------
# across the versions, and the files


def test_the_ring_keeps_the_tensor_cores_busier_and_v3_pays_with_its_larger_tile():
    v1 = timeline.tensor_busy(timeline.schedule_v1())
    v2 = {gpu: timeline.tensor_busy(b) for gpu, b in timeline.schedule_v2().items()}
    v3 = {gpu: timeline.tensor_busy(b) for gpu, b in timeline.schedule_v3().items()}
    assert v1 < min(v2.values())
    # at v2's tile and ring, as drawn, warp specialisation alone changes little: both wait for loads
    assert all(abs(v3[gpu] - v2[gpu]) < 0.02 for gpu in v2)
    # the 128 x 256 tile that v3's second consumer makes room for is what keeps them busier
    larger = [timeline.tensor_busy(V3[gpu][0](tile=timeline.V5_TILE)) for gpu in V3]
    assert max(v2.values()) + 0.2 < min(larger)


def test_main_writes_the_same_svgs_on_every_run(tmp_path):
    first = [p.read_bytes() for p in timeline.main(tmp_path / "a")]
    second = [p.read_bytes() for p in timeline.main(tmp_path / "b")]
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "timeline_v1.svg", "timeline_v2.svg", "timeline_v3.svg", "timeline_v5.svg"]
    assert all(svg.startswith(b"<?xml") for svg in first)
    assert first == second


# ---------------------------------------------------------------------------------------
# v5 Hopper: a persistent block; the producer runs on across tiles; the two consumer
# warpgroups take turns with one output tile, and (with overlap) go on to the next tile
# while the other stores

V5_TILES, V5_STEPS, V5_STAGES = timeline.V5_TILES, timeline.V5_STEPS, timeline.V5_STAGES
WG0, WG1 = timeline.CONSUMERS
OVERLAP = (True, False)


def v5(overlap=True, **kwargs):
    return timeline.schedule_v5_hopper(overlap=overlap, **kwargs)


def tile_of(step):
    return step // V5_STEPS


def epilogues(bars, lane):
    """{tile: (start, end)} of a consumer's epilogue: from its write to its arrive on s_c_free."""
    writes = {b.step: b for b in bars if b.lane == lane and b.kind == "work"}
    arrives = sorted((b for b in bars if b.lane == lane and b.kind == "issue" and b.what == "arrive"),
                     key=lambda b: b.start)
    spans = {}
    for tile, write in writes.items():
        # sync, store, wait for its read: the first arrive after the write hands s_c over
        handover = next(a for a in arrives if a.start >= end(write))
        assert handover.step is None  # not a slot's release
        spans[tile] = (write.start, end(handover))
    return spans


def busy_within(bars, window):
    """Cycles of the window (start, end) in which the tensor cores run an MMA."""
    lo, hi = window
    return sum(max(0, min(end(m), hi) - max(m.start, lo)) for m in mmas(bars))


def test_v5_constants_are_the_stated_arithmetic():
    # one consumer warpgroup's rows of C: 64 x 256 fp16 = 32 KiB, at 128 bytes a cycle
    assert timeline.STORE_READ == 64 * 256 * 2 // 128 == 256
    assert timeline.EPILOGUE_WRITE == 2 * timeline.STORE_READ
    # v5 pads K to whole trips round the ring: the drawn tiles take one trip each
    assert V5_STEPS % V5_STAGES == 0
    with pytest.raises(AssertionError):
        v5(steps=V5_STAGES + 1)


@pytest.mark.parametrize("overlap", OVERLAP)
def test_v5_every_step_of_every_tile_is_loaded_once_and_multiplied_by_both_warpgroups(overlap):
    bars = v5(overlap)
    steps = V5_TILES * V5_STEPS
    assert sorted(b.step for b in bars if b.kind == "load") == list(range(steps))
    assert sorted(b.step for b in bars if b.lane == TC) == sorted(list(range(steps)) * 2)
    runs = mmas(bars)
    assert all(end(a) <= b.start for a, b in itertools.pairwise(runs))  # one MMA at a time
    step_loaded = {b.step: end(b) for b in bars if b.kind == "load"}
    assert all(m.start >= step_loaded[m.step] for m in runs)
    # each warpgroup stores each tile once, after its last MMA of that tile
    for lane in timeline.CONSUMERS:
        last_mma = {t: max(end(m) for m in runs if m.by == lane and tile_of(m.step) == t) for t in range(V5_TILES)}
        assert sorted(epilogues(bars, lane)) == list(range(V5_TILES))
        for tile, (start, _) in epilogues(bars, lane).items():
            assert start >= last_mma[tile]
    assert sum(b.kind == "store" for b in bars) == 2 * V5_TILES


@pytest.mark.parametrize("overlap", OVERLAP)
@pytest.mark.parametrize("stages", (2, 4))
def test_v5_refills_a_slot_only_after_both_warpgroups_released_it(overlap, stages):
    bars = v5(overlap, stages=stages, steps=4)
    arrives = issues(bars, "arrive")
    load_issue = issues(bars, "load")
    for g in range(stages, V5_TILES * 4):
        released = [end(arrives[g - stages, lane]) for lane in timeline.CONSUMERS]
        readers = [m for m in mmas(bars) if m.step == g - stages]
        assert len(readers) == 2
        start = load_issue[g, timeline.PRODUCER].start
        assert start >= max(released) and start >= max(end(m) for m in readers)
    # every slot is released once per trip by each warpgroup, the last one after wait_group(0)
    for lane in timeline.CONSUMERS:
        assert sorted(step for step, who in arrives if who == lane and step is not None) == list(
            range(V5_TILES * 4))


def test_v5_overlap_loads_the_next_tile_before_warpgroup_1_has_stored_the_last():
    bars = v5()
    epilogue = epilogues(bars, WG1)
    for tile in range(V5_TILES - 1):
        first_load = min(b.start for b in bars if b.kind == "load" and tile_of(b.step) == tile + 1)
        assert first_load < epilogue[tile][1]
    # the producer never waits for a store: only for empty slots
    assert {b.what for b in lane_of(bars, timeline.PRODUCER) if b.kind == "wait"} == {"freed"}


def test_v5_without_overlap_loads_the_next_tile_only_after_both_stores():
    bars = v5(overlap=False)
    for tile in range(V5_TILES - 1):
        stored = max(epilogues(bars, lane)[tile][1] for lane in timeline.CONSUMERS)
        first_load = min(b.start for b in bars if b.kind == "load" and tile_of(b.step) == tile + 1)
        assert first_load >= stored


def test_v5_overlap_keeps_the_tensor_cores_busy_during_warpgroup_1s_epilogue():
    on, off = v5(), v5(overlap=False)
    for tile in range(V5_TILES - 1):
        # with overlap, warpgroup 0's MMAs of the next tile run while warpgroup 1 stores ...
        window = epilogues(on, WG1)[tile]
        assert busy_within(on, window) >= 0.9 * (window[1] - window[0])
        assert any(m.by == WG0 and tile_of(m.step) == tile + 1 and overlaps(m, timeline.Bar(
            WG1, window[0], window[1] - window[0], "", "", None, None, "")) for m in mmas(on))
        # ... without, no MMA runs during warpgroup 1's epilogue: the next tile is not loaded yet
        assert busy_within(off, epilogues(off, WG1)[tile]) == 0


@pytest.mark.parametrize("overlap", OVERLAP)
def test_v5_warpgroups_take_turns_with_the_output_tile(overlap):
    bars = v5(overlap)
    first, second = epilogues(bars, WG0), epilogues(bars, WG1)
    turns = sorted([*first.values(), *second.values()])
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(turns))  # never two writers of s_c
    for tile in range(V5_TILES):
        assert first[tile][1] <= second[tile][0]  # warpgroup 0 first
        if tile:
            assert second[tile - 1][1] <= first[tile][0]
    # only warpgroup 0's first turn passes without waiting
    waits = [b for b in bars if b.kind == "wait" and b.what == "c_free"]
    assert all(b.lane == WG1 or b.start > first[0][0] for b in waits)


@pytest.mark.parametrize("steps", (4, 8))
def test_v5_overlap_finishes_the_same_work_earlier(steps):
    on, off = v5(steps=steps), v5(overlap=False, steps=steps)
    assert sorted((m.step, m.by) for m in mmas(on)) == sorted((m.step, m.by) for m in mmas(off))
    assert timeline.total(on) < timeline.total(off)
    assert timeline.tensor_busy(on) > timeline.tensor_busy(off)


def test_the_v5_figure_has_both_schedules():
    (_, _, subtitle, panels), = (f for f in timeline.figures() if f[0] == "timeline_v5")
    assert [title.split(":")[0] for _, _, title in panels] == ["v5", "as in v4"]
    assert all(lanes == (timeline.PRODUCER, TMA, TC) + timeline.CONSUMERS for _, lanes, _ in panels)
    text = " ".join(subtitle)
    assert f"{timeline.EPILOGUE_WRITE} cycles" in text and f"{V5_TILES} tiles of {V5_STEPS} K steps" in text



# ---------------------------------------------------------------------------------------
# v2 and v3 drawn alike, so their figures differ only in the warp specialisation


def test_v2_and_v3_are_drawn_with_the_same_tile_and_ring():
    v2, v3 = timeline.schedule_v2(), timeline.schedule_v3()
    for gpu in v2:
        for schedule in (v2[gpu], v3[gpu]):
            # the tensor-core cycles of each K step: one 128 x 128 MMA, or two 64 x 128 wgmmas on v3 Hopper
            per_step = {}
            for m in mmas(schedule):
                per_step[m.step] = per_step.get(m.step, 0) + m.duration
            assert per_step == {step: timeline.mma_cycles(*timeline.TILE, 64) for step in range(STEPS)}
        # the same ring: v3's producer fills the STAGES slots v2's prologue fills (all but one on Hopper)
        ahead = {name: sum(load.start < mmas(bars)[0].start for load in loads(bars).values())
                 for name, bars in (("v2", v2[gpu]), ("v3", v3[gpu]))}
        assert ahead == {"v2": timeline.STAGES - (gpu == "hopper"), "v3": timeline.STAGES}
    subtitles = {name: " ".join(subtitle) for name, _, subtitle, _ in timeline.figures()}
    for name in ("timeline_v2", "timeline_v3"):
        assert f"a ring of {timeline.STAGES} slots" in subtitles[name]
        assert "{} x {} tile".format(*timeline.TILE) in subtitles[name]


def test_v3_at_v2s_tile_still_waits_for_loads():
    # what docs/v3.md says of its figure: two 512-cycle steps queued behind a refill do not cover a load
    assert (timeline.STAGES - 1) * timeline.mma_cycles(*timeline.TILE, 64) < timeline.LOAD
    for schedule, _ in V3.values():
        runs = mmas(schedule())
        assert any(after.start > end(before) for before, after in itertools.pairwise(runs[timeline.STAGES:]))


def test_v2_hopper_refills_without_a_sync_in_the_loop():
    # matmul_v2.py: wait_group(1) speaks for the whole warpgroup, so the refill follows it directly
    bars = timeline.schedule_v2_hopper()
    syncs = [b for b in bars if b.kind == "issue" and b.what == "sync"]
    assert len(syncs) == 1 and syncs[0].start >= end(mmas(bars)[-1])  # the one after wait_group(0)
