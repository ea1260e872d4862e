"""matmul(a, b, out) rejects what the kernels cannot take with a TypeError/ValueError naming the rule.

The shape, dtype and layout rules are checked before the device, so they run on CPU tensors here.
"""

import math

import pytest
import torch
from conftest import VERSIONS

import matmul_v1
from support import checks, dispatch, gpu, measure


def half(*shape):
    return torch.randn(*shape).half()


@pytest.mark.parametrize(
    "a, b, error, rule",
    [
        ([[1.0]], half(8, 8), TypeError, "a must be a torch.Tensor"),
        (half(8, 8), None, TypeError, "b must be a torch.Tensor"),
        (torch.randn(8, 8), half(8, 8), TypeError, "a must be torch.float16 or torch.bfloat16, got torch.float32"),
        (half(8, 8), torch.randn(8, 8).bfloat16(), TypeError,
         "a and b must have one dtype .* got torch.float16 and torch.bfloat16"),
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
        # the kinds above name each rule once; these are the other ways users meet them
        (torch.tensor(1.0).half(), half(8, 8), ValueError, "a must be 2-D, got 0-D"),
        (half(8, 8).to(torch.float8_e4m3fn), half(8, 8), TypeError,
         "a must be torch.float16 or torch.bfloat16, got torch.float8_e4m3fn"),
        (torch.randn(8, 8), torch.randn(8, 8).bfloat16(), TypeError, "a must be torch.float16 or torch.bfloat16"),
        # bf16 passes every rule above: these fail only where the device is checked
        (half(8, 8).bfloat16(), half(8, 8).bfloat16(), ValueError, "a is on the CPU"),
        (half(8, 8), half(0, 8), ValueError, "empty dimension: M=8, N=0"),
        (half(1, 8).expand(8, 8), half(8, 8), ValueError, r"a must be contiguous .* got strides \(0, 1\)"),
        (half(8, 16)[:, ::2], half(8, 8), ValueError, r"a must be contiguous .* got strides \(16, 2\)"),
        (half(8, 8), half(8 * 8 + 1)[1:].view(8, 8), ValueError, "b must start at a 16-byte aligned address"),
    ],
)
def test_bad_input_is_rejected_with_the_rule(a, b, error, rule):
    with pytest.raises(error, match=rule):
        matmul_v1.matmul(a, b)


@pytest.mark.parametrize(
    "out, error, rule",
    [
        ("not a tensor", TypeError, "out must be a torch.Tensor"),
        (torch.empty(8, 16, dtype=torch.float32), TypeError, "out must be torch.float16 like a and b"),
        (torch.empty(8, 16, dtype=torch.bfloat16), TypeError, r"out must be torch.float16 like a and b .* got torch.bfloat16"),
        (torch.empty(16, 8, dtype=torch.float16), ValueError, r"out must have shape \(8, 16\)"),
        (torch.empty(16, 8, dtype=torch.float16).t(), ValueError, "out must be contiguous"),
        (torch.empty(128, dtype=torch.float16), ValueError, "out must be 2-D, got 1-D"),
        (torch.empty(1, 16, dtype=torch.float16).expand(8, 16), ValueError, "out must be contiguous"),
        (torch.empty(8 * 16 + 1, dtype=torch.float16)[1:].view(8, 16), ValueError, "out must start at a 16-byte"),
    ],
)
def test_bad_out_is_rejected_with_the_rule(out, error, rule):
    with pytest.raises(error, match=rule):
        matmul_v1.matmul(half(8, 32), half(16, 32), out=out)


def meta(*shape):
    """A tensor with a shape and no storage: "too large" cases allocate nothing."""
    return torch.empty(*shape, dtype=torch.float16, device="meta")


def test_too_large_for_32_bit_indexing():
    a = meta(2**16, 2**15 + 8)
    b = meta(8, 2**15 + 8)
    with pytest.raises(ValueError, match="32-bit integers"):
        checks.check_inputs(a, b)


@pytest.mark.parametrize(
    "a, b",
    [
        (meta(2**16, 2**15 + 8), meta(8, 2**15 + 8)),  # A has 2**31 + 2**19 elements
        (meta(8, 2**15 + 8), meta(2**16, 2**15 + 8)),  # B
        (meta(2**16, 8), meta(2**15 + 8, 8)),  # only C: 65536 x 32776, from inputs of 1 MiB and 0.5 MiB
    ],
    ids=["a", "b", "out"],
)
def test_too_large_is_rejected_by_matmul_before_the_device(a, b):
    with pytest.raises(ValueError, match=r"is too large: the kernels index each matrix with 32-bit integers"):
        matmul_v1.matmul(a, b)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_version_validates(version):
    module = __import__(version)
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


# GPU-only rules: each names the rule and nothing runs (a sentinel output stays NaN and
# the inputs keep their values). Tensors are made inside the test, where CUDA exists.


def gpu_case(name: str):
    """(a, b, out, error, rule) for one GPU-only bad input."""
    a = torch.randn(64, 64, device="cuda").half()
    b = torch.randn(64, 64, device="cuda").half()
    out = torch.full((64, 64), math.nan, dtype=torch.float16, device="cuda")
    if name == "b on the CPU":
        return a, b.cpu(), out, ValueError, "b is on the CPU; move it to the GPU"
    if name == "out on the CPU":
        return a, b, out.cpu(), ValueError, "out is on the CPU; move it to the GPU"
    if name == "out is a":
        return a, b, a, ValueError, "out must not share memory with a or b"
    if name == "out is b":
        return a, b, b, ValueError, "out must not share memory with a or b"
    if name == "out overlaps half of a":
        buffer = torch.randn(64 * 64 + 64 * 32, device="cuda").half()
        a = buffer[: 64 * 64].view(64, 64)
        return a, b, buffer[64 * 32 :].view(64, 64), ValueError, "out must not share memory with a or b"
    raise KeyError(name)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["b on the CPU", "out on the CPU", "out is a", "out is b", "out overlaps half of a"])
def test_gpu_only_rules_reject_before_launching(name):
    a, b, out, error, rule = gpu_case(name)
    before = [t.clone() for t in (a, b, out)]
    with pytest.raises(error, match=rule):
        matmul_v1.matmul(a, b, out=out)
    torch.cuda.synchronize()
    for tensor, saved in zip((a, b, out), before):
        assert torch.equal(tensor.isnan(), saved.isnan()) and torch.equal(tensor.nan_to_num(), saved.nan_to_num())


@pytest.mark.gpu
def test_out_next_to_a_in_one_buffer_is_accepted():
    # the negative control of the overlap rule: touching but not overlapping is fine
    buffer = torch.randn(64 * 64 + 64 * 64, device="cuda").half()
    a, out = buffer[: 64 * 64].view(64, 64), buffer[64 * 64 :].view(64, 64)
    b = torch.randn(64, 64, device="cuda").half()
    saved = a.clone()
    matmul_v1.matmul(a, b, out=out)
    torch.cuda.synchronize()
    assert torch.equal(a, saved)
    assert measure.passes(measure.relative_error(out, a.float() @ b.float().T))


@pytest.mark.gpu
def test_unsupported_gpu_is_rejected_by_matmul_before_launching(monkeypatch):
    a = torch.randn(64, 64, device="cuda").half()
    out = torch.full((64, 64), math.nan, dtype=torch.float16, device="cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    for learnt in ("_devices", "_by_size"):  # what the process learnt of its GPU and sizes, forgotten
        monkeypatch.setattr(dispatch, learnt, {})
    with pytest.raises(gpu.UnsupportedGPUError, match="is sm_80; these kernels need Hopper"):
        matmul_v1.matmul(a, a, out=out)
    torch.cuda.synchronize()
    assert out.isnan().all()


@pytest.mark.gpu
def test_tensors_on_two_gpus_are_rejected():
    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU on this machine")
    a = torch.randn(64, 64, device="cuda:0").half()
    b = torch.randn(64, 64, device="cuda:1").half()
    out = torch.full((64, 64), math.nan, dtype=torch.float16, device="cuda:0")
    with pytest.raises(ValueError, match="a, b and out must be on one GPU"):
        matmul_v1.matmul(a, b, out=out)
    with pytest.raises(ValueError, match="a, b and out must be on one GPU"):
        matmul_v1.matmul(a, a, out=out.to("cuda:1"))
    torch.cuda.synchronize()
    assert out.isnan().all()
