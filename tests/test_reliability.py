"""Reliability: every schedule on random shapes, the sanitizers, streams, graphs, long runs, the cache.

CPU tests (CI): the random shapes are valid and reach every edge; two processes build one
version into one cache at once; corrupt cache entries are rebuilt; a version script runs
from another working directory.

GPU tests (marked ``gpu``) run their check in a child process under a timeout, as
tests/test_gpu.py does: a hung kernel fails its test with the kernel, the schedule and the
shape named instead of freezing the run, and a check that breaks the CUDA context (a
failed graph capture, say) cannot take the next test with it. The ``check_*`` functions
below are what the children run.

Random shapes are seeded. A failure prints the seed and the shape; MATMUL_RANDOM_SEED=<seed>
replays the same shapes, and ``python matmul_vN.py --all-schedules --sizes MxNxK`` the one
shape. The long run prints its call count and the memory before and after (pytest -s or -rP).
"""

import gc
import hashlib
import importlib
import itertools
import math
import os
import pickle
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import filelock
import pytest
import tilus
import torch
from conftest import KERNEL_MODULES, VERSIONS, child_env, sanitizer

from support import build, cache, cli, dispatch, gpu, measure

SEED = int(os.environ.get("MATMUL_RANDOM_SEED", "20250611"))
SHAPES_PER_SCHEDULE = 50  # per schedule: every schedule runs every shape
LARGEST = 9000  # the largest M, N or K drawn
SMS = 132  # SMs of an H100 or H200 SXM: a persistent kernel's grid is SMS blocks
# how often each kind of size is drawn for one dimension once the forced edges are in
KIND_WEIGHTS = {"smallest": 1, "below": 2, "tile": 1, "under": 1, "over": 1, "edge": 3, "medium": 3, "large": 1}


# ---------------------------------------------------------------- random shapes


def tile_sizes(script_cls) -> dict[str, list[int]]:
    """The block sizes (block_m, block_n, block_k) some schedule of a kernel's autotune space uses.

    With clusters along M (cluster_m), the cluster's rows count as a tile of M too.
    """
    found = {"block_m": set(), "block_n": set(), "block_k": set(), "cluster_m": {1}}
    for key, values in script_cls._autotune_space.items():
        names = [name.strip() for name in key.split(",")]
        for value in values:
            for name, size in zip(names, value if len(names) > 1 else [value]):
                if name in found:
                    found[name].add(size)
    clusters = found.pop("cluster_m")
    found["block_m"] = {size * cluster for size in found["block_m"] for cluster in clusters}
    fallback = {"block_m": 128, "block_n": 128, "block_k": 64}
    return {name: sorted(sizes or {fallback[name]}) for name, sizes in found.items()}


def random_shapes(seed: int, tiles: dict, count: int = SHAPES_PER_SCHEDULE, largest: int = LARGEST, sms: int = SMS):
    """`count` valid shapes (M, N, K), N and K multiples of 8, biased toward the edges of the kernel's tiles.

    The first shapes each put a dimension on a named edge, so every seed has them all: 1 (8
    for N and K), less than the smallest tile (for K: than one step), exactly one tile or
    step, a tile multiple ± 1 (M) or ± 8 (N, K), about one or two waves of output tiles (a
    persistent kernel's edge), a few large ones. The rest draw every dimension from those
    kinds and from medium sizes, mostly small or medium.
    """
    rng = random.Random(seed)

    def draw(dim: str, kind: str) -> int:
        step = 1 if dim == "m" else 8  # TMA needs N and K multiples of 8 for fp16; M is free
        tiles_of_dim = tiles[f"block_{dim}"]
        tile = rng.choice(tiles_of_dim)
        multiple = tile * rng.choice([1, 2, 3, 4, rng.randint(1, largest // tile)])
        if kind == "smallest":
            size = step
        elif kind == "below":  # one partial tile for every schedule
            size = rng.randrange(step, min(tiles_of_dim), step)
        elif kind == "tile":
            size = tile
        elif kind == "under":
            size = multiple - (1 if dim == "m" else 8)
        elif kind == "over":
            size = multiple + (1 if dim == "m" else 8)
        elif kind == "edge":
            size = multiple + rng.choice((-8, -1, 0, 1, 8) if dim == "m" else (-8, 0, 8))
        elif kind == "medium":
            size = rng.randrange(step, 2048 + 1, step)
        else:
            size = rng.randrange(2048, largest + 1, step)
        return min(max(size, step), largest - largest % step)

    def wave() -> tuple[int, int, int]:
        """A grid of about one or two waves of tiles for some schedule's tile (last row and column ragged)."""
        block_m, block_n = rng.choice(tiles["block_m"]), rng.choice(tiles["block_n"])
        for target in rng.sample([sms - 1, sms, sms + 1, 2 * sms - 1, 2 * sms, 2 * sms + 1], 6):
            splits = [
                (rows, target // rows)
                for rows in range(1, target + 1)
                if target % rows == 0 and rows * block_m <= largest and target // rows * block_n <= largest
            ]
            if splits:
                rows, cols = rng.choice(splits)
                k = draw("k", rng.choice(["tile", "edge", "medium"]))
                return rows * block_m - rng.choice([0, 1]), cols * block_n - rng.choice([0, 8]), k
        return draw("m", "edge"), draw("n", "edge"), draw("k", "edge")

    forced = [
        ("smallest", "smallest", "smallest"),  # 1 x 8 x 8
        ("smallest", "edge", "tile"),  # one row, one K step
        ("below", "below", "tile"),  # one partial tile, one K step
        ("below", "below", "below"),  # K shorter than one step
        ("under", "over", "tile"),
        ("over", "under", "over"),
        ("edge", "edge", "under"),
        ("tile", "edge", "medium"),
        ("edge", "below", "medium"),  # N smaller than a tile
        ("below", "edge", "medium"),  # M smaller than a tile
        ("large", "smallest", "medium"),  # a single column of tiles
        ("smallest", "large", "large"),
        ("large", "large", "large"),
    ]
    shapes = [tuple(draw(dim, kind) for dim, kind in zip("mnk", kinds)) for kinds in forced]
    shapes += [wave(), wave()]
    kinds, weights = list(KIND_WEIGHTS), list(KIND_WEIGHTS.values())
    while len(shapes) < count:
        shapes.append(tuple(draw(dim, rng.choices(kinds, weights)[0]) for dim in "mnk"))
    return shapes[:count]


def size_text(shape) -> str:
    return "x".join(map(str, shape))


@pytest.mark.parametrize("version, arch", KERNEL_MODULES)
def test_random_shapes_are_valid_seeded_and_reach_every_edge(version, arch):
    tiles = tile_sizes(importlib.import_module(version).KERNELS[arch])
    block_m, block_n, block_k = tiles["block_m"], tiles["block_n"], tiles["block_k"]
    for seed in (SEED, 0, 1, 2):
        shapes = random_shapes(seed, tiles)
        assert shapes == random_shapes(seed, tiles)
        assert len(shapes) >= 50 and len(set(shapes)) >= 40, shapes
        for m, n, k in shapes:
            assert 1 <= m <= LARGEST and 8 <= n <= LARGEST and 8 <= k <= LARGEST, (seed, m, n, k)
            assert n % 8 == 0 and k % 8 == 0, (seed, m, n, k)
        ms, ns, ks = zip(*shapes)
        edges = {
            "M = 1": 1 in ms,
            "N = 8": 8 in ns,
            "K = 8": 8 in ks,
            "M smaller than every tile": any(m < min(block_m) for m in ms),
            "N smaller than every tile": any(n < min(block_n) for n in ns),
            "K of one step": any(k in block_k for k in ks),
            "K shorter than one step": any(k < min(block_k) for k in ks),
            "M a tile multiple - 1": any(m % t == t - 1 for m in ms for t in block_m),
            "M a tile multiple + 1": any(m % t == 1 and m > t for m in ms for t in block_m),
            "N a tile multiple - 8": any(n % t == t - 8 for n in ns for t in block_n),
            "N a tile multiple + 8": any(n % t == 8 and n > t for n in ns for t in block_n),
            "K a step multiple + 8": any(k % t == 8 and k > t for k in ks for t in block_k),
            "a dimension above 4096": max(map(max, shapes)) > 4096,
            "one or two waves of tiles, ± 1": any(
                math.ceil(m / bm) * math.ceil(n / bn) in (SMS - 1, SMS, SMS + 1, 2 * SMS - 1, 2 * SMS, 2 * SMS + 1)
                for m, n, _ in shapes
                for bm, bn in itertools.product(block_m, block_n)
            ),
        }
        assert all(edges.values()), f"seed {seed}: no shape with {[name for name, hit in edges.items() if not hit]}"
        small = sum(m * n * k <= 1024**3 for m, n, k in shapes)
        assert small >= len(shapes) // 2, f"seed {seed}: only {small} of {len(shapes)} shapes are small or medium"
    assert random_shapes(SEED, tiles) != random_shapes(SEED + 1, tiles)


# ---------------------------------------------------------------- child processes


def child(name: str, *args) -> list[str]:
    """The command line of a child process that runs ``name(*args)`` of this module."""
    return [sys.executable, "-c", f"import test_reliability as t; t.{name}(*{args!r})"]


def run_check(name: str, *args, timeout: float = 900, prefix=(), env=None, cwd=cache.REPO):
    """Run ``name(*args)`` of this module in a child process; fail naming the last kernel it started if it hangs.

    Fails on a non-zero exit or on any "FAIL " line, showing those lines and the ends of its output.
    """
    try:
        proc = subprocess.run(
            [*prefix, *child(name, *args)], cwd=cwd, env=env or child_env(), capture_output=True, text=True,
            timeout=timeout, check=False,
        )
    except subprocess.TimeoutExpired as hung:
        output = hung.stdout.decode() if isinstance(hung.stdout, bytes) else (hung.stdout or "")
        started = [line for line in output.splitlines() if line.startswith("START ")]
        last = started[-1][len("START ") :] if started else "none (still building?)"
        pytest.fail(f"{name}{args}: no result within {timeout} s; the last kernel started was {last}")
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAIL ")]
    report = "\n".join([*failed[:30], "--- stdout:", proc.stdout[-3000:], "--- stderr:", proc.stderr[-6000:]])
    assert proc.returncode == 0 and not failed, f"{name}{args} exited with {proc.returncode}:\n{report}"
    return proc


def run_together(commands: list[list[str]], env: dict, timeout: float, cwd=cache.REPO) -> list[tuple[int, str, str]]:
    """Start every command at once; (exit status, stdout, stderr) of each."""
    procs = [
        subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for command in commands
    ]
    results = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=timeout)
            results.append((proc.returncode, stdout, stderr))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


# ---------------------------------------------------------------- GPU: every schedule on random shapes


def check_random_shapes(version: str, seed: int, timeout_s: float, dtype: str = "fp16") -> None:
    """Every compiled schedule of the version's kernel for this GPU on every random shape of the seed."""
    script_cls = importlib.import_module(version).KERNELS[gpu.gpu_arch()]
    name = f"{script_cls.__name__} ({dtype})"
    shapes = random_shapes(seed, tile_sizes(script_cls))
    print(f"{name}, seed {seed}: {' '.join(map(size_text, shapes))}", flush=True)
    torch_dtype = measure.DTYPE_NAMES[dtype]
    built, total, results = cli.check_every_schedule(script_cls, shapes, timeout_s, first_seed=seed, dtype=torch_dtype)
    if built != total:
        print(f"FAIL {name}: only {built} of {total} schedules built", flush=True)
    failures = 0
    for (m, n, k), schedule, err in results:
        if not measure.passes(err, torch_dtype):
            failures += 1
            print(
                f"FAIL {name} [{schedule}] at {m}x{n}x{k}: relative error {err:.2e} (seed {seed}); replay: "
                f"MATMUL_RANDOM_SEED={seed} pytest tests/test_reliability.py -k 'random_shapes and {version}', "
                f"or python {version}.py --all-schedules --dtype {dtype} --sizes {m}x{n}x{k}",
                flush=True,
            )
    print(
        f"RESULT {name}: {built} schedules x {len(shapes)} shapes = {len(results)} launches, "
        f"{failures} failures (seed {seed})",
        flush=True,
    )
    sys.exit(1 if failures else 0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("version", VERSIONS)
def test_every_schedule_on_random_shapes(version, dtype):
    # bf16 draws its own shapes (the next seed): together the two dtypes cover twice as many
    seed = SEED + (dtype == "bf16")
    output = run_check("check_random_shapes", version, seed, 60.0, dtype, timeout=1800).stdout
    (result,) = [line for line in output.splitlines() if line.startswith("RESULT ")]
    schedules, shapes, launches, failures = map(
        int, re.search(r"(\d+) schedules x (\d+) shapes = (\d+) launches, (\d+) failures", result).groups()
    )
    kernel = importlib.import_module(version).KERNELS[gpu.gpu_arch()]
    assert schedules == dispatch.space_size(kernel) and shapes >= SHAPES_PER_SCHEDULE, result
    assert launches == schedules * shapes and failures == 0, result


# ---------------------------------------------------------------- GPU: sanitizers on the tuned schedule


SANITIZER_SIZE = (129, 264, 72)  # ragged: no dimension a multiple of any tile or K step
# memcheck and racecheck run in tests/test_gpu.py on every schedule at this size (the tuned one among them)
SANITIZER_CLEAN = {"synccheck": "ERROR SUMMARY: 0 errors", "initcheck": "ERROR SUMMARY: 0 errors"}
_tuned_for_sanitizer: set[str] = set()


def check_tuned_call(version: str, m: int, n: int, k: int) -> None:
    """matmul at one size as a user calls it: the tuned schedule, into an output filled with NaN.

    Filled, not fresh from torch.empty: initcheck reports reading memory back (a cudaMemcpy
    source) that it has not seen written, and it may not count the kernel's TMA stores as
    writes. A tile the kernel leaves unwritten stays NaN and fails the check instead.
    """
    module = importlib.import_module(version)
    generator = torch.Generator().manual_seed(0)
    a_host = torch.randn((m, k), generator=generator).half()
    b_host = torch.randn((n, k), generator=generator).half()
    ref = a_host.float() @ b_host.float().T  # on the CPU: under a sanitizer only copies, a fill and the kernel run
    a, b = a_host.cuda(), b_host.cuda()
    out = torch.full((m, n), math.nan, dtype=torch.float16, device="cuda")
    assert module.matmul(a, b, out=out) is out
    err = measure.relative_error(out.cpu(), ref)
    assert measure.passes(err), f"{version} at {m}x{n}x{k}: relative error {err:.2e}"
    script_cls = module.KERNELS[gpu.gpu_arch()]
    print(f"{version} at {m}x{n}x{k}: ok with {dispatch.format_schedule(dispatch.chosen_schedule(script_cls, m, n, k))}")


@pytest.mark.gpu
@pytest.mark.parametrize("tool", list(SANITIZER_CLEAN))
@pytest.mark.parametrize("version", VERSIONS)
def test_tuned_schedule_is_sanitizer_clean(version, tool):
    # builds and tunes the size outside the sanitizer first: under it, the tuned pick comes from the cache
    if version not in _tuned_for_sanitizer:
        run_check("check_tuned_call", version, *SANITIZER_SIZE, timeout=900)
        _tuned_for_sanitizer.add(version)
    prefix = [sanitizer(), "--tool", tool, "--error-exitcode", "1"]
    proc = run_check("check_tuned_call", version, *SANITIZER_SIZE, prefix=prefix, timeout=1200)
    output = proc.stdout + proc.stderr
    assert SANITIZER_CLEAN[tool] in output, output[-4000:]
    assert f"{version} at {size_text(SANITIZER_SIZE)}: ok" in proc.stdout


# ---------------------------------------------------------------- GPU: what a user's program relies on

SPIN_CYCLES = 500_000_000  # torch.cuda._sleep: a quarter of a second or more at H100 clocks


def check_stream_order(version: str, device_index: int = 0) -> None:
    """matmul on a side stream runs after the work queued before it there, and does not wait for it."""
    module = importlib.import_module(version)
    m, n, k = 1000, 1016, 1024
    with torch.cuda.device(device_index):
        a, b, _ = measure.random_inputs(m, n, k, seed=1)
        new_a, new_b, ref = measure.random_inputs(m, n, k, seed=2)
        side = torch.cuda.Stream()
    out = torch.empty((m, n), dtype=torch.float16, device=a.device)
    module.matmul(a, b, out=out)  # builds and tunes this size (tuning synchronizes) before the test proper
    with torch.cuda.stream(side):
        module.matmul(a, b)  # leaves a block of this size in the side stream's pool: no cudaMalloc below
        # CUDA loads a kernel's code at its first launch (lazy loading), which can wait for the
        # GPU: each kind of work queued while the spin runs below is queued once before, on scratch
        # tensors (a and b keep their first values, so a kernel that does not wait for the copies fails)
        torch.cuda._sleep(1)
        torch.empty_like(a).copy_(new_a)
        torch.empty_like(b).copy_(new_b)
        torch.empty_like(out).fill_(math.nan)
    torch.cuda.synchronize(a.device)
    with torch.cuda.stream(side):
        torch.cuda._sleep(SPIN_CYCLES)
        a.copy_(new_a)
        b.copy_(new_b)
        out.fill_(math.nan)
        queued_early = not side.query()
        own = module.matmul(a, b)
        module.matmul(a, b, out=out)
        returned_early = not side.query()
    torch.cuda.synchronize(a.device)
    assert queued_early, f"{version}: the spin on the side stream ended before the test queued its inputs"
    assert returned_early, f"{version}: matmul returned only after the stream's earlier work had finished (a sync)"
    for name, result in (("matmul(a, b)", own), ("matmul(a, b, out=out)", out)):
        err = measure.relative_error(result, ref)
        assert measure.passes(err), (
            f"{version}: {name} on a side stream of {a.device} computed from the inputs before the copies queued "
            f"ahead of it on that stream (relative error {err:.2e}): the kernel ran on another stream"
        )
    print(f"{version}: ordered on the caller's stream of {a.device}")


def check_graph_replay(version: str) -> None:
    """matmul captured in a CUDA graph computes from the inputs' current values on every replay."""
    module = importlib.import_module(version)
    m, n, k = 1000, 1016, 1024
    a, b, _ = measure.random_inputs(m, n, k, seed=1)
    out = torch.empty((m, n), dtype=torch.float16, device="cuda")
    module.matmul(a, b, out=out)  # builds and tunes outside the capture: tuning times kernels and synchronizes
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        own = module.matmul(a, b)  # its output comes from the graph's memory pool
        module.matmul(a, b, out=out)
    for seed in (2, 3):
        new_a, new_b, ref = measure.random_inputs(m, n, k, seed=seed)
        a.copy_(new_a)
        b.copy_(new_b)
        own.fill_(math.nan)
        out.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        for name, result in (("matmul(a, b)", own), ("matmul(a, b, out=out)", out)):
            err = measure.relative_error(result, ref)
            assert measure.passes(err), f"{version}: {name} replayed from a CUDA graph: relative error {err:.2e}"
    print(f"{version}: replays from a CUDA graph")


def check_out_given_or_not(version: str) -> None:
    module = importlib.import_module(version)
    for seed, (m, n, k) in enumerate([(333, 264, 520), (1, 8, 8)]):
        a, b, ref = measure.random_inputs(m, n, k, seed=seed)
        out = torch.full((m, n), math.nan, dtype=torch.float16, device="cuda")
        assert module.matmul(a, b, out=out) is out
        own = module.matmul(a, b)
        assert (own.shape, own.dtype, own.device, own.is_contiguous()) == ((m, n), torch.float16, a.device, True)
        for name, result in (("out=out", out), ("out=None", own)):
            err = measure.relative_error(result, ref)
            assert measure.passes(err), f"{version} at {m}x{n}x{k} with {name}: relative error {err:.2e}"
        assert torch.equal(own, out), f"{version} at {m}x{n}x{k}: out=None and out=out differ"
    print(f"{version}: out given or not")


def check_versions_side_by_side(*versions: str) -> None:
    """Every version in one process, calls interleaved: each keeps its own programs, picks and results."""
    modules = [importlib.import_module(version) for version in versions]
    for seed, (m, n, k) in enumerate([(333, 264, 520), (1000, 1016, 1024)]):
        a, b, ref = measure.random_inputs(m, n, k, seed=seed)
        for _ in range(2):
            for module in modules:
                err = measure.relative_error(module.matmul(a, b), ref)
                assert measure.passes(err), f"{module.__name__} at {m}x{n}x{k} beside the others: {err:.2e}"
    label = gpu.gpu_label()
    for module in modules:
        script_cls = module.KERNELS[gpu.gpu_arch()]
        own_dir = cache.cache_dir_for(script_cls, label)
        for jit in script_cls().jit_instances.values():
            assert jit.cache_dir.is_relative_to(own_dir), f"{script_cls.__name__} cached in {jit.cache_dir}"
            for compiled in jit.compiled_programs:
                assert compiled.program_dir.is_relative_to(own_dir), (script_cls.__name__, compiled.program_dir)
    print(f"{' '.join(versions)}: side by side")


def check_second_gpu(version: str) -> None:
    """Tensors on GPU 1 while torch's current device stays GPU 0."""
    module = importlib.import_module(version)
    torch.cuda.set_device(0)
    with torch.cuda.device(1):
        a, b, ref = measure.random_inputs(333, 264, 520, seed=5)
    own = module.matmul(a, b)
    assert own.device == a.device, own.device
    assert torch.cuda.current_device() == 0, "matmul changed the current device"
    torch.cuda.synchronize(a.device)
    err = measure.relative_error(own, ref)
    assert measure.passes(err), f"{version} on {a.device}: relative error {err:.2e}"
    check_stream_order(version, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
def test_matmul_is_ordered_on_the_callers_stream(version):
    run_check("check_stream_order", version)


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
def test_matmul_replays_from_a_cuda_graph(version):
    run_check("check_graph_replay", version)


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
def test_matmul_with_and_without_out(version):
    run_check("check_out_given_or_not", version)


@pytest.mark.gpu
def test_every_version_in_one_process():
    run_check("check_versions_side_by_side", *VERSIONS, timeout=1800)


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
def test_tensors_on_a_second_gpu(version):
    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU on this machine")
    run_check("check_second_gpu", version)


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
def test_version_script_runs_from_another_working_directory(version, tmp_path):
    proc = subprocess.run(
        [sys.executable, str(cache.REPO / f"{version}.py"), "--sizes", "256", "--check-only"],
        cwd=tmp_path, capture_output=True, text=True, timeout=900, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"256x256x256\s+\S+\s+ok", proc.stdout), proc.stdout
    assert not list(tmp_path.iterdir()), f"wrote into the working directory: {list(tmp_path.iterdir())}"


# ---------------------------------------------------------------- GPU: a long run

LONG_RUN_CALLS = 3000
LONG_RUN_SHAPES = [
    (7, 8, 8), (129, 264, 72), (333, 264, 520), (1000, 1016, 1024), (128, 4096, 1024), (2048, 2048, 2048)
]


def memory_now() -> dict:
    torch.cuda.synchronize()
    gc.collect()
    free, total = torch.cuda.mem_get_info()
    with open("/proc/self/statm") as statm:
        rss = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return {
        "allocated": torch.cuda.memory_allocated(),
        "reserved": torch.cuda.memory_reserved(),
        "driver_used": total - free,
        "host_rss": rss,
    }


def check_long_run(version: str, calls: int) -> None:
    """`calls` back-to-back calls cycling through mixed shapes, with and without out: same results, flat memory."""
    module = importlib.import_module(version)
    inputs = [measure.random_inputs(m, n, k, seed=seed) for seed, (m, n, k) in enumerate(LONG_RUN_SHAPES)]
    outs = [torch.empty((m, n), dtype=torch.float16, device="cuda") for m, n, _ in LONG_RUN_SHAPES]
    expected = []
    for (m, n, k), (a, b, ref) in zip(LONG_RUN_SHAPES, inputs):
        result = module.matmul(a, b)  # builds and tunes each size before the run
        err = measure.relative_error(result, ref)
        assert measure.passes(err), f"{version} at {m}x{n}x{k}: relative error {err:.2e}"
        expected.append(result)
    mismatches = torch.zeros((), dtype=torch.int64, device="cuda")

    def call(i: int) -> None:
        shape = i % len(LONG_RUN_SHAPES)
        a, b, _ = inputs[shape]
        # one schedule per size and no split K: every call must give the same bits
        if (i // len(LONG_RUN_SHAPES)) % 2:
            result = module.matmul(a, b)
        else:
            result = module.matmul(a, b, out=outs[shape])
        mismatches.add_((result != expected[shape]).sum())

    for i in range(4 * len(LONG_RUN_SHAPES)):  # warm-up: every shape with and without out, twice
        call(i)
    before = memory_now()
    started = time.perf_counter()
    for i in range(calls):
        call(i)
        if (i + 1) % 500 == 0:
            measure.sync_or_exit(f"{version} long run, call {i + 1}", 120)
    after = memory_now()
    seconds = time.perf_counter() - started
    mib = {key: (before[key] / 2**20, after[key] / 2**20) for key in before}
    print(
        f"LONG RUN {version}: {calls} calls on {len(LONG_RUN_SHAPES)} shapes in {seconds:.1f} s, "
        f"{mismatches.item()} mismatches; MiB before -> after: "
        + ", ".join(f"{key} {old:.1f} -> {new:.1f}" for key, (old, new) in mib.items()),
        flush=True,
    )
    assert mismatches.item() == 0, f"{version}: {mismatches.item()} output elements differ from the first call's"
    # every tensor a call makes is freed: torch's count returns exactly; its pool and the
    # driver's use may move by a block (a leak of even 3 KiB a call would show), the host's a little
    assert after["allocated"] == before["allocated"], mib
    assert after["reserved"] - before["reserved"] <= 8 * 2**20, mib
    assert after["driver_used"] - before["driver_used"] <= 8 * 2**20, mib
    assert after["host_rss"] - before["host_rss"] <= 32 * 2**20, mib


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
def test_long_run_keeps_results_and_memory_flat(version):
    output = run_check("check_long_run", version, LONG_RUN_CALLS, timeout=1200).stdout
    print(next(line for line in output.splitlines() if line.startswith("LONG RUN ")))


# ---------------------------------------------------------------- the cache


def build_first_schedules_of_v1(count: int) -> None:
    """Build the first `count` schedules of v1's Hopper kernel for sm_90a, without a GPU (the cache tests' child)."""
    kernel = importlib.import_module("matmul_v1").KERNELS["hopper"]
    space = kernel._autotune_space
    widest = max(space, key=lambda key: len(space[key]))
    kernel._autotune_space = {key: values[:count] if key == widest else values[:1] for key, values in space.items()}
    results = build.build_schedules(kernel, "hopper", progress=lambda line: None)
    assert len(results) == count and all(r.ok for r in results), [r.error for r in results]
    for r in results:
        print("BUILT", r.module_dir)


def program_dirs(root: Path, version: str) -> list[Path]:
    return sorted(path for path in root.glob(f"*/{version}-*/programs/*") if path.is_dir())


def hashes_to_its_name(program_dir: Path) -> bool:
    texts = (program_dir / "options.txt").read_bytes() + (program_dir / "program.txt").read_bytes()
    return hashlib.sha256(texts).hexdigest()[:12] == program_dir.name


def age(path: Path, seconds: float = 3600) -> None:
    """Date a file back, as if written long ago (younger program texts may still be being written)."""
    then = time.time() - seconds
    os.utime(path, (then, then))


@pytest.fixture(scope="module")
def cpu_cache(tmp_path_factory) -> Path:
    """A cache of this module's own, empty at first: the CPU cache tests share its builds."""
    return tmp_path_factory.mktemp("cpu-cache")


def test_two_processes_build_one_version_at_once_into_one_cache(cpu_cache):
    env = child_env(MATMUL_TUTORIAL_CACHE=cpu_cache)
    results = run_together([child("build_first_schedules_of_v1", 2)] * 2, env, timeout=600)
    for status, stdout, stderr in results:
        assert status == 0 and stdout.count("BUILT") == 2, stdout[-2000:] + stderr[-4000:]
    programs = program_dirs(cpu_cache, "matmul_v1")
    assert len(programs) == 2, programs
    for program in programs:
        assert hashes_to_its_name(program) and cache.elf_problem(program / "module" / "kernel.cubin") is None


def test_corrupt_cache_entries_are_rebuilt(cpu_cache):
    env = child_env(MATMUL_TUTORIAL_CACHE=cpu_cache)
    run_check("build_first_schedules_of_v1", 2, env=env, timeout=600)  # loaded from the cache after the test above
    text_cut, cubin_cut = program_dirs(cpu_cache, "matmul_v1")
    # a program text cut short by a process killed long ago, and a cubin cut short
    text = text_cut / "program.txt"
    text.write_text(text.read_text()[:100])
    age(text)
    age(text_cut / "options.txt")
    cubin = cubin_cut / "module" / "kernel.cubin"
    os.truncate(cubin, cubin.stat().st_size // 2)
    proc = run_check("build_first_schedules_of_v1", 2, env=env, timeout=600)
    assert f"cache: discarded {text_cut} (program.txt or options.txt does not hash" in proc.stderr, proc.stderr[-3000:]
    assert f"cache: discarded {cubin} (truncated" in proc.stderr, proc.stderr[-3000:]
    assert hashes_to_its_name(text_cut)
    assert cache.elf_problem(text_cut / "module" / "kernel.cubin") is None and cache.elf_problem(cubin) is None


def test_discard_corrupt_entries_removes_exactly_what_tilus_would_fail_on(tmp_path):
    elf = Path(torch._C.__file__).read_bytes()  # a small, whole ELF shared object

    def program(name: str | None, text: str = "program", module: dict | None = None, old: bool = True) -> Path:
        options = "options"
        name = name or hashlib.sha256((options + text).encode()).hexdigest()[:12]
        directory = tmp_path / "programs" / name
        (directory / "module").mkdir(parents=True)
        (directory / "program.txt").write_text(text)
        (directory / "options.txt").write_text(options)
        for file_name, content in (module or {}).items():
            (directory / "module" / file_name).write_bytes(content)
        if old:
            age(directory / "program.txt")
            age(directory / "options.txt")
        return directory

    whole = program(None, module={"lib.so": elf, "kernel.cubin": elf})
    mismatched = program("0123456789ab", module={"lib.so": elf})
    being_written = program("ba9876543210", old=False)  # too young to judge: another process may be writing it
    busy = program("00000000000a")  # another process holds its lock
    truncated = program(None, "truncated", module={"lib.so": elf[: len(elf) // 2]})
    not_elf = program(None, "not elf", module={"kernel.cubin": b"garbage"})
    tables = tmp_path / "scripts" / "kernel"
    contents = {"good": pickle.dumps({(1, 2): 0}), "garbage": b"\x80\x04garbage", "list": pickle.dumps([0])}
    for key, content in contents.items():
        (tables / key).mkdir(parents=True)
        (tables / key / "dispatch_table.pickle").write_bytes(content)
    with filelock.FileLock(busy / ".lock"):
        discarded = dict(cache.discard_corrupt_entries(tmp_path))
    assert set(discarded) == {
        mismatched,
        truncated / "module" / "lib.so",
        not_elf / "module" / "kernel.cubin",
        tables / "garbage" / "dispatch_table.pickle",
        tables / "list" / "dispatch_table.pickle",
    }, discarded
    assert not (mismatched / "program.txt").exists() and not (mismatched / "module" / "lib.so").exists()
    assert (whole / "module" / "lib.so").exists() and (whole / "module" / "kernel.cubin").exists()
    assert (being_written / "program.txt").exists() and (busy / "program.txt").exists()
    assert (tables / "good" / "dispatch_table.pickle").exists()
    assert not (truncated / "module" / "lib.so").exists() and (truncated / "program.txt").exists()


def test_a_cache_directory_is_checked_once_per_process(tmp_path, monkeypatch, capsys):
    kernel = importlib.import_module("matmul_v1").KERNELS["hopper"]
    monkeypatch.setattr(cache, "CACHE_ROOT", tmp_path)
    monkeypatch.setattr(cache, "_checked", set())
    table = cache.cache_dir_for(kernel, "some-gpu") / "scripts" / "hopper_matmul_v1" / "key" / "dispatch_table.pickle"
    table.parent.mkdir(parents=True)
    previous = tilus.option.get_option("cache_dir")
    try:
        table.write_bytes(b"garbage")
        cache.use_cache(kernel, "some-gpu")
        assert not table.exists()
        assert f"cache: discarded {table} (unreadable" in capsys.readouterr().err
        table.write_bytes(b"garbage")
        cache.use_cache(kernel, "some-gpu")  # every first call of a bucket calls use_cache: the check runs once
        assert table.exists()
    finally:
        tilus.option.cache_dir(previous)


def test_version_script_builds_from_another_working_directory(built, tmp_path):
    built("matmul_v1", "hopper")  # once per session, shared with test_build: the child loads it from the cache
    proc = subprocess.run(
        [sys.executable, str(cache.REPO / "matmul_v1.py"), "--compile-only", "--arch", "hopper"],
        cwd=tmp_path, capture_output=True, text=True, timeout=900, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"(\d+)/\1 schedules built with wgmma", proc.stdout), proc.stdout[-3000:]
    assert not list(tmp_path.iterdir()), f"wrote into the working directory: {list(tmp_path.iterdir())}"


@pytest.fixture(scope="module")
def gpu_cache(tmp_path_factory) -> Path:
    """A cache of this module's own, empty at first, shared by the GPU cache tests."""
    return tmp_path_factory.mktemp("gpu-cache")


V1_CHECK = [sys.executable, "matmul_v1.py", "--check-only", "--sizes", "300x264x520"]


@pytest.mark.gpu
def test_two_processes_build_and_tune_one_version_at_once(gpu_cache):
    results = run_together([V1_CHECK, V1_CHECK], child_env(MATMUL_TUTORIAL_CACHE=gpu_cache), timeout=1200)
    for status, stdout, stderr in results:
        assert status == 0 and re.search(r"300x264x520\s+\S+\s+ok", stdout), stdout[-2000:] + stderr[-4000:]


@pytest.mark.gpu
def test_corrupt_cache_entries_are_rebuilt_on_the_gpu(gpu_cache):
    env = child_env(MATMUL_TUTORIAL_CACHE=gpu_cache)
    first = subprocess.run(V1_CHECK, cwd=cache.REPO, env=env, capture_output=True, text=True, timeout=1200, check=False)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-4000:]
    text_cut, library_cut, *_ = program_dirs(gpu_cache, "matmul_v1")
    text = text_cut / "program.txt"
    text.write_text(text.read_text()[:100])
    age(text)
    age(text_cut / "options.txt")
    library = library_cut / "module" / "lib.so"
    os.truncate(library, library.stat().st_size // 2)
    tables = sorted(gpu_cache.glob("*/matmul_v1-*/scripts/*/*/dispatch_table.pickle"))
    assert tables, "no dispatch table after tuning"
    for table in tables:
        table.write_bytes(b"\x80\x04garbage")
    again = subprocess.run(V1_CHECK, cwd=cache.REPO, env=env, capture_output=True, text=True, timeout=1200, check=False)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-4000:]
    assert re.search(r"300x264x520\s+\S+\s+ok", again.stdout), again.stdout
    assert again.stderr.count("cache: discarded") == 2 + len(tables), again.stderr[-4000:]
    assert hashes_to_its_name(text_cut) and cache.elf_problem(library) is None
    assert all(cache.dispatch_table_problem(table) is None for table in tables)


def test_sanitizer_is_found_off_path_or_fails(monkeypatch, tmp_path):
    # one finder for every test that runs compute-sanitizer: PATH, then $CUDA_HOME/bin, then /usr/local/cuda/bin;
    # where none holds it the test fails (these tests run only where there is a GPU), it does not skip
    tool = tmp_path / "cuda" / "bin" / "compute-sanitizer"
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\n")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    assert sanitizer() == str(tool)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nowhere"))
    if not Path("/usr/local/cuda/bin/compute-sanitizer").is_file():
        with pytest.raises(pytest.fail.Exception, match="compute-sanitizer is not on PATH"):
            sanitizer()
