"""CPU (CI): the Pipeline class and the grouped tile order build, and the order's Python model is a permutation."""

import importlib.util

import pytest
from probe_kernels import PipelineCopy, TileOrderProbe

from support import build, cache

RASTER = cache.REPO / "docs" / "raster.py"
spec = importlib.util.spec_from_file_location("raster", RASTER)
raster = importlib.util.module_from_spec(spec)
spec.loader.exec_module(raster)

# awkward grids of tiles: one tile, one row or column, a last group of every height, 7-multiples
GRIDS = [(1, 1), (1, 57), (57, 1), (5, 7), (7, 56), (33, 13), (128, 4), (17, 100)]


@pytest.mark.parametrize("stages", range(1, 7))
def test_pipeline_builds_for_every_ring_depth(stages):
    (result,) = build.build_schedules(
        PipelineCopy, "hopper", progress=lambda line: None, script_kwargs=dict(stages=stages), call_args=(37, 0, 0)
    )
    assert result.ok, result.error
    assert (result.spill_bytes, result.stack_bytes, result.ptxas_warnings) == (0, 0, [])


def test_tile_order_probe_builds():
    results = build.build_schedules(TileOrderProbe, "hopper", progress=lambda line: None, call_args=(7, 56, 0))
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]


@pytest.mark.parametrize("num_m, num_n", GRIDS)
@pytest.mark.parametrize("group_m", [1, 8, 16, 32])
def test_grouped_order_model_visits_every_tile_once(num_m, num_n, group_m):
    order = raster.grouped_order(num_m, num_n, group_m)
    assert sorted(order) == [(m, n) for m in range(num_m) for n in range(num_n)]


def test_traffic_table_in_v4_md_is_current(tmp_path):
    copy = tmp_path / "v4.md"
    copy.write_text(raster.PAGE.read_text())
    assert not raster.update_page(copy), "run python docs/raster.py"
