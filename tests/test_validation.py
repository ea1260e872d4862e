"""matmul(a, b, out) rejects what the kernels cannot take with a TypeError/ValueError naming the rule.

The shape, dtype and layout rules are checked before the device, so they run on CPU tensors here.
"""

import pytest
import torch
from conftest import STAGES

from support import checks, gpu
import matmul_v1


def half(*shape):
    return torch.randn(*shape).half()


@pytest.mark.parametrize(
    "a, b, error, rule",
    [
        ([[1.0]], half(8, 8), TypeError, "a must be a torch.Tensor"),
        (half(8, 8), None, TypeError, "b must be a torch.Tensor"),
        (torch.randn(8, 8), half(8, 8), TypeError, "a must be torch.float16, got torch.float32"),
        (half(8, 8), torch.randn(8, 8).bfloat16(), TypeError, "b must be torch.float16"),
        (half(64), half(8, 8), ValueError, "a must be 2-D, got 1-D"),
        (half(8, 8), half(2, 8, 8), ValueError, "b must be 2-D, got 3-D"),
        (half(16, 32), half(16, 24), ValueError, "K mismatch: a is 16x32 and b is 16x24"),
        (half(0, 8), half(8, 8), ValueError, "empty dimension: M=0"),
        (half(8, 0), half(8, 0), ValueError, "empty dimension: .*K=0"),
        (half(16, 12), half(16, 12), ValueError, "row length must be a multiple of 8"),
        (half(16, 16), half(12, 16), ValueError, "N=12: .* multiple of 8"),
        (half(64, 16)[:, :8], half(8, 8), ValueError, "a must be contiguous"),
        (half(16, 8), half(8, 16).t(), ValueError, "b must be contiguous"),
        (half(8 * 8 + 1)[1:].view(8, 8), half(8, 8), ValueError, "16-byte aligned"),
        (half(8, 8), half(8, 8), ValueError, "a is on the CPU; move it to the GPU"),
    ],
)
def test_bad_input_is_rejected_with_the_rule(a, b, error, rule):
    with pytest.raises(error, match=rule):
        matmul_v1.matmul(a, b)


@pytest.mark.parametrize(
    "out, error, rule",
    [
        ("not a tensor", TypeError, "out must be a torch.Tensor"),
        (torch.empty(8, 16, dtype=torch.float32), TypeError, "out must be torch.float16"),
        (torch.empty(16, 8, dtype=torch.float16), ValueError, r"out must have shape \(8, 16\)"),
        (torch.empty(16, 8, dtype=torch.float16).t(), ValueError, "out must be contiguous"),
    ],
)
def test_bad_out_is_rejected_with_the_rule(out, error, rule):
    with pytest.raises(error, match=rule):
        matmul_v1.matmul(half(8, 32), half(16, 32), out=out)


def test_too_large_for_32_bit_indexing():
    a = torch.empty(2**16, 2**15 + 8, dtype=torch.float16, device="meta")
    b = torch.empty(8, 2**15 + 8, dtype=torch.float16, device="meta")
    with pytest.raises(ValueError, match="32-bit integers"):
        checks.check_inputs(a, b)


@pytest.mark.parametrize("stage", STAGES)
def test_every_stage_validates(stage):
    module = __import__(stage)
    with pytest.raises(ValueError, match="K mismatch"):
        module.matmul(half(16, 32), half(16, 24))


def test_unsupported_gpu_is_named(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(gpu.UnsupportedGPUError, match="A100-SXM4-80GB is sm_80; these kernels need Hopper"):
        gpu.gpu_arch()
    assert issubclass(gpu.UnsupportedGPUError, ValueError)


@pytest.mark.parametrize("capability, arch", [((9, 0), "hopper"), ((10, 0), "blackwell"), ((10, 3), "blackwell")])
def test_dispatch_by_compute_capability(monkeypatch, capability, arch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert gpu.gpu_arch() == arch


def test_no_gpu_is_named(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(gpu.UnsupportedGPUError, match="no CUDA GPU is visible"):
        gpu.gpu_arch()


@pytest.mark.parametrize(
    "name, slug",
    [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H100 PCIe", "h100-pcie"), ("NVIDIA H200", "h200"), ("NVIDIA B200", "b200")],
)
def test_gpu_slug(name, slug):
    assert gpu.gpu_slug(name) == slug
