"""CPU (CI): every schedule of every kernel builds for its architecture, as the GPU would run it."""

import importlib

import pytest
from conftest import ARCHS, STAGES, overlaps, shared_memory_map

from support import dispatch, gpu

pytestmark = pytest.mark.parametrize("arch", ARCHS)


@pytest.mark.parametrize("stage", STAGES)
def test_every_schedule_builds(built, stage, arch):
    # tilus' autotuner silently drops schedules that fail to build: count them here
    results = built(stage, arch)
    kernel = importlib.import_module(stage).KERNELS[arch]
    assert len(results) == dispatch.space_size(kernel)
    failed = {dispatch.format_schedule(r.schedule): r.error.strip().splitlines()[-1] for r in results if not r.ok}
    assert not failed, f"{kernel.__name__} schedules that do not build for {gpu.ARCHS[arch].sm}: {failed}"


@pytest.mark.parametrize("stage", STAGES)
def test_tensor_core_instructions_no_local_memory_no_ptxas_warnings(built, stage, arch):
    instruction = gpu.ARCHS[arch].mma_instruction
    for r in built(stage, arch):
        schedule = dispatch.format_schedule(r.schedule)
        assert r.mma_count > 0, f"{schedule}: no {instruction} in the PTX"
        # spills or a stack frame put registers in local memory, and ptxas warns when it
        # serialises wgmma (C7515) or drops setmaxnreg (C7508): each a silent slowdown
        assert (r.spill_bytes, r.stack_bytes) == (0, 0), f"{schedule}: {r.describe(gpu.ARCHS[arch])}"
        assert not r.ptxas_warnings, f"{schedule}: {r.ptxas_warnings}"


@pytest.mark.parametrize("stage", STAGES)
def test_shared_memory_fits_what_the_kernel_uses(built, stage, arch):
    # tilus 0.2.0 could under-allocate shared memory (Blackwell) and could put barriers on
    # top of tiles (compat defect 3): check each kernel's map of shared memory
    for r in built(stage, arch):
        tiles, barriers, dynamic = shared_memory_map((r.module_dir / "source.cu").read_text())
        schedule = dispatch.format_schedule(r.schedule)
        assert tiles, schedule
        assert all(offset + size <= dynamic for offset, size in [*tiles, barriers]), (schedule, tiles, barriers, dynamic)
        assert not any(overlaps(tile, barriers) for tile in tiles), (schedule, tiles, barriers)
