"""The schematic timeline model behind docs/figures/timeline_v*.svg."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "docs" / "timeline.py"
spec = importlib.util.spec_from_file_location("timeline", SCRIPT)
timeline = importlib.util.module_from_spec(spec)
spec.loader.exec_module(timeline)


def bars_of(bars, unit):
    return sorted((start, start + duration) for u, start, duration, _ in bars if u == unit)


def overlaps(a, b):
    return a[0] < b[1] and b[0] < a[1]


def test_v1_never_overlaps_loads_and_mmas():
    bars = timeline.schedule_v1()
    for load in bars_of(bars, timeline.TMA):
        for mma in bars_of(bars, timeline.TC):
            assert not overlaps(load, mma)


def test_v2_overlaps_some_load_with_some_mma():
    bars = timeline.schedule_v2()
    assert any(overlaps(load, mma)
               for load in bars_of(bars, timeline.TMA) for mma in bars_of(bars, timeline.TC))


def test_v3_mmas_run_back_to_back_once_the_ring_is_full():
    mmas = bars_of(timeline.schedule_v3(), timeline.TC)
    assert len(mmas) == timeline.STEPS
    for i in range(timeline.STAGES, timeline.STEPS):
        assert mmas[i][0] == mmas[i - 1][1]


def test_each_stage_is_faster_than_the_last():
    v1, v2, v3 = (timeline.total(s()) for s in
                  (timeline.schedule_v1, timeline.schedule_v2, timeline.schedule_v3))
    assert v1 > v2 > v3


def test_main_writes_three_identical_svgs_on_every_run(tmp_path):
    first = [p.read_bytes() for p in timeline.main(tmp_path / "a")]
    second = [p.read_bytes() for p in timeline.main(tmp_path / "b")]
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "timeline_v1.svg", "timeline_v2.svg", "timeline_v3.svg"]
    assert all(svg.startswith(b"<?xml") for svg in first)
    assert first == second
