"""GPU tests (marked `gpu`; skipped with the reason where there is no Hopper or Blackwell GPU).

Every schedule of every version, not only the tuned one, is checked in a child process under a
timeout: a kernel that deadlocks fails its test with the kernel and schedule named instead
of freezing the run.
"""

import subprocess
import sys

import pytest
import torch
from conftest import VERSIONS, child_env, sanitizer

from support import cache, gpu, measure

pytestmark = pytest.mark.gpu

# square sizes the results are quoted at, shapes that are not tile multiples, one whose
# grouped tile order divides by 7 and 5 (fast_divmod, compat defect 4), decode (M = 1, 16), and
# tile counts just past a multiple of 132 SMs with K no multiple of 64 (v8's stream-K and exact K:
# 272 tiles of 128 x 256, 544 of 128 x 128, 33 K blocks, the last one partial)
SHAPES = ["4096", "8192", "1000x1016x1024", "129x264x72", "3000x520x4104", "7x8x8", "640x1792x128",
          "1x4096x4096", "16x14336x4104", "2176x4096x2056"]


def run_child(args: list[str], timeout: float) -> str:
    try:
        proc = subprocess.run(args, cwd=cache.REPO, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as hung:
        output = hung.stdout.decode() if isinstance(hung.stdout, bytes) else (hung.stdout or "")
        started = [line for line in output.splitlines() if line.startswith("START ")]
        last = started[-1][len("START ") :] if started else "before the first launch (building?)"
        pytest.fail(f"no result within {timeout} s; the last kernel started was {last}")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("version", VERSIONS)
def test_every_schedule_is_correct(version, dtype):
    output = run_child([sys.executable, f"{version}.py", "--all-schedules", "--dtype", dtype, "--timeout", "30",
                        "--sizes", *SHAPES], 900)
    assert " 0 wrong results" in output


@pytest.mark.parametrize("version", VERSIONS)
def test_version_checks_and_times_against_cublas(version):
    output = run_child([sys.executable, f"{version}.py", "--sizes", "1000x1016x1024", "--repeat", "10"], 600)
    assert "% of cuBLAS" in output


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("version", VERSIONS)
def test_matmul_matches_torch_and_fills_out(version, dtype):
    import importlib

    module = importlib.import_module(version)
    a, b, ref = measure.random_inputs(333, 264, 520, seed=7, dtype=dtype)
    out = torch.full((333, 264), float("nan"), dtype=dtype, device="cuda")
    assert module.matmul(a, b, out=out) is out
    assert measure.passes(measure.relative_error(out, ref), dtype)
    own = module.matmul(a, b)
    assert own.dtype == dtype and measure.passes(measure.relative_error(own, ref), dtype)
    # the bf16 bound is no looser than it must be: cuBLAS in bf16 lands within it by the same margin
    assert measure.relative_error(torch.matmul(a, b.T), ref) < measure.REL_ERR_TOL[dtype] / 2


@pytest.mark.parametrize("version", VERSIONS)
def test_later_calls_go_straight_to_the_launch_function(version, monkeypatch):
    # after the first call of a size bucket: no tuning, no cache paths, no device queries, no tilus script or keys
    import importlib
    import inspect
    import pathlib

    from tilus.lang import instantiated_script

    from support import dispatch

    module = importlib.import_module(version)
    a_all, b_all, _ = measure.random_inputs(256, 768, 1024, seed=11)

    def operands(m, n, k):
        return a_all[:m, :k].contiguous(), b_all[:n, :k].contiguous()

    module.matmul(*operands(250, 520, 1000))  # builds and tunes the bucket 256 x 768 x 1024

    def forbidden(*args, **kwargs):
        raise AssertionError("a later call did work that belongs to the first call of a bucket")

    for owner, name in [(torch.cuda, "get_device_properties"), (torch.cuda, "get_device_name"),
                        (torch.cuda, "get_device_capability"), (dispatch, "use_cache"), (dispatch, "tune_once"),
                        (dispatch, "extract_keys"), (inspect, "signature"), (pathlib.Path, "__truediv__"),
                        (instantiated_script.InstantiatedScriptCache, "get"),
                        (instantiated_script.InstantiatedScript, "__call__")]:
        monkeypatch.setattr(owner, name, forbidden)
    for m, n, k in [(250, 520, 1000), (193, 640, 1000), (256, 768, 1024)]:  # all in that bucket
        a, b = operands(m, n, k)
        expected = a.float() @ b.float().T
        assert measure.passes(measure.relative_error(module.matmul(a, b), expected))
        out = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
        assert module.matmul(a, b, out=out) is out and measure.passes(measure.relative_error(out, expected))


def test_the_tuner_ranks_its_finalists_back_to_back():
    # every schedule once; the finalists, the pick first, with a back-to-back time; the caller's operands untouched
    import tilus

    import matmul_v9
    from support import dispatch

    script_cls = matmul_v9.KERNELS[gpu.gpu_arch()]
    a, b, _ = measure.random_inputs(128, 1024, 2048, seed=5)
    a0, b0 = a.clone(), b.clone()
    out = torch.empty(128, 1024, dtype=a.dtype, device="cuda")
    args = dispatch.kernel_args(script_cls, 128, 1024, 2048, a, b, out)
    dispatch.use_cache(script_cls, gpu.gpu_label())
    jit = script_cls(dtype=tilus.float16)._jit_instance_for(*args)
    jit.programs()
    timed = dispatch.rank_schedules(jit, args)
    assert sorted(t.index for t in timed) == list(range(len(jit.compiled_programs)))
    finalists = [t for t in timed if t.loop_ms is not None]
    assert len(finalists) == min(dispatch.TUNE_FINALISTS, len(timed)) and timed[0] in finalists
    assert all(0 < t.loop_ms < 10 and 0 < t.burst_ms < 10 for t in timed if t.loop_ms is not None)
    assert a.equal(a0) and b.equal(b0)


def test_clusters_of_four_launch_no_more_ctas_than_fit_at_once():
    # the driver's count: whole clusters, no more SMs than the GPU has; v9 launches that many CTAs for its
    # clusters of four (more would run the extra clusters after the rest), and every SM for pairs
    import matmul_v9
    from support import dispatch

    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    fits = {cluster: gpu.cluster_sms(0, cluster) for cluster in (1, 2, 4)}
    assert fits[1] == num_sms and fits[2] <= num_sms and 0 < fits[4] <= num_sms and fits[4] % 4 == 0, fits
    if gpu.gpu_arch() != "hopper":  # v9's clusters of four are Hopper's
        return
    a, b, _ = measure.random_inputs(3000, 5000, 2056, seed=1)
    out = torch.empty(3000, 5000, dtype=a.dtype, device="cuda")
    args = dispatch.kernel_args(matmul_v9.KERNELS["hopper"], 3000, 5000, 2056, a, b, out)
    assert args[6] == num_sms and args[-1] == fits[4]
    assert dispatch.kernel_args(matmul_v9.KERNELS["hopper"], 3000, 5000, 2056, a, b, out, num_sms=64)[-1] == \
        min(fits[4], 64)


def test_gpu_only_input_rules():
    import matmul_v1

    a = torch.randn(64, 64, device="cuda").half()
    with pytest.raises(ValueError, match="b is on the CPU"):
        matmul_v1.matmul(a, a.cpu())
    with pytest.raises(ValueError, match="must not share memory"):
        matmul_v1.matmul(a, a, out=a)


def test_a_deadlocked_kernel_fails_with_its_name_instead_of_hanging():
    # producer starting at phase 0: it waits for the consumers, which wait for it
    code = (
        "import sys, matmul_v3, tilus.lang.instructions.mbarrier as m; from support import cli; "
        "m.BarrierInstructionGroup.producer_initial_phase = 0; "
        "kernel = matmul_v3.HopperMatmulV3; "
        "kernel.debug_schedule = dict(block_m=128, block_n=256, block_k=64, stages=3); "
        "sys.exit(cli.main('v3', matmul_v3.KERNELS, matmul_v3.matmul, "
        "['--all-schedules', '--timeout', '10', '--sizes', '256']))"
    )
    if gpu.gpu_arch() != "hopper":
        pytest.skip("the deadlocked kernel is the Hopper one")
    proc = subprocess.run([sys.executable, "-c", code], cwd=cache.REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3
    assert "TIMEOUT: HopperMatmulV3 [block_m=128 block_n=256 block_k=64 stages=3] at 256x256x256" in proc.stderr


def test_arch_mismatch_is_a_usage_error():
    other = "blackwell" if gpu.gpu_arch() == "hopper" else "hopper"
    proc = subprocess.run(
        [sys.executable, "matmul_v1.py", "--arch", other], cwd=cache.REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "only works with --compile-only" in proc.stderr


@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck"])
@pytest.mark.parametrize("version", VERSIONS)
def test_sanitizer_clean_at_a_small_size(version, tool):
    run_child([sys.executable, f"{version}.py", "--all-schedules", "--sizes", "16"], 60)  # builds outside the sanitizer
    args = [sanitizer(), "--tool", tool, "--error-exitcode", "1", sys.executable, f"{version}.py"]
    output = run_child([*args, "--all-schedules", "--timeout", "120", "--sizes", "129x264x72"], 900)
    clean = {"memcheck": "ERROR SUMMARY: 0 errors", "racecheck": "RACECHECK SUMMARY: 0 hazards displayed (0 errors",
             "synccheck": "ERROR SUMMARY: 0 errors"}
    assert clean[tool] in output


def run_probe(code: str, timeout: float = 300) -> str:
    """Run probe kernels in a child process: a deadlocked ring fails the test instead of hanging it."""
    try:
        proc = subprocess.run([sys.executable, "-c", code], cwd=cache.REPO, env=child_env(), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"no result within {timeout} s: a kernel hung")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize("stages", range(1, 7))
def test_pipeline_moves_data_through_many_phase_wraps(stages):
    # 37 steps: every slot's barriers flip phase many times, and 37 is no multiple of any depth
    output = run_probe(f"""
import torch, probe_kernels
from support import cache, gpu, measure
cache.use_cache(probe_kernels.PipelineCopy, gpu.gpu_label())
src = torch.randn(37 * 64, 64, device="cuda").half()
dst = torch.full_like(src, float("nan"))
probe_kernels.PipelineCopy({stages})(37, src, dst)
measure.sync_or_exit("PipelineCopy", 60)
print("equal" if torch.equal(src, dst) else "DIFFERENT")
""")
    assert output.strip().endswith("equal"), output


def test_grouped_order_visits_every_tile_exactly_once():
    # every group size on grids with one tile, one row, one column, partial last groups, 7-multiples
    from test_pipeline import GRIDS

    output = run_probe(f"""
import torch, probe_kernels
from support import cache, gpu, measure
from test_pipeline import raster
kernel = probe_kernels.TileOrderProbe
cache.use_cache(kernel, gpu.gpu_label())
jit = kernel()._jit_instance_for(7, 56, 0)
jit.programs()
for compiled, index in zip(jit.compiled_programs, jit.valid_schedules):
    group_m = jit.schedules[index]["group_m"]
    for num_m, num_n in {GRIDS!r}:
        order = torch.full((num_m, num_n), -1, dtype=torch.int32, device="cuda")
        compiled.get_launch_func()(num_m, num_n, order)
        measure.sync_or_exit("TileOrderProbe", 60)
        expected = [[-1] * num_n for _ in range(num_m)]
        for block, (m, n) in enumerate(raster.grouped_order(num_m, num_n, group_m)):
            expected[m][n] = block
        ok = order.cpu().tolist() == expected
        print(group_m, num_m, num_n, "ok" if ok else "WRONG")
""")
    lines = output.strip().splitlines()
    assert len(lines) == 4 * len(GRIDS) and all(line.endswith(" ok") for line in lines), output


@pytest.mark.parametrize("version", ["matmul_v8", "matmul_v9"])
def test_stream_k_is_bitwise_deterministic_and_leaves_the_workspace_clean(version):
    # v8's fix-up adds partial sums in a fixed order: ten runs of every stream-K schedule give the
    # same bits, on shapes whose units are split over several SMs (decode, skinny, the hybrid's
    # last waves, an exact K tail), and every launch leaves the flags at 0 for the next
    output = run_probe(f"""
import torch, {version} as version
from support import dispatch, gpu, measure
kernel = version.KERNELS[gpu.gpu_arch()]
jit = dispatch.jit_instance(kernel, 4096, 4096, 4096)
jit.programs()
for compiled, index in zip(jit.compiled_programs, jit.valid_schedules):
    schedule = jit.schedules[index]
    if not schedule["stream_k"]:
        continue
    for m, n, k in [(1, 4096, 14336), (64, 14336, 4096), (128, 8192, 8192), (4096, 4096, 4096), (3000, 5000, 2056)]:
        a, b, ref = measure.random_inputs(m, n, k, seed=3)
        out = torch.empty(m, n, dtype=a.dtype, device="cuda")
        args = dispatch.kernel_args(kernel, m, n, k, a, b, out)
        func = compiled.get_launch_func()
        func(*args)
        first = out.clone()
        same = True
        for _ in range(9):
            out.fill_(float("nan"))
            func(*args)
            same = same and torch.equal(out, first)
        measure.sync_or_exit(f"{{kernel.__name__}} {{dispatch.format_schedule(schedule)}} at {{m}}x{{n}}x{{k}}", 60)
        ok = same and measure.passes(measure.relative_error(first, ref), a.dtype)
        print(m, n, k, dispatch.format_schedule(schedule), "ok" if ok else "DIFFERENT")
flags = args[7]
print("flags clean" if int(flags.abs().sum()) == 0 else "FLAGS LEFT SET")
""", timeout=600)
    assert "DIFFERENT" not in output and "flags clean" in output and output.count(" ok") >= 5, output


def test_stream_k_gives_every_k_block_to_one_worker_and_its_owner_the_sharers():
    # v8's StreamKTileScheduler on grids below, at and past a whole number of waves, K blocks from
    # 1 to more than a tile's share: each K block of each tile goes to the worker the range
    # arithmetic says; a tile's K blocks go to its owner (the worker with its last block) and at most
    # max_sharers consecutive sharers below it (MAX_SHARERS, and 1 for Hopper's 128 x 256), and the owner names the lowest
    output = run_probe("""
import torch, probe_kernels
from schedulers import MAX_SHARERS
from support import cache, gpu, measure
from test_pipeline import raster
cache.use_cache(probe_kernels.StreamKProbe, gpu.gpu_label())
def expected(num_m, num_n, k_blocks, workers, max_sharers):
    units = num_m * num_n
    dp = units if units % workers == 0 else max(units // workers - 1, 0) * workers
    blocks = (units - dp) * k_blocks
    used = max(min(workers, blocks // -(-k_blocks // max_sharers)), 1)
    owner = {}
    for w in range(workers):
        for unit in range(w, dp, workers):
            owner.update({(unit, k): w for k in range(k_blocks)})
    for w in range(used):
        for i in range(w * blocks // used, (w + 1) * blocks // used):
            owner[dp + i // k_blocks, i % k_blocks] = w
    return owner
for max_sharers in (1, MAX_SHARERS):
    jit = probe_kernels.StreamKProbe(8, max_sharers)
    for num_m, num_n, k_blocks, workers in [(1, 1, 1, 3), (4, 8, 224, 132), (4, 8, 3, 132), (16, 32, 64, 132),
                                            (17, 16, 33, 132), (8, 17, 7, 66), (1, 112, 64, 132), (24, 24, 5, 132)]:
        cover = torch.full((num_m, num_n, k_blocks), -1, dtype=torch.int32, device="cuda")
        first = torch.full((num_m, num_n), -1, dtype=torch.int32, device="cuda")
        jit(num_m, num_n, k_blocks, workers, cover, first)
        measure.sync_or_exit("StreamKProbe", 60)
        cover, first = cover.cpu().tolist(), first.cpu().tolist()
        owner = expected(num_m, num_n, k_blocks, workers, max_sharers)
        ok = True
        for unit, (m, n) in enumerate(raster.grouped_order(num_m, num_n, 8)):
            held = [cover[m][n][k] for k in range(k_blocks)]
            holders = sorted(set(held))  # the owner and its sharers
            ok = ok and held == [owner[unit, k] for k in range(k_blocks)] and len(holders) <= max_sharers + 1
            ok = ok and holders == list(range(holders[0], holders[-1] + 1))
            ok = ok and first[m][n] == (holders[0] if len(holders) > 1 else -1)
        print(max_sharers, num_m, num_n, k_blocks, workers, "ok" if ok else "WRONG")
""")
    assert "WRONG" not in output and output.count("ok") == 16, output
