"""CPU (CI): every schedule of every kernel builds for its architecture, as the GPU would run it."""

import importlib
import re

import pytest
import tilus
from conftest import BLACKWELL_VERSIONS, KERNEL_MODULES, REGISTER_SPLIT_SCHEDULE, VERSIONS, overlaps, shared_memory_map

from support import build, dispatch, gpu


@pytest.mark.parametrize("version, arch", KERNEL_MODULES)
def test_every_schedule_builds(built, version, arch):
    # tilus' autotuner silently drops schedules that fail to build: count them here
    results = built(version, arch)
    kernel = importlib.import_module(version).KERNELS[arch]
    assert len(results) == dispatch.space_size(kernel)
    failed = {dispatch.format_schedule(r.schedule): r.error.strip().splitlines()[-1] for r in results if not r.ok}
    assert not failed, f"{kernel.__name__} schedules that do not build for {gpu.ARCHS[arch].sm}: {failed}"


@pytest.mark.parametrize("version, arch", KERNEL_MODULES)
def test_tensor_core_instructions_no_local_memory_no_ptxas_warnings(built, version, arch):
    instruction = gpu.ARCHS[arch].mma_instruction
    for r in built(version, arch):
        schedule = dispatch.format_schedule(r.schedule)
        assert r.mma_count > 0, f"{schedule}: no {instruction} in the PTX"
        # spills or a stack frame put registers in local memory, and ptxas warns when it
        # serialises wgmma (C7515) or drops setmaxnreg (C7508): each a silent slowdown
        assert (r.spill_bytes, r.stack_bytes) == (0, 0), f"{schedule}: {r.describe(gpu.ARCHS[arch])}"
        assert not r.ptxas_warnings, f"{schedule}: {r.ptxas_warnings}"


@pytest.mark.parametrize("version", VERSIONS)
def test_each_wgmma_is_as_wide_as_the_tile(built, version):
    # compat defect 7: without its workaround a 224-column tile issues seven 32-wide wgmmas
    for r in built(version, "hopper"):
        widths = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k", (r.module_dir / "source.ptx").read_text()))
        assert widths == {str(r.schedule["block_n"])}, f"{dispatch.format_schedule(r.schedule)}: wgmma N {widths}"


@pytest.mark.parametrize("version, arch", KERNEL_MODULES)
def test_bf16_builds_with_bf16_tensor_core_instructions(version, arch):
    # one kernel source per architecture, built for bf16 by its dtype argument. The newest
    # version's every tile, ring and cluster at its first group_m (group_m only sets the tile
    # order's divisors), the first schedule of each other: all of them would double CI's builds
    kernel = importlib.import_module(version).KERNELS[arch]
    group_ms = kernel._autotune_space.get("group_m", [None])
    newest = version == (VERSIONS if arch == "hopper" else BLACKWELL_VERSIONS)[-1]
    results = build.build_schedules(kernel, arch, progress=lambda line: None, script_kwargs={"dtype": tilus.bfloat16},
                                    limit=None if newest else 1,
                                    select=(lambda schedule: schedule.get("group_m") == group_ms[0]) if newest else None)
    assert len(results) == (dispatch.space_size(kernel) // len(group_ms) if newest else 1)
    for r in results:
        schedule = dispatch.format_schedule(r.schedule)
        assert r.ok and r.mma_count > 0, f"{schedule}: {r.describe(gpu.ARCHS[arch])}"
        assert (r.spill_bytes, r.stack_bytes, r.ptxas_warnings) == (0, 0, []), f"{schedule}: {r.describe(gpu.ARCHS[arch])}"
        source = (r.module_dir / "source.cu").read_text()
        assert "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16" in source and "CU_TENSOR_MAP_DATA_TYPE_FLOAT16" not in source
        if arch == "hopper":
            mmas = re.findall(r"wgmma\.mma_async\S*", (r.module_dir / "source.ptx").read_text())
            assert mmas and all(mma.endswith(".f32.bf16.bf16") for mma in mmas), (schedule, set(mmas))
        else:
            # tcgen05's instruction descriptor (kind::f16): A's type in bits 7-9, B's in 10-12, bf16 = 1
            descriptors = {int(d) for d in re.findall(r"kind_f16_a_shared\([^,]+, a_desc, b_desc, (\d+),", source)}
            assert descriptors and all((d >> 7) & 7 == 1 and (d >> 10) & 7 == 1 for d in descriptors), descriptors


def test_register_split_keeps_setmaxnreg(built):
    # v8's stream-K 128 x 256 schedule splits the registers (a producer warpgroup at 40, the
    # consumers at 232): ptxas must keep every setmaxnreg (no C7508; the space-wide tests also
    # refuse any warning and spill), which needs compat defect 5's minimum-blocks hint
    (r,) = [r for r in built("matmul_v8", "hopper") if r.schedule.items() >= REGISTER_SPLIT_SCHEDULE.items()]
    ptx = (r.module_dir / "source.ptx").read_text()
    assert "setmaxnreg.dec.sync.aligned.u32 40" in ptx and "setmaxnreg.inc.sync.aligned.u32 232" in ptx
    assert "__launch_bounds__(384, 1)" in (r.module_dir / "source.cu").read_text()


@pytest.mark.parametrize("version, arch", KERNEL_MODULES)
def test_shared_memory_fits_what_the_kernel_uses(built, version, arch):
    # tilus 0.2.0 could under-allocate shared memory (Blackwell) and could put barriers on
    # top of tiles (compat defect 3): check each kernel's map of shared memory
    for r in built(version, arch):
        tiles, barriers, dynamic = shared_memory_map((r.module_dir / "source.cu").read_text())
        schedule = dispatch.format_schedule(r.schedule)
        assert tiles, schedule
        assert all(offset + size <= dynamic for offset, size in [*tiles, barriers]), (schedule, tiles, barriers, dynamic)
        assert not any(overlaps(tile, barriers) for tile in tiles), (schedule, tiles, barriers)


@pytest.mark.parametrize("version, arch", KERNEL_MODULES)
def test_launch_function_sets_the_shared_memory_limit_once_per_device(built, version, arch):
    # compat defect 6: tilus 0.2.0 asks the driver twice on every call
    for r in built(version, arch):
        source = (r.module_dir / "source.cu").read_text()
        launch = source[source.index("DLL void tilus_launch"):]
        calls = launch.count("cudaFuncSetAttribute(")
        assert calls == launch.count("tilus_smem_limit_set[tilus_device] < "), dispatch.format_schedule(r.schedule)
