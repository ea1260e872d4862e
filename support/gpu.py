"""Which GPU the tensors are on, and which of a version's two kernels runs there."""

import ctypes
import dataclasses
import functools
import importlib
import re

import tilus.target
import torch

from support import versions


@dataclasses.dataclass(frozen=True)
class Arch:
    name: str
    target: tilus.target.Target
    sm: str
    mma_instruction: str


ARCHS = {
    "hopper": Arch("hopper", tilus.target.nvgpu_sm90a, "sm_90a", "wgmma.mma_async"),
    "blackwell": Arch("blackwell", tilus.target.nvgpu_sm100a, "sm_100a", "tcgen05.mma"),
}


class UnsupportedGPUError(ValueError):
    """The tensors live on a GPU these kernels were not written for."""


def gpu_arch(device: torch.device | None = None) -> str:
    """'hopper' (sm_90) or 'blackwell' (sm_100 family) for the device, else UnsupportedGPUError."""
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        raise UnsupportedGPUError(f"no CUDA GPU is visible to torch {torch.__version__} ({build})")
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) == (9, 0):
        return "hopper"
    if major == 10:
        return "blackwell"
    raise UnsupportedGPUError(
        f"{torch.cuda.get_device_name(device)} is sm_{major}{minor}; these kernels need "
        "Hopper (sm_90: wgmma) or Blackwell (sm_100/sm_103: tcgen05)"
    )


def gpu_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100', 'NVIDIA H100 PCIe' -> 'h100-pcie' (results file names)."""
    lowered = name.lower()
    model = re.search(r"\b([a-z]{1,2}\d{2,3}[a-z]?)\b", lowered)
    if model is None:
        return re.sub(r"[^a-z0-9]+", "-", lowered).strip("-")
    variants = [v for v in ("pcie", "nvl") if v in lowered]
    return "-".join([model.group(1), *variants])


def gpu_label(device=None) -> str:
    """The slug of the GPU torch sees (cache directories, results file names)."""
    return gpu_slug(torch.cuda.get_device_name(device))


# a kernel that does nothing, to ask the driver how many clusters fit at once (the count depends
# on the cluster's shape and the CTA's resources, not on the code)
_EMPTY_PTX = b".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry empty() { ret; }\n"
_MAX_DYNAMIC_SHARED = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_SHARED_OPTIN = 97  # CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
_CLUSTER_DIMENSION = 4  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: an id, then a 64-byte union at offset 8
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)), ("count", ctypes.c_uint)]


@functools.cache
def cluster_sms(index: int, cluster: int) -> int:
    """SMs that clusters of ``cluster`` CTAs, one CTA an SM, fill at once on GPU ``index``.

    A cluster's CTAs run on one GPC (a group of SMs), and a chip's GPCs hold different numbers
    of SMs, so clusters of four may leave some SMs idle. A persistent kernel that launched more
    clusters than fit would run the extra ones after the rest. The driver's
    cuOccupancyMaxActiveClusters counts what fits, asked for an empty kernel with all the shared
    memory a CTA may have (so one CTA an SM, as in the schedules that use clusters of four).
    """
    driver = ctypes.CDLL("libcuda.so.1")

    def check(result: int, call: str) -> None:
        if result != 0:
            raise RuntimeError(f"{call} failed with CUresult {result} on GPU {index}")

    module, function, shared, count = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_int(), ctypes.c_int()
    with torch.cuda.device(index):
        torch.cuda.synchronize()  # torch's context for the GPU is current on this thread from here
        check(driver.cuDeviceGetAttribute(ctypes.byref(shared), _SHARED_OPTIN, index), "cuDeviceGetAttribute")
        check(driver.cuModuleLoadData(ctypes.byref(module), _EMPTY_PTX), "cuModuleLoadData")
        try:
            check(driver.cuModuleGetFunction(ctypes.byref(function), module, b"empty"), "cuModuleGetFunction")
            check(driver.cuFuncSetAttribute(function, _MAX_DYNAMIC_SHARED, shared), "cuFuncSetAttribute")
            attribute = _LaunchAttribute(id=_CLUSTER_DIMENSION)
            attribute.value[:3] = (cluster, 1, 1)
            config = _LaunchConfig(grid=(cluster, 1, 1), block=(128, 1, 1), shared=shared.value,
                                   attrs=ctypes.pointer(attribute), count=1)
            check(driver.cuOccupancyMaxActiveClusters(ctypes.byref(count), function, ctypes.byref(config)),
                  "cuOccupancyMaxActiveClusters")
        finally:
            driver.cuModuleUnload(module)
    return count.value * cluster


class Kernels(dict):
    """A version's kernel for each architecture that has one ('hopper', 'blackwell'), and the version's name.

    Looking up an architecture the version has no kernel for raises UnsupportedGPUError naming
    the script to run instead.
    """

    def __init__(self, version: str, **by_arch):
        super().__init__(by_arch)
        self.version = version

    def __missing__(self, arch: str):
        raise UnsupportedGPUError(self.missing_reason(arch))

    def missing_reason(self, arch: str) -> str:
        """Why this version has no kernel for ``arch``, naming the script to run instead."""
        if arch == "hopper":
            return f"blackwell/matmul_{self.version}.py holds Blackwell's kernel; on Hopper run matmul_{self.version}.py"
        earlier = [name for name in versions.blackwell() if versions.number(name) <= versions.number(self.version)]
        return (f"{self.version}'s idea has no Blackwell kernel; the nearest Blackwell version is "
                f"{earlier[-1].replace('.', '/')}.py (docs/blackwell.md)")


def kernels(version: str, hopper=None, blackwell=None, table: str = "KERNELS") -> Kernels:
    """A version file's KERNELS (or another ``table`` of kernels, such as v11's BLOCKWISE_KERNELS).

    A top-level version names its Hopper kernel, and the Blackwell kernel of the same idea comes
    from the same table of blackwell/matmul_<version>.py where there is one; a blackwell/ version
    names its own.
    """
    if hopper is not None and blackwell is None and f"blackwell.matmul_{version}" in versions.blackwell():
        blackwell = getattr(importlib.import_module(f"blackwell.matmul_{version}"), table, {}).get("blackwell")
    return Kernels(version, **{arch: kernel for arch, kernel in (("hopper", hopper), ("blackwell", blackwell))
                               if kernel is not None})
