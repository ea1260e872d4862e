"""Which GPU the tensors are on, and which of a version's two kernels runs there."""

import dataclasses
import re

import tilus.target
import torch


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
