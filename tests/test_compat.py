"""Each tilus 0.2.0 workaround in compat.py is still needed: with it off, its defect shows.

When one of these fails after a tilus upgrade, that defect is fixed upstream: delete the
workaround and its test. Each build runs in a fresh interpreter with an empty cache: tilus
IR is the same with and without the workarounds, so anything built earlier in this
process (tilus memoises program directories) would hide the defect.
"""

import json
import os
import subprocess
import sys

import pytest
from conftest import overlaps, shared_memory_map

import compat
import harness

pytestmark = pytest.mark.skipif(not compat.needed(), reason=f"the defects are those of tilus {compat.AFFECTED_TILUS}")


def build_as_released(workaround: str, stage: str, arch: str, tmp_path, schedule: dict | None = None) -> list[dict]:
    pin = f"kernel.debug_schedule = {schedule!r}" if schedule else ""
    code = f"""
import json, compat, harness, {stage}
kernel = {stage}.KERNELS[{arch!r}]
{pin}
with compat.disabled({workaround!r}):
    results = harness.build_schedules(kernel, {arch!r}, progress=lambda line: None)
print(json.dumps([{{"error": r.error, "module_dir": str(r.module_dir)}} for r in results]))
"""
    env = os.environ | {"MATMUL_TUTORIAL_CACHE": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=harness.REPO, env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", sorted(compat._WORKAROUNDS))
def test_workaround_is_installed(name):
    assert compat.installed(name)


def test_defect_1_hopper_tma_load_gets_blackwell_qualifier(tmp_path):
    (result,) = build_as_released("hopper_tma_cta_group", "matmul_v1", "hopper", tmp_path, dict(block_m=128, block_n=128, block_k=64))
    assert "Feature '.cta_group::1' not supported on .target 'sm_90a'" in result["error"]


def test_defect_2_loop_invariant_hoisting_asserts(tmp_path):
    # it depends on what the process transpiled before, so build the whole space as CI does
    results = build_as_released("hoisting_empty_let", "matmul_v2", "blackwell", tmp_path)
    assert any("hoist_loop_invariants" in r["error"] and "AssertionError" in r["error"] for r in results)


def test_defect_3_barriers_land_on_freed_tiles(tmp_path):
    schedule = dict(block_m=128, block_n=128, block_k=64, stages=2)
    (result,) = build_as_released("barriers_above_peak", "matmul_v2", "hopper", tmp_path, schedule)
    assert not result["error"], result["error"]
    source = open(os.path.join(result["module_dir"], "source.cu")).read()
    tiles, barriers, _ = shared_memory_map(source)
    assert any(overlaps(tile, barriers) for tile in tiles), (tiles, barriers)
