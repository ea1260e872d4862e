import importlib
import os
import re
import shutil
from pathlib import Path

import pytest

from support import build, cache, gpu, versions

# the 16-bit versions of the lesson (Hopper), which share one calling contract; the fp8 ones (v10, v11)
# have tests/test_fp8.py
VERSIONS = versions.sixteen_bit()
# the 16-bit Blackwell versions (blackwell/), numbered as the Hopper version of the same idea
BLACKWELL_VERSIONS = [name for name in versions.blackwell() if not versions.is_fp8(name)]
# every 16-bit kernel, as (module, architecture): the lesson's on Hopper, blackwell/'s on Blackwell
KERNEL_MODULES = [(name, "hopper") for name in VERSIONS] + [(name, "blackwell") for name in BLACKWELL_VERSIONS]
# v8's stream-K 128 x 256 in clusters of two: the schedule with the producer/consumer register split
REGISTER_SPLIT_SCHEDULE = dict(block_m=128, block_n=256, block_k=64, stages=4, group_m=8, cluster_m=2, stream_k=True)
ARCHS = sorted(gpu.ARCHS)


def child_env(**extra) -> dict:
    """The environment of a child Python process that imports the versions, support and the test modules."""
    paths = [str(cache.REPO), str(cache.REPO / "tests"), os.environ.get("PYTHONPATH", "")]
    return os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, paths))} | {k: str(v) for k, v in extra.items()}


def sanitizer() -> str:
    """compute-sanitizer: on PATH, in $CUDA_HOME/bin or in /usr/local/cuda/bin. The tests that need it run only where
    there is a GPU (marked ``gpu``); there, a sanitizer that cannot be found fails the test instead of skipping it."""
    candidates = [shutil.which("compute-sanitizer"),
                  *(str(Path(root) / "bin" / "compute-sanitizer") for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda")
                    if root)]
    found = next((path for path in candidates if path and Path(path).is_file()), None)
    if found is None:
        pytest.fail("compute-sanitizer is not on PATH, in $CUDA_HOME/bin nor in /usr/local/cuda/bin: this GPU machine "
                    "needs the CUDA toolkit's sanitizer for this test")
    return found


def no_gpu_reason() -> str | None:
    try:
        gpu.gpu_arch()
    except gpu.UnsupportedGPUError as reason:
        return str(reason)
    return None


def pytest_collection_modifyitems(config, items):
    reason = no_gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs a Hopper or Blackwell GPU: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def built():
    """built(version, arch) -> one build.BuildResult per schedule, built once per session."""
    results = {}

    def build_version(version: str, arch: str):
        if (version, arch) not in results:
            kernel = importlib.import_module(version).KERNELS[arch]
            results[version, arch] = build.build_schedules(kernel, arch, progress=lambda line: None)
        return results[version, arch]

    return build_version


_DTYPE_BYTES = {"float16": 2, "float32": 4, "uint64": 8, "uint32": 4, "int32": 4, "uint8": 1}


def shared_memory_map(source_cu: str) -> tuple[list[tuple[int, int]], tuple[int, int], int]:
    """(tiles as (offset, bytes), barriers as (offset, bytes), dynamic shared bytes) of a generated kernel.

    tilus writes each shared allocation as an IR comment followed by its address computation.
    """
    tiles = [
        (int(offset), int(size) * _DTYPE_BYTES[dtype])
        for dtype, size, offset in re.findall(
            r"AllocateShared\(\)  # shared, (\w+)\[[\d, ]+\], size=(\d+),.*?\n.*?\n\s*\w+ \*\w+ = "
            r"tilus_cuda_dynamic_shared_memory_\w+\((\d+)\)",
            source_cu,
        )
    ]
    barrier_offset = int(re.search(r"barriers = .*?dynamic_shared_memory_uint64\((\d+)\)", source_cu).group(1))
    barrier_count = len(re.findall(r"tilus_cuda_mbarrier_init_shared\(", source_cu.split("barriers = ", 1)[1].split("__syncthreads", 1)[0]))
    dynamic = int(re.search(r", (\d+), \(cudaStream_t\)", source_cu).group(1))
    return tiles, (barrier_offset, 8 * barrier_count), dynamic


def overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1]
