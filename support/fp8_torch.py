"""The fp8 versions (v10, v11) in a torch program: an op, activation quantization, an inference-only Linear, the swap.

    from support.fp8_torch import Fp8Linear, compile_options, op, quantize_activations, swap_linears

    c = op("v11")(a8, b8, scale_a, scale_b, torch.bfloat16)  # torch.ops.tilus_gemm.v11
    x8, scale = quantize_activations(x, "1x128")  # e4m3 and float32 scales, as v11 takes them
    swapped, kept = swap_linears(model, "v11", scaling="block")  # each eligible nn.Linear but the LM head
    layer = Fp8Linear.from_linear(linear, "v10", scaling="row")
    compiled = torch.compile(model, options=compile_options())  # Linears that read one x quantize it once

- ``op(version)`` is ``torch.ops.tilus_gemm.<version>``: ``(a8, b8, scale_a, scale_b, out_dtype)
  -> C`` through that version's ``matmul``. The scaling follows from the scales' shapes, as
  ``matmul`` reads it. The fake implementation checks every rule that needs no memory and
  gives C's shape (M x N) and dtype, so ``torch.compile(fullgraph=True)`` traces through it.
  The first call at a size bucket tunes, and ``support.dispatch`` refuses that inside a CUDA
  graph capture, as for the 16-bit ops: call ``prepare`` or run once eagerly first.
- ``quantize_activations`` quantizes each row (per token) or each 1 x 128 block of a bf16
  activation into e4m3 and float32 scales, with ``scaled.quantize``'s arithmetic, in one pass
  of quantize.py's kernel (an op, ``tilus_gemm::quantize``, inside torch.compile). The 1 x 128
  scales come out M-major (``scaled.m_major``), as v11's kernel loads them by TMA.
- ``Fp8Linear`` holds its weight in e4m3 with its scales (per output channel, or per 128 x
  128 block), quantized once; each call quantizes its input, runs the op and adds the bias.
  Inference only: a call that autograd would record raises. ``backend="scaled_mm"`` runs the
  same quantized tensors through ``torch._scaled_mm`` (cuBLASLt, as the op ``scaled_mm_op``)
  instead: the peer it is timed against.
- ``compile_options()`` adds ``ShareQuantizers`` to Inductor's passes: Linears that read one x
  (q, k and v) launch one quantizer in a compiled graph, not one each.
"""

import importlib
import operator

import torch
from torch import nn
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
from torch._subclasses.fake_tensor import is_fake

import quantize
from support import dispatch, scaled, versions

# what each scaling quantizes: the activations (A, rows = tokens) and the weights (B, rows = output channels)
ACTIVATION = {"row": "row", "block": "1x128"}
WEIGHT = {"row": "row", "block": "128x128"}
OUT_DTYPES = tuple(scaled.OUT_DTYPES)
# the Linear that swap_linears keeps in 16-bit whatever its shape, and why
KEEP = {"lm_head": "for the logits' precision (fp8 serving stacks quantize the decoder's Linears and keep the LM "
                   "head in 16-bit)"}
BACKENDS = ("tilus", "scaled_mm")
# how a compiled graph quantizes the activations: quantize.py's kernel as an op, or the same arithmetic in torch,
# which Inductor fuses into the kernel that writes x (RMSNorm, SiLU(gate) x up); eagerly, always the kernel
QUANTIZERS = ("kernel", "fused")
_ops: dict[str, object] = {}


def is_fp8(version: str) -> bool:
    """A version whose matmul takes e4m3 operands with their scales (v10, v11)."""
    return (versions.REPO / f"matmul_{version}.py").exists() and versions.is_fp8(f"matmul_{version}")


def scalings(version: str) -> tuple[str, ...]:
    """The scalings an Fp8Linear on ``version`` can use: row-wise, and block-wise where the version has its kernels;
    the first is the version's own idea (v11: block-wise)."""
    module = importlib.import_module(f"matmul_{version}")
    return ("block", "row") if getattr(module, "BLOCKWISE_KERNELS", None) is not None else ("row",)


def check_meta(version: str, a, b, scale_a, scale_b, out_dtype) -> str:
    """The rules of ``scaled.check_inputs`` that need no memory (``scaled.check_shapes``) and the version's
    scalings; the scaling, or a TypeError/ValueError naming the rule. The op's fake implementation."""
    m, n, k, scaling = scaled.check_shapes(a, b, scale_a, scale_b, out_dtype)
    if scaling == "block" and "block" not in scalings(version):
        later = scaled.next_fp8(version)
        raise ValueError(f"{version} takes per-tensor and row-wise scales; block-wise scales (scale_a "
                         f"{tuple(scale_a.shape)}, scale_b {tuple(scale_b.shape)}) are {later}'s: "
                         f"matmul_{later}.matmul")
    return scaling


def op(version: str = "v11"):
    """``torch.ops.tilus_gemm.<version>``: (a8, b8, scale_a, scale_b, out_dtype) -> C, registered once."""
    if version in _ops:
        return _ops[version]
    if not is_fp8(version):
        fp8 = [name.removeprefix("matmul_") for name in versions.fp8()]
        raise ValueError(f"{version} is not an fp8 version (those are {fp8}); support.torch_op.op takes the 16-bit ones")
    matmul = importlib.import_module(f"matmul_{version}").matmul

    @torch.library.custom_op(f"tilus_gemm::{version}", mutates_args=(), device_types="cuda")
    def gemm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
             out_dtype: torch.dtype) -> torch.Tensor:
        return matmul(a, b, scale_a, scale_b, out_dtype=out_dtype)

    @gemm.register_fake
    def _(a, b, scale_a, scale_b, out_dtype):
        check_meta(version, a, b, scale_a, scale_b, out_dtype)
        return a.new_empty(a.shape[0], b.shape[0], dtype=out_dtype)

    def backward(ctx, grad):
        raise RuntimeError(f"tilus_gemm.{version} is inference-only: it has no backward; call it under "
                           "torch.no_grad()")

    gemm.register_autograd(backward)
    _ops[version] = getattr(torch.ops.tilus_gemm, version)
    return _ops[version]


def scaled_mm_op():
    """``torch.ops.tilus_gemm.scaled_mm``: torch._scaled_mm (cuBLASLt) behind a custom op, the peer's GEMM.

    As an op, Inductor hands it its scales in the layout they were traced with (a custom op's
    inputs keep their strides) and never replaces cuBLASLt by a Triton template of its own: the
    peer is cuBLASLt in every mode, as the tilus op is tilus.
    """
    if "scaled_mm" in _ops:
        return _ops["scaled_mm"]

    @torch.library.custom_op("tilus_gemm::scaled_mm", mutates_args=(), device_types="cuda")
    def gemm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, out_dtype: torch.dtype,
             use_fast_accum: bool) -> torch.Tensor:
        return torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=out_dtype, use_fast_accum=use_fast_accum)

    @gemm.register_fake
    def _(a, b, scale_a, scale_b, out_dtype, use_fast_accum):
        torch._check(a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0],
                     lambda: f"scaled_mm: a (M x K) and b (K x N), got {tuple(a.shape)} and {tuple(b.shape)}")
        return a.new_empty(a.shape[0], b.shape[1], dtype=out_dtype)

    _ops["scaled_mm"] = torch.ops.tilus_gemm.scaled_mm
    return _ops["scaled_mm"]


# --- activation quantization ---------------------------------------------------------------------------

def quantize_rows(x: torch.Tensor, granularity: str, layout: str = "m4") -> tuple[torch.Tensor, torch.Tensor]:
    """(x8, scale) of a 2-D activation, ``scaled.quantize``'s arithmetic in torch (the CPU's quantizer): 'row' gives
    rows x 1 scales, '1x128' rows x ceil(K / 128) ones, laid out as ``layout`` says: 'm4' M-major with the rows
    padded to a multiple of 4 (``scaled.m_major``: v11's), 'm' M-major unpadded, 'k' K-major (row-major)."""
    rows, k = x.shape
    x32 = x.float()
    if granularity == "row":
        scale = x32.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / scaled.E4M3_MAX
        return (x32 / scale).clamp(-scaled.E4M3_MAX, scaled.E4M3_MAX).to(scaled.FP8), scale
    kb, whole = -(-k // scaled.BLOCK), k - k % scaled.BLOCK
    if whole == 0:
        x8, scale = quantize_rows(x, "row")  # one group: the row
    elif whole < k:
        # a last group shorter than 128 on its own, as a row: x padded to whole groups compiled to wrong values there
        # on the CPU (torch 2.13)
        (head8, head), (last8, last) = quantize_rows(x[:, :whole], granularity, "k"), quantize_rows(x[:, whole:], "row")
        x8, scale = torch.cat([head8, last8], dim=1), torch.cat([head, last], dim=1)
    else:
        blocks = x32.view(rows, kb, scaled.BLOCK)
        scale = blocks.abs().amax(dim=2).clamp(min=1e-12) / scaled.E4M3_MAX
        x8 = (blocks / scale[:, :, None]).clamp(-scaled.E4M3_MAX, scaled.E4M3_MAX).view(rows, k).to(scaled.FP8)
    if layout == "k":
        return x8, scale
    by_k = scale.new_empty(kb, rows + (-rows % 4 if layout == "m4" else 0))  # K blocks x rows, as scaled.m_major
    by_k[:, :rows] = scale.T
    return x8, by_k[:, :rows].T


# quantize.py's kernel as an op, registered on import (never first inside a trace), so that torch.compile traces
# through it (fullgraph) and a CUDA graph records it
@torch.library.custom_op("tilus_gemm::quantize", mutates_args=(), device_types="cuda")
def quantize_op(x: torch.Tensor, granularity: str, layout: str,
                gated: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize.quantize(x, granularity, layout, gated)


@quantize_op.register_fake
def _(x, granularity, layout, gated=False):
    rows, k = x.shape[0], x.shape[1] // 2 if gated else x.shape[1]
    shape, strides, _ = quantize.scale_layout(rows, k, granularity, layout)
    return x.new_empty(rows, k, dtype=scaled.FP8), x.new_empty_strided(shape, strides, dtype=torch.float32)


def check_quantizer(quantizer: str) -> None:
    if quantizer not in QUANTIZERS:
        raise ValueError(f"quantizer must be one of {QUANTIZERS}, got {quantizer!r}")


def quantizer_of(quantizer: str | dict[str, str], name: str) -> str:
    """The quantizer of the Linear ``name`` (its attribute name, e.g. 'o_proj'): ``quantizer`` itself, or its entry
    in a mapping of names to quantizers, 'kernel' where it has none."""
    return quantizer if isinstance(quantizer, str) else quantizer.get(name, "kernel")


def swiglu(x: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) x up of rows of gate then up (a Llama MLP's activation), in x's dtype as the 16-bit model does it."""
    half = x.shape[-1] // 2
    return nn.functional.silu(x[..., :half]) * x[..., half:]


def quantize_activations(x: torch.Tensor, granularity: str, layout: str = "m4", quantizer: str = "kernel",
                         gated: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x (rows x K, bf16/fp16/fp32) in e4m3 with its float32 scales: per token ('row', rows x 1) or per 1 x 128
    block ('1x128', rows x ceil(K / 128), M-major as v11 takes them). ``gated``: x is rows x 2K, gate then up, and
    what is quantized is ``swiglu(x)``.

    On a GPU, quantize.py's kernel (one pass, SiLU x up included; inside torch.compile, through ``quantize_op``,
    or, with ``quantizer='fused'``, ``quantize_rows`` for Inductor to fuse); on the CPU, ``quantize_rows``.
    """
    quantize.check_granularity(granularity)
    check_quantizer(quantizer)
    if not x.is_cuda or ((torch.compiler.is_compiling() or is_fake(x)) and quantizer == "fused"):
        return quantize_rows(swiglu(x) if gated else x, granularity, layout)
    if torch.compiler.is_compiling() or is_fake(x):
        return torch.ops.tilus_gemm.quantize(x, granularity, layout, gated)
    return quantize.quantize(x, granularity, layout, gated)


# --- one quantizer launch per input, in a compiled graph -------------------------------------------------

class ShareQuantizers(CustomGraphPass):
    """An Inductor pass (``compile_options``): Linears that read one x (q, k and v; gate and up) quantize it once.

    Each Fp8Linear calls the quantizer op on its own x. In an inference graph, Inductor does not merge identical
    calls of a custom op: AOTAutograd's CSE runs only when it partitions a training graph, or with freezing. The
    pass merges the op's calls on the same x, through the same views (or zero padding), with the same arguments.
    The graph is functional, so x written between two calls is another node; a count of ops with a mutable schema
    keeps the calls apart in a graph that is not. Calls whose results the graph returns (through views too) stay
    apart: two outputs would be one tensor. A graph without the op stays as it is.
    """

    LEADS = (torch.ops.aten.view.default, torch.ops.aten.reshape.default, torch.ops.aten._unsafe_view.default,
             torch.ops.aten.constant_pad_nd.default)  # what a Linear does to x before it quantizes it

    def __call__(self, graph: torch.fx.Graph) -> None:
        seen, writes = {}, 0
        for node in list(graph.nodes):
            if node.op != "call_function":
                continue
            if isinstance(node.target, torch._ops.OpOverload) and node.target._schema.is_mutable:
                writes += 1
            elif node.target is torch.ops.tilus_gemm.quantize.default and not self.returned(node):
                key = (writes, self.source(node.args[0]), node.args[1:], tuple(sorted(node.kwargs.items())))
                first = seen.setdefault(key, node)
                if first is not node:
                    x = node.args[0]
                    node.replace_all_uses_with(first)
                    graph.erase_node(node)
                    while x.op == "call_function" and x.target in self.LEADS and not x.users:  # unused now
                        x, dead = x.args[0], x
                        graph.erase_node(dead)

    def source(self, x: torch.fx.Node) -> tuple:
        """What x is, up to LEADS: the node they start from and each one's target and arguments, hashable."""
        if x.op == "call_function" and x.target in self.LEADS:
            return (*self.source(x.args[0]), x.target, *(tuple(a) if isinstance(a, list) else a for a in x.args[1:]))
        return (x,)

    @staticmethod
    def returned(node: torch.fx.Node) -> bool:
        """Whether the graph returns the node's result or a view of it."""
        users = list(node.users)
        while users:
            user = users.pop()
            if user.op == "output":
                return True
            if user.target is operator.getitem or getattr(user.target, "is_view", False):
                users.extend(user.users)
        return False

    def uuid(self) -> bytes:
        return get_hash_for_files((__file__,))


def compile_options(cudagraphs: bool = False) -> dict:
    """``torch.compile(model, options=...)`` for a model with Fp8Linears: ``ShareQuantizers``, and with
    ``cudagraphs`` what ``mode="reduce-overhead"`` sets (torch.compile takes a mode or options, not both)."""
    return {"post_grad_custom_pre_pass": ShareQuantizers(),
            **(torch._inductor.list_mode_options("reduce-overhead") if cudagraphs else {})}


# --- the Linear ----------------------------------------------------------------------------------------

def ineligible(in_features: int, out_features: int, dtype: torch.dtype, backend: str = "tilus") -> str | None:
    """Why an fp8 Linear cannot take this layer, or None if it can."""
    if dtype not in OUT_DTYPES:
        return f"dtype {dtype} (the fp8 Linear returns fp16 or bf16, as the layer it replaces)"
    if in_features % 16:
        return f"in_features {in_features} is not a multiple of 16 (TMA needs 16-byte rows of fp8)"
    if out_features % (16 if backend == "scaled_mm" else 8):
        return f"out_features {out_features} is not a multiple of " + (
            "16 (torch._scaled_mm needs it)" if backend == "scaled_mm" else "8 (TMA stores 16-byte rows of C)")
    return None


class Fp8Linear(nn.Module):
    """``y = x @ W.T + bias`` with W in e4m3 (quantized once) and x quantized at each call; inference only.

    ``scaling``: 'row' (a scale per output channel and per token) or 'block' (per 128 x 128 block
    of W and per 1 x 128 block of x). ``backend``: 'tilus' (the version's op) or 'scaled_mm'
    (``torch._scaled_mm`` on the same tensors, through ``scaled_mm_op``: cuBLASLt, the peer).
    ``quantizer``: how a compiled graph quantizes x (``QUANTIZERS``); eagerly, quantize.py's kernel.
    ``gated``: x is 2 x in_features wide, gate then up, and the Linear takes SiLU(gate) x up, computed as it is
    quantized (``Fp8GatedMLP``'s down projection). The weight, its scales and the bias are buffers:
    they move with ``.to()`` and are in the state dict, but are no Parameters.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, version: str = "v11",
                 scaling: str | None = None, backend: str = "tilus", quantizer: str = "kernel", gated: bool = False,
                 device=None, dtype=torch.bfloat16):
        super().__init__()
        scaling = scaling or scalings(version)[0]
        if scaling not in scalings(version):
            raise ValueError(f"{version} takes scaling {' or '.join(map(repr, scalings(version)))} in an Fp8Linear, "
                             f"got {scaling!r}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        check_quantizer(quantizer)
        reason = ineligible(in_features, out_features, dtype, backend)
        if reason:
            raise ValueError(f"Fp8Linear({in_features}, {out_features}): {reason}")
        self.in_features, self.out_features, self.version = in_features, out_features, version
        self.scaling, self.backend, self.quantizer, self.gated, self.dtype = scaling, backend, quantizer, gated, dtype
        n_scales = (out_features, 1) if scaling == "row" else (-(-out_features // scaled.BLOCK),
                                                               -(-in_features // scaled.BLOCK))
        self.register_buffer("weight", torch.empty(out_features, in_features, device=device, dtype=scaled.FP8))
        self.register_buffer("weight_scale", torch.ones(n_scales, device=device, dtype=torch.float32))
        self.register_buffer("bias", torch.zeros(out_features, device=device, dtype=dtype) if bias else None)
        self.gemm = op(version) if backend == "tilus" else scaled_mm_op()
        self.peer = None  # scaled_mm, block-wise: the activation scales' layout torch takes ('m' or 'k'), once known

    @classmethod
    def from_linear(cls, linear: nn.Linear, version: str = "v11", scaling: str | None = None,
                    backend: str = "tilus", quantizer: str = "kernel", gated: bool = False) -> "Fp8Linear":
        """An Fp8Linear holding ``linear``'s weight quantized (once, here) and a copy of its bias."""
        weight = linear.weight.detach()
        module = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, version=version,
                     scaling=scaling, backend=backend, quantizer=quantizer, gated=gated, device="meta",
                     dtype=weight.dtype)
        module.weight, module.weight_scale = scaled.quantize(weight, WEIGHT[module.scaling])
        if linear.bias is not None:
            module.bias = linear.bias.detach().clone()
        if backend == "scaled_mm" and module.scaling == "block" and weight.is_cuda:
            module.choose_peer_layout()  # now, eagerly: never inside a trace or a capture
        return module

    def choose_peer_layout(self) -> None:
        """For torch._scaled_mm with block-wise scales: the first of ``scaled.BLOCK_FORMS`` that the installed torch
        takes and computes right (``scaled.cublas_fp8``, on random activations), kept for every call."""
        if torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing():
            raise RuntimeError("Fp8Linear(backend='scaled_mm') picks the scales' layout torch._scaled_mm takes on its "
                               "first call, eagerly: run it once before torch.compile traces it or a graph captures it")
        x = torch.randn(128, self.in_features, device=self.weight.device)
        a8, sa = scaled.quantize(x, "1x128")
        form, refused = scaled.cublas_fp8("block", a8, self.weight, sa, self.weight_scale)
        if form is None:
            raise RuntimeError(f"torch._scaled_mm {torch.__version__} takes no block-wise scales for "
                               f"{self.out_features}x{self.in_features}: {refused}")
        sa_form, sb_form = scaled.cublas_scales("block", sa, self.weight_scale, form)
        self.register_buffer("peer_scale_b", sb_form, persistent=False)
        self.peer = "m" if sa_form.stride(0) == 1 else "k"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            raise RuntimeError("Fp8Linear is inference-only (no backward through fp8): its input requires grad; call "
                               "the model under torch.no_grad() or torch.inference_mode()")
        width = 2 * self.in_features if self.gated else self.in_features
        if x.shape[-1] != width:
            raise ValueError(f"Fp8Linear({self.in_features}, {self.out_features}" + (", gated" if self.gated else "")
                             + f") takes rows of {width}" + (" (gate, then up)" if self.gated else "")
                             + f", got {x.shape[-1]}")
        rows = x.reshape(-1, width)
        if not rows.shape[0]:
            return x.new_empty(*x.shape[:-1], self.out_features, dtype=self.dtype)
        if self.backend == "tilus":
            a8, scale_a = quantize_activations(rows, ACTIVATION[self.scaling], quantizer=self.quantizer,
                                               gated=self.gated)
            y = self.gemm(a8, self.weight, scale_a, self.weight_scale, self.dtype)
        elif self.scaling == "row":  # like for like: v10's kernel sums all of K in the wgmma's own accumulator
            a8, scale_a = quantize_activations(rows, "row", quantizer=self.quantizer, gated=self.gated)
            y = self.gemm(a8, self.weight.T, scale_a, self.weight_scale.view(1, -1), self.dtype, True)
        else:  # block-wise: cuBLASLt promotes, as v11 does (the default)
            if self.peer is None:
                self.choose_peer_layout()
            pad = -rows.shape[0] % 16  # cuBLASLt has no block-wise kernel for M = 1 (NOT_SUPPORTED); zero rows add nothing
            a8, scale_a = quantize_activations(nn.functional.pad(rows, (0, 0, 0, pad)) if pad else rows, "1x128",
                                               layout=self.peer, quantizer=self.quantizer, gated=self.gated)
            y = self.gemm(a8, self.weight.T, scale_a, self.peer_scale_b, self.dtype, False)[:rows.shape[0]]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"version={self.version}, scaling={self.scaling}, backend={self.backend}, quantizer={self.quantizer}"
                + (", gated=True" if self.gated else ""))


class Fp8GatedMLP(nn.Module):
    """A Llama MLP, ``down(SiLU(gate(x)) x up(x))``, in fp8 with SiLU x up never written in 16-bit: gate and up are
    one Fp8Linear (their weights stacked, one GEMM twice as wide), and down a gated Fp8Linear, whose quantizer
    computes SiLU(gate) x up from that GEMM's output as it quantizes it (one pass instead of two)."""

    def __init__(self, gate_up: Fp8Linear, down: Fp8Linear):
        super().__init__()
        if gate_up.gated or not down.gated or gate_up.out_features != 2 * down.in_features:
            raise ValueError(f"Fp8GatedMLP takes gate and up stacked ({gate_up.out_features} outputs) and a gated down "
                             f"projection of half as many inputs (gated={down.gated}, {down.in_features} inputs)")
        alike = ("version", "scaling", "backend", "dtype")
        if any(getattr(gate_up, name) != getattr(down, name) for name in alike):
            raise ValueError(f"Fp8GatedMLP's two Linears differ in their {', '.join(alike)}: {gate_up} and {down}")
        self.gate_up_proj, self.down_proj = gate_up, down

    @classmethod
    def from_mlp(cls, mlp: nn.Module, version: str = "v11", scaling: str | None = None, backend: str = "tilus",
                 quantizer: str | dict[str, str] = "kernel") -> "Fp8GatedMLP":
        """From a module with ``gate_proj``, ``up_proj`` and ``down_proj`` Linears and a SiLU ``act_fn`` (a Llama's);
        a mapping ``quantizer`` names the two Linears 'gate_up_proj' and 'down_proj' (``quantizer_of``)."""
        if not gated_mlp(mlp):
            raise ValueError(f"Fp8GatedMLP takes an MLP of plain gate, up and down Linears of matching shapes and a "
                             f"SiLU act_fn: {type(mlp).__name__} is not one")
        gate, up = mlp.gate_proj, mlp.up_proj
        stacked = nn.Linear(gate.in_features, 2 * gate.out_features, bias=gate.bias is not None, device="meta")
        stacked.weight = nn.Parameter(torch.cat([gate.weight, up.weight]).detach(), requires_grad=False)
        if gate.bias is not None:
            stacked.bias = nn.Parameter(torch.cat([gate.bias, up.bias]).detach(), requires_grad=False)
        options = {"version": version, "scaling": scaling, "backend": backend}
        return cls(Fp8Linear.from_linear(stacked, quantizer=quantizer_of(quantizer, "gate_up_proj"), **options),
                   Fp8Linear.from_linear(mlp.down_proj, quantizer=quantizer_of(quantizer, "down_proj"), gated=True,
                                         **options))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj(x))


def gated_mlp(module: nn.Module) -> bool:
    """A Llama-style MLP that ``Fp8GatedMLP`` can take: plain gate, up and down Linears of matching shapes, SiLU."""
    parts = [getattr(module, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    if not all(type(part) is nn.Linear for part in parts):
        return False
    gate, up, down = parts
    return (type(getattr(module, "act_fn", None)).__name__ in ("SiLU", "SiLUActivation")
            and gate.weight.shape == up.weight.shape and down.in_features == gate.out_features
            and (gate.bias is None) == (up.bias is None))


def swap_linears(model: nn.Module, version: str = "v11", scaling: str | None = None, backend: str = "tilus",
                 quantizer: str | dict[str, str] = "kernel", keep: dict[str, str] = KEEP,
                 gated: bool = False) -> tuple[list[str], dict[str, str]]:
    """Replace each eligible ``nn.Linear`` of ``model`` by an ``Fp8Linear`` on its weight, in place; with ``gated``,
    each Llama-style MLP (``gated_mlp``) by an ``Fp8GatedMLP`` first.

    A Linear whose attribute name is in ``keep`` (by default the LM head) stays as it is, as
    does one the fp8 path cannot take. ``quantizer``: every Linear's, or a mapping from attribute
    names to quantizers, 'kernel' for the rest (``{"o_proj": "fused"}``; a gated MLP's Linears
    are 'gate_up_proj' and 'down_proj'). Returns the names swapped and, for each ``nn.Linear``
    left as it was, why.
    """
    from support.torch_op import children, linears

    # an MLP whose gate, up or down projection ``keep`` names stays apart: its Linears are swapped (or kept) below
    mlps = children(model, gated_mlp) if gated and not keep.keys() & {"gate_proj", "up_proj", "down_proj"} else []
    if not isinstance(quantizer, str):
        names = {child_name for _, child_name, _, _ in linears(model)} | ({"gate_up_proj"} if mlps else set())
        for name, choice in quantizer.items():
            check_quantizer(choice)
            if name not in names:
                raise ValueError(f"quantizer names {name!r}, which is no Linear of the model: it has "
                                 f"{', '.join(sorted(names))}")
    swapped, kept = [], {}
    options = {"version": version, "scaling": scaling, "backend": backend}
    for module, child_name, full, mlp in mlps:
        shapes = [(mlp.gate_proj.in_features, 2 * mlp.gate_proj.out_features),
                  (mlp.down_proj.in_features, mlp.down_proj.out_features)]
        if not any(ineligible(*shape, mlp.down_proj.weight.dtype, backend) for shape in shapes):
            setattr(module, child_name, Fp8GatedMLP.from_mlp(mlp, quantizer=quantizer, **options))
            swapped += [f"{full}.gate_up_proj", f"{full}.down_proj"]
            dispatch.reserve_workspace(mlp.down_proj.weight.device)
    for module, child_name, full, child in linears(model):
        if child_name in keep:
            kept[full] = f"stays {child.weight.dtype} {keep[child_name]}"
        elif reason := ineligible(child.in_features, child.out_features, child.weight.dtype, backend):
            kept[full] = reason
        else:
            setattr(module, child_name, Fp8Linear.from_linear(child, quantizer=quantizer_of(quantizer, child_name),
                                                              **options))
            swapped.append(full)
            dispatch.reserve_workspace(child.weight.device)
    return swapped, kept


def prepare(version: str, sizes, scaling: str | None = None, out_dtype: torch.dtype = torch.bfloat16,
            device: str = "cuda") -> None:
    """Build and tune each (M, N, K) now, with the scaling's scales, so that no later call tunes (e.g. inside a graph
    capture); the activation quantizer is built and tuned for each (M, K) too (a gated one, Fp8GatedMLP's down, at
    its first eager call)."""
    scaling = scaling or scalings(version)[0]
    gemm = op(version)
    for m, n, k in sizes:
        a8, scale_a = quantize_activations(torch.randn(m, k, device=device, dtype=out_dtype), ACTIVATION[scaling])
        b8, scale_b = scaled.quantize(torch.randn(n, k, device=device), WEIGHT[scaling])
        gemm(a8, b8, scale_a, scale_b, out_dtype)
    torch.cuda.synchronize()
