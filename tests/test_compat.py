"""Each tilus 0.2.0 workaround in support/compat.py is still needed: with it off, its defect shows.

When one of these fails after a tilus upgrade, that defect is fixed upstream: delete the
workaround and its test. Each build runs in a fresh interpreter with an empty cache: tilus
IR is the same with and without the workarounds, so anything built earlier in this
process (tilus memoises program directories) would hide the defect.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REGISTER_SPLIT_SCHEDULE, child_env, overlaps, shared_memory_map

from support import cache, compat

pytestmark = pytest.mark.skipif(not compat.needed(), reason=f"the defects are those of tilus {compat.AFFECTED_TILUS}")


def build_as_released(workaround: str | tuple, version: str, arch: str, tmp_path, schedule: dict | None = None) -> list[dict]:
    pin = f"kernel.debug_schedule = {schedule!r}" if schedule else ""
    names = (workaround,) if isinstance(workaround, str) else workaround
    off = f"compat.disabled(*{names!r})" if names else "contextlib.nullcontext()"  # () : every workaround on
    code = f"""
import contextlib, json, {version}
from support import build, compat, scaled, versions
kernel = {version}.KERNELS[{arch!r}]
{pin}
call_args = scaled.BUILD_ARGS if versions.is_fp8({version!r}) else None
with {off}:
    results = build.build_schedules(kernel, {arch!r}, progress=lambda line: None, call_args=call_args)
print(json.dumps([{{"error": r.error, "module_dir": str(r.module_dir), "warnings": r.ptxas_warnings}} for r in results]))
"""
    env = os.environ | {"MATMUL_TUTORIAL_CACHE": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=cache.REPO, env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", sorted(compat._WORKAROUNDS))
def test_workaround_is_installed(name):
    assert compat.installed(name)


def test_defect_1_hopper_tma_load_gets_blackwell_qualifier(tmp_path):
    (result,) = build_as_released("hopper_tma_cta_group", "matmul_v1", "hopper", tmp_path, dict(block_m=128, block_n=128, block_k=64))
    assert "Feature '.cta_group::1' not supported on .target 'sm_90a'" in result["error"]


V7_CLUSTER = dict(block_m=128, block_n=256, block_k=64, stages=4, group_m=16, cluster_m=2)


def test_defect_1_also_in_the_multicast_load(tmp_path):
    (result,) = build_as_released("hopper_tma_multicast_cta_group", "matmul_v7", "hopper", tmp_path, V7_CLUSTER)
    assert "Feature '.cta_group::1' not supported on .target 'sm_90a'" in result["error"]


def test_defect_5_kernels_carry_no_min_blocks_hint(tmp_path):
    # ptxas needs the hint to know a thread's registers at entry, or it may ignore setmaxnreg
    # ("(C7508) 'setmaxnreg' ignored"); v8's register split is built here with the hint left out
    (result,) = build_as_released("kernel_min_blocks", "matmul_v8", "hopper", tmp_path, REGISTER_SPLIT_SCHEDULE)
    assert not result["error"], result["error"]
    source = open(os.path.join(result["module_dir"], "source.cu")).read()
    assert "__launch_bounds__(384) " in source and "__launch_bounds__(384, 1)" not in source


def test_defect_6_launch_function_sets_the_shared_memory_limit_twice_per_call(tmp_path):
    # test_build checks that, with the workaround, every launch function asks only once per device
    workarounds = ("smem_limit_once", "smem_limit_once_at_launch")
    # v2's smallest Hopper ring: 64 KiB of shared memory, past the 48 KiB that needs the attribute
    schedule = dict(block_m=128, block_n=128, block_k=64, stages=2)
    (result,) = build_as_released(workarounds, "matmul_v2", "hopper", tmp_path, schedule)
    assert not result["error"], result["error"]
    source = open(os.path.join(result["module_dir"], "source.cu")).read()
    launch = source[source.index("DLL void tilus_launch"):]
    assert launch.count("cudaFuncSetAttribute(") == 2 and "tilus_smem_limit_set" not in launch


def test_defect_7_a_224_column_wgmma_is_issued_as_seven_narrow_ones(tmp_path):
    schedule = dict(block_m=128, block_n=224, block_k=64, stages=4, group_m=8)
    (result,) = build_as_released("wgmma_whole_n", "matmul_v6", "hopper", tmp_path, schedule)
    assert not result["error"], result["error"]
    ptx = open(os.path.join(result["module_dir"], "source.ptx")).read()
    shapes = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx))
    assert shapes == {"m64n32k16"}


def test_defect_8_an_fp8_accumulator_gets_four_adjacent_columns_a_thread():
    # the fp32 accumulator of an fp8 wgmma (k32) must be laid out as a 16-bit one's (k16):
    # PTX's accumulator fragment does not depend on the input type
    import tilus.ir.layout.inference.inference_rules.wgmma as rules

    with compat.disabled("wgmma_fp8_accumulator"):
        fp8, fp16 = (rules.generate_wgmma_register_layout(64, 128, 64, 128, k) for k in (32, 16))
    assert fp8 != fp16
    assert rules.generate_wgmma_register_layout(64, 128, 64, 128, 32) == fp16


def test_defect_2_loop_invariant_hoisting_asserts(tmp_path):
    # it depends on what the process transpiled before, so build the whole space as CI does
    results = build_as_released("hoisting_empty_let", "blackwell.matmul_v2", "blackwell", tmp_path)
    assert any("hoist_loop_invariants" in r["error"] and "AssertionError" in r["error"] for r in results)


def test_defect_9_hoisted_invariants_are_collected_in_a_set():
    from tilus.hidet.ir.tools import ExprHash
    from tilus.hidet.transforms.hoist_loop_invariants import LoopInvariantsAnalyzer

    with compat.disabled("hoisting_order"):
        assert type(LoopInvariantsAnalyzer([], ExprHash()).invariants) is set


# one v11 schedule that came out at 166 registers in one build and 168 in the next
V11_HOISTING = dict(block_m=128, block_n=128, block_k=128, stages=6, group_m=8, cluster_m=2, swap_ab=False,
                    stream_k=True)


def test_two_builds_of_one_schedule_generate_the_same_cuda(tmp_path):
    sources = []
    for build in ("first", "second"):
        (result,) = build_as_released((), "matmul_v11", "hopper", tmp_path / build, V11_HOISTING)
        assert not result["error"]
        sources.append((Path(result["module_dir"]) / "source.cu").read_text())
    assert sources[0] == sources[1]


# one consumer warpgroup (threads 0-127) and the producer warp: a block of 160 threads
V9_ONE_CONSUMER = dict(block_m=64, block_n=128, block_k=64, stages=8, group_m=8, cluster_m=2, swap_ab=False,
                       stream_k=False)


def test_defect_10_a_warpgroup_of_a_160_thread_block_is_not_known_to_be_warp_uniform(tmp_path):
    sources = {}
    for workaround in ("warp_uniform_groups", ()):
        (result,) = build_as_released(workaround, "matmul_v9", "hopper", tmp_path / str(bool(workaround)),
                                      V9_ONE_CONSUMER)
        assert not result["error"], result["error"]
        sources[bool(workaround)] = (Path(result["module_dir"]) / "source.cu").read_text()
    uniform = "shfl_sync_i32(uint32_t(4294967295u), ((int)threadIdx.x / 128), 0) == 0)"
    assert "if ((int)threadIdx.x < 128) {" in sources[True] and uniform not in sources[True]
    assert uniform in sources[False] and "if ((int)threadIdx.x < 128) {" not in sources[False]


def test_defect_3_barriers_land_on_freed_tiles(tmp_path):
    schedule = dict(block_m=128, block_n=128, block_k=64, stages=2)
    (result,) = build_as_released("barriers_above_peak", "matmul_v2", "hopper", tmp_path, schedule)
    assert not result["error"], result["error"]
    source = open(os.path.join(result["module_dir"], "source.cu")).read()
    tiles, barriers, _ = shared_memory_map(source)
    assert any(overlaps(tile, barriers) for tile in tiles), (tiles, barriers)


FASTDIV_CHECK = r"""
#include <cstdint>
#include <cstdio>
#define __forceinline__ inline
%(functions)s
// what the kernel does with the two numbers (tilus_cuda_fastdiv_runtime: mul.hi.u32, shr.u32)
static int32_t quotient(int32_t a, int32_t multiplier, int32_t shift) {
  if (multiplier == 0) return a >> shift;
  return (int32_t)((uint32_t)(((uint64_t)(uint32_t)a * (uint32_t)multiplier) >> 32) >> shift);
}
int main() {
  long wrong = 0;
  uint32_t first = 0;
  for (int32_t b = 1; b <= 2048; ++b) {
    int32_t m = (int32_t)%(multiplier)s((uint32_t)b), s = (int32_t)%(shift)s((uint32_t)b);
    for (int32_t i = 0; i < 20000; ++i) {
      int32_t small = i, large = 2147483647 - i;
      if (quotient(small, m, s) != small / b || quotient(large, m, s) != large / b) {
        wrong += 1;
        if (!first) first = b;
      }
    }
  }
  printf("%%ld %%u\n", wrong, first);
  return 0;
}
"""


def fastdiv_errors(source_cu: str, tmp_path) -> tuple[int, int]:
    """(wrong quotients, first wrong divisor) of the host functions a built kernel computes its magic numbers with."""
    names = {
        role: re.search(rf"fast_div_{role} = \(\(int32_t\)\((\w+)\(", source_cu).group(1) for role in ("m", "s")
    }
    functions = "\n".join(
        re.search(rf"static __forceinline__ uint32_t {name}\(uint32_t b\) \{{.*?\n\}}", source_cu, re.S).group(0)
        for name in names.values()
    )
    program = tmp_path / "fastdiv_check.cpp"
    program.write_text(FASTDIV_CHECK % {"functions": functions, "multiplier": names["m"], "shift": names["s"]})
    compiler = shutil.which("g++") or shutil.which("c++")
    subprocess.run([compiler, "-O2", "-o", tmp_path / "fastdiv_check", program], check=True)
    wrong, first = subprocess.run([tmp_path / "fastdiv_check"], capture_output=True, text=True, check=True).stdout.split()
    return int(wrong), int(first)


def build_probe(tmp_path, *disabled: str) -> str:
    """source.cu of the tile-order probe (group_m = 8), built in a fresh interpreter and cache."""
    code = f"""
import contextlib, probe_kernels
from support import build, compat
kernel = probe_kernels.TileOrderProbe
kernel.debug_schedule = dict(group_m=8)
with compat.disabled(*{disabled!r}) if {disabled!r} else contextlib.nullcontext():
    (result,) = build.build_schedules(kernel, "hopper", progress=lambda line: None, call_args=(7, 56, 0))
assert result.ok, result.error
print(result.module_dir)
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=cache.REPO, env=child_env(MATMUL_TUTORIAL_CACHE=tmp_path / "cache"), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return open(os.path.join(proc.stdout.strip().splitlines()[-1], "source.cu")).read()


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="needs a host C++ compiler")
def test_defect_4_fast_divmod_magic_numbers_are_wrong_for_a_third_of_divisors(tmp_path):
    wrong, first = fastdiv_errors(build_probe(tmp_path / "released", "fastdiv_multiplier", "fastdiv_shift"), tmp_path)
    assert wrong > 0 and first == 7, (wrong, first)
    assert fastdiv_errors(build_probe(tmp_path / "fixed"), tmp_path) == (0, 0)
