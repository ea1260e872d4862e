"""Every version as a torch custom op, a ``Linear`` on it, and a helper that swaps a model's ``nn.Linear``s.

    from support.torch_op import Linear, op, prepare, swap_linears

    c = op("v9")(a, b)  # torch.ops.tilus_gemm.v9: a @ b.T, a (M x K), b (N x K)
    swapped, kept = swap_linears(model, "v9")  # every eligible nn.Linear, in place, parameters shared
    layer = Linear(4096, 14336, bias=False, version="v9", device="cuda")

- ``op("v9")`` is ``torch.ops.tilus_gemm.v9``: ``(a, b) -> a @ b.T`` through ``matmul_v9.matmul``,
  registered with ``torch.library.custom_op`` on first use. Its fake implementation gives
  the output's shape and dtype, so ``torch.compile(fullgraph=True)`` traces a model that
  calls it without a graph break, and CUDA graphs (``mode="reduce-overhead"``) capture
  its launch. Gradients go through the same op: dA = dC @ B and dB = dC^T @ A, each as
  ``x @ y.T`` with y made K-major (contiguous) first, and dB's inner dimension, M,
  zero-padded to a multiple of 8 where it is not one (TMA's 16-byte rows; zeros add
  nothing).
- Tuning never happens inside a CUDA graph capture: the first call at a size bucket builds
  and tunes, which synchronizes the GPU, so ``support.dispatch`` refuses it during a
  capture with a RuntimeError that says what to do. Run the model once eagerly first
  (``torch.compile``'s reduce-overhead mode does, before it records), or call ``prepare``.
- ``Linear`` holds an N x K weight (and an optional bias) and computes ``x @ W.T + bias``
  for x of any leading dimensions; ``swap_linears`` replaces a model's eligible
  ``nn.Linear``s with it, sharing their parameters, and says which it left and why.
"""

import importlib

import torch
from torch import nn

from support import dispatch

DTYPES = (torch.float16, torch.bfloat16)
_ops: dict[str, object] = {}


def op(version: str = "v9"):
    """``torch.ops.tilus_gemm.<version>``: a @ b.T through that version's kernels, registered once (an fp8 version's
    takes the scales too: ``support.fp8_torch.op``)."""
    if version in _ops:
        return _ops[version]
    from support import fp8_torch

    if fp8_torch.is_fp8(version):
        return fp8_torch.op(version)
    matmul = importlib.import_module(f"matmul_{version}").matmul

    @torch.library.custom_op(f"tilus_gemm::{version}", mutates_args=(), device_types="cuda")
    def gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return matmul(a, b)

    @gemm.register_fake
    def _(a, b):
        torch._check(a.dim() == 2 and b.dim() == 2, lambda: "tilus_gemm: a (M x K) and b (N x K) must be 2-D")
        torch._check(a.shape[1] == b.shape[1], lambda: f"tilus_gemm: K differs, {a.shape[1]} and {b.shape[1]}")
        torch._check(a.dtype == b.dtype and a.dtype in DTYPES, lambda: "tilus_gemm: a and b both fp16 or both bf16")
        return a.new_empty(a.shape[0], b.shape[0])

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        grad = grad.contiguous()
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_a = gemm(grad, b.T.contiguous())  # dA = dC @ B: B^T is K x N
        if ctx.needs_input_grad[1]:
            grad_b = gemm(_k_major(grad.T), _k_major(a.T))  # dB = dC^T @ A, over M
        return grad_a, grad_b

    gemm.register_autograd(backward, setup_context=setup_context)
    _ops[version] = torch.ops.tilus_gemm.__getattr__(version)
    return _ops[version]


def _k_major(x: torch.Tensor) -> torch.Tensor:
    """x contiguous, its rows zero-padded to a multiple of 8 elements (TMA's 16-byte row strides)."""
    pad = -x.shape[1] % 8
    return torch.nn.functional.pad(x, (0, pad)).contiguous() if pad else x.contiguous()


def ineligible(in_features: int, out_features: int, dtype: torch.dtype) -> str | None:
    """Why the kernels cannot take this layer, or None if they can."""
    if dtype not in DTYPES:
        return f"dtype {dtype} (the kernels take fp16 and bf16)"
    for name, size in (("in_features", in_features), ("out_features", out_features)):
        if size % 8:
            return f"{name} {size} is not a multiple of 8 (TMA needs 16-byte rows)"
    return None


class Linear(nn.Module):
    """``y = x @ weight.T + bias`` through a version's op, for x of shape (..., in_features)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, version: str = "v9",
                 device=None, dtype=torch.bfloat16):
        super().__init__()
        reason = ineligible(in_features, out_features, dtype)
        if reason:
            raise ValueError(f"Linear({in_features}, {out_features}): {reason}")
        self.in_features, self.out_features, self.version = in_features, out_features, version
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(out_features, device=device, dtype=dtype)) if bias else None
        self.gemm = op(version)
        nn.Linear.reset_parameters(self)

    @classmethod
    def from_linear(cls, linear: nn.Linear, version: str = "v9") -> "Linear":
        """A Linear on the same parameters (shared, not copied)."""
        module = cls(linear.in_features, linear.out_features, bias=False, version=version, device="meta",
                     dtype=linear.weight.dtype)
        module.weight, module.bias = linear.weight, linear.bias
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        y = self.gemm(rows.contiguous(), self.weight) if rows.shape[0] else rows.new_empty(0, self.out_features)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, " \
               f"version={self.version}"


def swap_linears(model: nn.Module, version: str = "v9", **fp8) -> tuple[list[str], dict[str, str]]:
    """Replace every eligible ``nn.Linear`` of ``model`` by a ``Linear`` on its parameters, in place.

    Returns the names swapped and, for each ``nn.Linear`` left as it was, why. An fp8 version
    swaps in ``fp8_torch.Fp8Linear``s instead, ``fp8`` its options (``scaling``, ``backend``, ``quantizer``).
    """
    from support import fp8_torch

    if fp8_torch.is_fp8(version):
        return fp8_torch.swap_linears(model, version, **fp8)
    if fp8:
        raise TypeError(f"{', '.join(fp8)}: options of the fp8 versions' swap, and {version} is a 16-bit version")
    swapped, kept = [], {}
    for module, child_name, full, child in linears(model):
        reason = ineligible(child.in_features, child.out_features, child.weight.dtype)
        if reason:
            kept[full] = reason
        else:
            setattr(module, child_name, Linear.from_linear(child, version))
            swapped.append(full)
            dispatch.reserve_workspace(child.weight.device)
    return swapped, kept


def linears(model: nn.Module) -> list[tuple]:
    """Each ``nn.Linear`` in ``model`` (not a subclass), as ``children`` lists it."""
    return children(model, lambda child: type(child) is nn.Linear)


def children(model: nn.Module, test) -> list[tuple]:
    """Each module in ``model`` that passes ``test``: (its parent, its attribute name, its full name, the module),
    listed before the caller replaces any."""
    return [(module, child_name, f"{name}.{child_name}" if name else child_name, child)
            for name, module in model.named_modules() for child_name, child in module.named_children()
            if test(child)]


def prepare(version: str, sizes, dtype: torch.dtype = torch.bfloat16, device: str = "cuda") -> None:
    """Build and tune each (M, N, K) now, eagerly, so that no later call tunes (e.g. inside a graph capture); an fp8
    version's with its own scaling, C of ``dtype`` (``fp8_torch.prepare``)."""
    from support import fp8_torch

    if fp8_torch.is_fp8(version):
        return fp8_torch.prepare(version, sizes, out_dtype=dtype, device=device)
    matmul = importlib.import_module(f"matmul_{version}").matmul
    for m, n, k in sizes:
        matmul(torch.randn(m, k, device=device).to(dtype), torch.randn(n, k, device=device).to(dtype))
    torch.cuda.synchronize()
