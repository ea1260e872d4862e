"""fp8 with scales (v10, v11): the three scalings, their input rules, ``quantize``, the launch path and the benchmark.

A scaled fp8 GEMM computes C = (A8 * scale_a) @ (B8 * scale_b)^T from e4m3 A8 (M x K) and
B8 (N x K) and float32 scales; which scaling it is follows from the scales' shapes:

- per-tensor: one value each;
- row-wise: scale_a M x 1 and scale_b N x 1 (a scale per row of A and per row of B);
- block-wise (DeepSeek-V3's): scale_a M x ceil(K / 128) (1 x 128 blocks of activations)
  and scale_b ceil(N / 128) x ceil(K / 128) (128 x 128 blocks of weights).

``quantize`` makes each from a bf16 or fp32 tensor. The launch path is v1-v9's (build and
tune once per size bucket, then one dict lookup a call), with the kernel table, the scaling
and the output dtype in the key; the kernel gets the scales as addresses and element
strides, so any strides are taken (a per-tensor scale is a row-wise one with stride 0), but
for block-wise A's, which the Hopper kernel loads by TMA: ``m_major`` copies them where they
are not M-major. Per-tensor and row-wise scales are added fast or promoted (``ACCUMULATIONS``);
the benchmark times each kernel against the cuBLAS kernel that adds alike (``versus_of``).
"""

import argparse
import dataclasses
import datetime
import functools
import importlib
import math

import tilus
import torch

from support import bench, dispatch, measure, versions
from support.checks import check_sizes
from support.cli import REPO, RESULTS_DIR, text_table, parse_size, save_rows
from support.gpu import ARCHS, UnsupportedGPUError, gpu_arch, gpu_label

FP8 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # the largest finite e4m3 value
BLOCK = 128  # a block-wise scale's K block (and its weight block's rows)
OUT_DTYPES = {torch.bfloat16: tilus.bfloat16, torch.float16: tilus.float16}
GRANULARITIES = ("tensor", "row", "1x128", "128x128")
SCALINGS = ("tensor", "row", "block")


def quantize(x: torch.Tensor, granularity: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(x8, scale): x (rows x K) in e4m3 and the float32 scale with x ~= x8 * scale, blockwise broadcast.

    ``granularity``: 'tensor' (one scale), 'row' (rows x 1), '1x128' (rows x ceil(K / 128): an
    activation's) or '128x128' (ceil(rows / 128) x ceil(K / 128): a weight's). Each scale
    maps its block's largest magnitude to 448, e4m3's largest value.
    """
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point():
        raise TypeError("quantize takes a 2-D floating-point torch.Tensor")
    rows, k = x.shape
    x32 = x.float()
    if granularity == "tensor":
        amax = x32.abs().amax()
    elif granularity == "row":
        amax = x32.abs().amax(dim=1, keepdim=True)
    else:
        block_rows = 1 if granularity == "1x128" else BLOCK
        padded = torch.nn.functional.pad(x32, (0, -k % BLOCK, 0, -rows % block_rows))
        blocks = padded.view(padded.shape[0] // block_rows, block_rows, padded.shape[1] // BLOCK, BLOCK)
        amax = blocks.abs().amax(dim=(1, 3))
    scale = amax.clamp(min=1e-12) / E4M3_MAX
    x8 = (x32 / expand(scale, rows, k)).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)
    return x8, m_major(scale) if granularity == "1x128" else scale


def m_major(scale: torch.Tensor) -> torch.Tensor:
    """Activations' block-wise scales (rows x K blocks) as v11's Hopper kernel loads them by TMA: M-major, each
    K block's rows 16-byte aligned (rows padded to a multiple of 4), as DeepGEMM takes them; ``scale`` itself
    where it is so already, else a copy."""
    rows, kb = scale.shape
    if scale.stride(0) == 1 and scale.stride(1) % 4 == 0 and scale.stride(1) >= rows and not scale.data_ptr() % 16:
        return scale
    t = torch.empty(kb, -(-rows // 4) * 4, dtype=scale.dtype, device=scale.device)
    t[:, :rows] = scale.T
    return t[:, :rows].T


def expand(scale: torch.Tensor, rows: int, k: int) -> torch.Tensor:
    """A scale of any granularity as a rows x K (or broadcastable) float32 tensor."""
    if scale.numel() == 1 or scale.shape == (rows, 1):
        return scale.reshape(-1, 1) if scale.numel() > 1 else scale.reshape(())
    block_rows = 1 if scale.shape[0] == rows else BLOCK  # an activation's 1 x 128 blocks, or a weight's 128 x 128
    return scale.repeat_interleave(block_rows, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :k]


def reference(a8: torch.Tensor, b8: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor) -> torch.Tensor:
    """The fp32 product of the dequantized inputs: what a scaled GEMM should give before C is rounded."""
    (m, k), n = a8.shape, b8.shape[0]
    a = a8.float() * expand(scale_a, m, k)
    b = b8.float() * expand(scale_b, n, k)
    tf32, torch.backends.cuda.matmul.allow_tf32 = torch.backends.cuda.matmul.allow_tf32, False
    try:
        return a @ b.T
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def scaling_of(m: int, n: int, k: int, scale_a: torch.Tensor, scale_b: torch.Tensor) -> str | None:
    """'tensor', 'row' or 'block' from the scales' shapes, or None if they fit none."""
    kb = -(-k // BLOCK)
    if scale_a.numel() == 1 and scale_b.numel() == 1:
        return "tensor"
    if tuple(scale_a.shape) == (m, 1) and tuple(scale_b.shape) == (n, 1):
        return "row"
    if tuple(scale_a.shape) == (m, kb) and tuple(scale_b.shape) == (-(-n // BLOCK), kb):
        return "block"
    return None


def strides(scaling: str, scale_a: torch.Tensor, scale_b: torch.Tensor) -> tuple[int, int, int, int]:
    """The scales' element strides as the kernel reads them: (a's rows, a's K blocks, b's rows, b's K blocks)."""
    if scaling == "tensor":
        return 0, 0, 0, 0
    if scaling == "row":
        return scale_a.stride(0), 0, scale_b.stride(0), 0
    return scale_a.stride(0), scale_a.stride(1), scale_b.stride(0), scale_b.stride(1)


def check_inputs(a, b, scale_a, scale_b, out, out_dtype) -> tuple[int, int, int, int, str]:
    """Validate a scaled call; return (M, N, K, GPU index, scaling). Raises TypeError/ValueError naming the rule.

    As ``checks.check_inputs``: one conjunction of cheap questions passes valid input, and only
    input that fails it goes through the rules one by one (``check_each_rule``).
    """
    if type(a) is torch.Tensor and type(b) is torch.Tensor and type(scale_a) is torch.Tensor \
            and type(scale_b) is torch.Tensor and a.dim() == 2 and b.dim() == 2:
        (m, k), (n, kb) = a.shape, b.shape
        index = a.get_device()
        if (k == kb and m and n and k and not (k % 16 or n % 8) and max(m * k, n * k, m * n) < 2**31 and index >= 0
                and a.dtype is FP8 and b.dtype is FP8 and scale_a.dtype is torch.float32
                and scale_b.dtype is torch.float32 and out_dtype in OUT_DTYPES
                and b.get_device() == index and scale_a.get_device() == index and scale_b.get_device() == index
                and a.is_contiguous() and b.is_contiguous() and not (a.data_ptr() % 16 or b.data_ptr() % 16)
                and (out is None or _fits_out(out, out_dtype, m, n, index, (a, b, scale_a, scale_b)))):
            scaling = scaling_of(m, n, k, scale_a, scale_b)
            if scaling:
                return m, n, k, index, scaling
    return check_each_rule(a, b, scale_a, scale_b, out, out_dtype)


def _fits_out(out, out_dtype, m: int, n: int, index: int, inputs) -> bool:
    return (type(out) is torch.Tensor and out.dtype is out_dtype and out.shape == (m, n) and out.get_device() == index
            and out.is_contiguous() and not out.data_ptr() % 16 and not any(_overlaps(out, t) for t in inputs))


def check_shapes(a, b, scale_a, scale_b, out_dtype) -> tuple[int, int, int, str]:
    """The rules that need no memory (types, dtypes, shapes), one by one: (M, N, K, scaling), or a
    TypeError/ValueError that names the rule. The fp8 op's fake implementation checks these alone."""
    for name, t in (("a", a), ("b", b), ("scale_a", scale_a), ("scale_b", scale_b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("a", a), ("b", b)):
        if t.dtype != FP8:
            raise TypeError(f"{name} must be torch.float8_e4m3fn, got {t.dtype} (quantize makes it)")
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
    m, n, k = check_sizes(a, b)
    if k % 16:
        raise ValueError(f"K={k}: TMA needs 16-byte rows, so K must be a multiple of 16 for fp8; pad it")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be torch.bfloat16 or torch.float16, got {out_dtype}")
    if n % 8:
        raise ValueError(f"N={n}: the output's rows are stored by TMA, so N must be a multiple of 8; pad b")
    for name, t in (("scale_a", scale_a), ("scale_b", scale_b)):
        if t.dtype != torch.float32:
            raise TypeError(f"{name} must be torch.float32, got {t.dtype}")
    scaling = scaling_of(m, n, k, scale_a, scale_b)
    if scaling is None:
        kbs, nbs = -(-k // BLOCK), -(-n // BLOCK)
        raise ValueError(
            f"scales of shapes {tuple(scale_a.shape)} and {tuple(scale_b.shape)} fit no scaling for {m}x{n}x{k}: "
            f"per-tensor takes one value each, row-wise ({m}, 1) and ({n}, 1), block-wise ({m}, {kbs}) and "
            f"({nbs}, {kbs})")
    return m, n, k, scaling


def check_each_rule(a, b, scale_a, scale_b, out, out_dtype) -> tuple[int, int, int, int, str]:
    """The rules one by one, each raising a TypeError/ValueError that names it."""
    m, n, k, scaling = check_shapes(a, b, scale_a, scale_b, out_dtype)
    for name, t in (("a", a), ("b", b)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (row-major); call .contiguous() first")
        if t.data_ptr() % 16:
            raise ValueError(f"{name} must start at a 16-byte aligned address for TMA (a sliced view may not)")
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
        if out.dtype not in OUT_DTYPES or tuple(out.shape) != (m, n):
            raise ValueError(f"out must be torch.bfloat16 or torch.float16 of shape ({m}, {n}), got {out.dtype} "
                             f"{tuple(out.shape)}")
        if not out.is_contiguous() or out.data_ptr() % 16:
            raise ValueError("out must be contiguous and start at a 16-byte aligned address")
    tensors = [("a", a), ("b", b), ("scale_a", scale_a), ("scale_b", scale_b)] + ([("out", out)] if out is not None else [])
    for name, t in tensors:
        if t.device.type != "cuda":
            raise ValueError(f"{name} is on the {t.device.type.upper()}; move it to the GPU (.cuda())")
    if len({t.device for _, t in tensors}) > 1:
        raise ValueError(f"a, b, the scales and out must be on one GPU, got {[str(t.device) for _, t in tensors]}")
    if out is not None and any(_overlaps(out, t) for _, t in tensors[:4]):
        raise ValueError("out must not share memory with a, b or the scales")
    return m, n, k, a.get_device(), scaling


def _overlaps(x: torch.Tensor, y: torch.Tensor) -> bool:
    x0, y0 = x.data_ptr(), y.data_ptr()
    return x0 < y0 + y.numel() * y.element_size() and y0 < x0 + x.numel() * x.element_size()


def kernel_args(m: int, n: int, k: int, a, b, out, scale_a, scale_b, scale_strides: tuple,
                num_sms: int | None = None) -> tuple:
    """An fp8 version's kernel arguments: v9's, then the two scales' addresses and their element strides."""
    num_sms = dispatch.sm_count(num_sms)
    workspace = dispatch.workspace(a.device, num_sms) if isinstance(a, torch.Tensor) else (0, 0)
    return (m, n, k, a, b, out, num_sms, *workspace, scale_a, scale_b, *scale_strides)


# a 4096-cube call's arguments, pointers as 0 and unit scale strides (strides are arguments, not
# compiled in): what building an fp8 kernel without a GPU passes
BUILD_ARGS = kernel_args(4096, 4096, 4096, 0, 0, 0, 0, 0, (1, 1, 1, 1), 132)


# how a kernel adds its fp8 products. "fast": the whole sum over K stays in the fp8 wgmma's own accumulator,
# as torch._scaled_mm(..., use_fast_accum=True) does. "promoted": each K block's sum is added into an fp32 sum
# in registers, as _scaled_mm's default does; block-wise scales are always promoted
ACCUMULATIONS = ("fast", "promoted")

# (id of the kernel table run, scaling, strides, out dtype, device index, M, N, K) ->
# (compiled launch function, SM count, the stream-K workspace's two addresses)
_launchers: dict[tuple, object] = {}


def launch(kernels: dict, blockwise_kernels: dict | None, a, b, scale_a, scale_b, out=None,
           out_dtype: torch.dtype = torch.bfloat16, accumulate: str | None = None,
           promoted_kernels: dict | None = None) -> torch.Tensor:
    """Validate, pick the kernel for this GPU, scaling and accumulation, run it (building and tuning on the first
    call per bucket).

    ``blockwise_kernels`` is None for a version without block-wise kernels (v10): block-wise
    scales are then a ValueError naming the version that takes them. ``accumulate`` (None:
    each scaling's own, ``ACCUMULATIONS``) picks ``promoted_kernels`` for per-tensor and
    row-wise scales where it is "promoted".
    """
    if accumulate is not None:
        check_accumulate(accumulate)
    if isinstance(out, torch.Tensor) and out.dtype in OUT_DTYPES:
        out_dtype = out.dtype  # a given out decides C's dtype
    m, n, k, index, scaling = check_inputs(a, b, scale_a, scale_b, out, out_dtype)
    if scaling == "block":
        if blockwise_kernels is None:
            raise ValueError(f"{kernels.version} takes per-tensor and row-wise scales; block-wise scales (scale_a "
                             f"{tuple(scale_a.shape)}, scale_b {tuple(scale_b.shape)}) are "
                             f"{next_fp8(kernels.version)}'s: matmul_{next_fp8(kernels.version)}.matmul")
        if accumulate == "fast":
            raise ValueError("accumulate='fast' takes per-tensor and row-wise scales: a block-wise scale changes every "
                             f"{BLOCK} of K, so each K block's sum is promoted (accumulate='promoted' or None)")
        table = blockwise_kernels
        scale_a = m_major(scale_a)  # a copy only where the caller's scales are not (quantize's are)
    elif accumulate == "promoted":
        if promoted_kernels is None:
            raise ValueError(f"{kernels.version} adds per-tensor and row-wise scales' products in the fp8 wgmma's "
                             "accumulator only (accumulate='fast')")
        table = promoted_kernels
    else:
        table = kernels
    scale_strides = strides(scaling, scale_a, scale_b)
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    key = (id(table), scaling, scale_strides, out_dtype, index, m, n, k)
    launcher = _launchers.get(key)
    if launcher is None:
        func = first_launch(table, scaling, index, m, n, k, a, b, out, scale_a, scale_b, scale_strides)
        num_sms = dispatch.device(index).num_sms
        _launchers[key] = func, num_sms, *(t.data_ptr() for t in dispatch.workspace(a.device, num_sms))
        return out
    func, num_sms, flags, partials = launcher
    if index == torch.cuda.current_device() and not dispatch.current_raw_stream(index):
        func(m, n, k, a.data_ptr(), b.data_ptr(), out.data_ptr(), num_sms, flags, partials, scale_a.data_ptr(),
             scale_b.data_ptr(), *scale_strides)
    else:  # tensors: tvm-ffi launches on torch's current stream
        with torch.cuda.device(index):
            func(*kernel_args(m, n, k, a, b, out, scale_a, scale_b, scale_strides, num_sms))
    return out


def check_accumulate(accumulate) -> None:
    """``accumulate`` is None or one of ACCUMULATIONS; else a TypeError/ValueError naming the rule."""
    if accumulate is not None and not isinstance(accumulate, str):
        raise TypeError(f"accumulate must be None or one of {ACCUMULATIONS}, got {type(accumulate).__name__}")
    if accumulate is not None and accumulate not in ACCUMULATIONS:
        raise ValueError(f"accumulate must be None or one of {ACCUMULATIONS}, got {accumulate!r}: 'fast' adds all of "
                         "K in the fp8 wgmma's accumulator, 'promoted' adds each K block's sum into fp32")


def next_fp8(version: str) -> str:
    """The first fp8 version after ``version`` ('v11' after 'v10'), from the versions on disk."""
    later = [name for name in versions.fp8() if versions.number(name) > versions.number(version)]
    return later[0].removeprefix("matmul_") if later else "a later version"


def first_launch(table, scaling, index, m, n, k, a, b, out, scale_a, scale_b, scale_strides):
    """Build and tune this size's bucket for the scaling (cached on disk), run it, return its launch function."""
    gpu = dispatch.device(index)
    script_cls = table[gpu.arch]  # UnsupportedGPUError naming the script to run where the table has none
    dispatch.refuse_capture(f"{script_cls.__name__}: the first call at {m}x{n}x{k} with {scaling} scales")
    args = kernel_args(m, n, k, a, b, out, scale_a, scale_b, scale_strides, gpu.num_sms)
    return dispatch.build_tune_run(script_cls, gpu, args, out_dtype=OUT_DTYPES[out.dtype])


def chosen_schedule(script_cls, m, n, k, scale_strides, out_dtype=torch.bfloat16) -> dict:
    """The schedule picked for this size bucket, scaling and output dtype (after a call at that size)."""
    script = script_cls(out_dtype=OUT_DTYPES[out_dtype])
    jit_key, tuning_key = dispatch.keys(script, kernel_args(m, n, k, None, None, None, None, None, scale_strides, 132))
    jit = script.jit_instances[jit_key]
    return jit.schedules[jit.valid_schedules[jit.dispatch_table[tuning_key]]]


# the sizes of the benchmark: square, LLM-like, and decode (judged in bytes per second)
SIZES = [(4096, 4096, 4096), (8192, 8192, 8192), (4096, 14336, 4096), (4096, 4096, 14336),
         (1, 4096, 14336), (16, 4096, 14336), (64, 4096, 14336), (1, 14336, 4096)]
CHECK_SIZES = [(1, 4096, 4096), (37, 1000, 2064), (256, 1024, 4112), (1000, 3000, 2000), (4096, 4096, 4096),
               (128, 8192, 8192)]
GRANULARITY = {"tensor": ("tensor", "tensor"), "row": ("row", "row"), "block": ("1x128", "128x128")}


def cublas_scales(scaling: str, scale_a: torch.Tensor, scale_b: torch.Tensor, form: int = 0):
    """The scales as torch._scaled_mm takes them: per-tensor as they are, row-wise with B's as 1 x N, block-wise
    in one of the layouts tried (``BLOCK_FORMS``)."""
    if scaling == "tensor":
        return scale_a.reshape(()), scale_b.reshape(())
    if scaling == "row":
        return scale_a, scale_b.reshape(1, -1).contiguous()
    return BLOCK_FORMS[form](scale_a, scale_b)


# block-wise scale layouts to offer torch._scaled_mm, in order: A's M x K/128 scales K/128-major or
# M-major, B's as given or transposed (its B operand is K x N, column-major)
BLOCK_FORMS = [
    lambda sa, sb: (sa.T.contiguous().T, sb.T.contiguous().T),
    lambda sa, sb: (sa.T.contiguous().T, sb.contiguous()),
    lambda sa, sb: (sa.T.contiguous().T, sb.T.contiguous()),
    lambda sa, sb: (sa.contiguous(), sb.contiguous()),
    lambda sa, sb: (sa.contiguous(), sb.T.contiguous()),
    lambda sa, sb: (sa.T.contiguous().T, sb.T),
    lambda sa, sb: (sa.contiguous(), sb.T),
]


def cublas_fp8(scaling: str, a8, b8, scale_a, scale_b, fast: bool = False):
    """(form, None) where torch._scaled_mm (cuBLASLt) takes the scaling (``form``: the block-wise scale layout that
    worked, 0 otherwise), or (None, the reason) where the installed torch refuses it. ``fast``: use_fast_accum=True."""
    last = None
    for form in range(len(BLOCK_FORMS) if scaling == "block" else 1):
        sa, sb = cublas_scales(scaling, scale_a, scale_b, form)
        try:
            c = torch._scaled_mm(a8, b8.T, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=fast)
        except (RuntimeError, ValueError) as error:
            last = str(error).splitlines()[0]
            continue
        if measure.relative_error(c, reference(a8, b8, scale_a, scale_b)) < measure.REL_ERR_TOL[torch.bfloat16]:
            return form, None
        last = "a result off the dequantized reference"
    return None, last


# the scalings Inductor's Triton templates are timed with (peer=True): its block-wise template gave C with a
# relative error of 1.25e4 at 4096^3 on the H100 (torch 2.11), so it is left out
PEER_SCALINGS = ("tensor", "row")


@dataclasses.dataclass(frozen=True)
class Fp8Kernel:
    """A version's fp8 contender: its name in the rows ('v10 tensor', 'v11 row promoted'), the scaling and the
    accumulation (``ACCUMULATIONS``) it runs, its ``matmul(a8, b8, scale_a, scale_b, out)`` and the kernel class that
    runs it here (for the schedule column)."""

    name: str
    scaling: str
    accumulate: str
    matmul: object
    script_cls: object


def cublas_name(scaling: str, accumulate: str) -> str:
    """The cuBLAS contender that adds as ``accumulate`` says: 'cublas fp8 row fast' (use_fast_accum=True), or
    'cublas fp8 row' (torch._scaled_mm's default, which promotes)."""
    return f"cublas fp8 {scaling}" + (" fast" if accumulate == "fast" else "")


def benchmark(fp8: list[Fp8Kernel], bf16, plan, repeat: int, timeout_s: float, on_size=None,
              peer: bool = False) -> list[dict]:
    """fp8 kernels, torch._scaled_mm with the same scalings (for per-tensor and row-wise both with and without
    use_fast_accum) and a 16-bit version and cuBLAS in bf16, in both regimes.

    ``plan`` is [((M, N, K), groups)]: at each size the scalings of ``groups`` that a kernel of
    ``fp8`` runs, and bf16 where "bf16" is among them and ``bf16`` is (its name, its matmul); cuBLAS alone in
    bf16 where "cublas bf16" is.
    Every row states its error; its % is of the contender that adds as it does
    (``versus_of``). With ``peer``, also the Triton kernel torch.compile makes of
    ``torch._scaled_mm(..., use_fast_accum=True)`` (``bench.compile_peer``), per-tensor and
    row-wise ("triton fp8 <scaling> fast").
    """
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    copy_bytes_per_s = bench.copy_bandwidth()
    handle = bench.nvml_handle()
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"device-to-device copy: {copy_bytes_per_s / 1e12:.2f} TB/s (bytes read + written)", flush=True)
    rows = []
    for seed, ((m, n, k), groups) in enumerate(plan):
        scalings = [s for s in SCALINGS if s in groups and any(x.scaling == s for x in fp8)]
        sets = bench.operand_sets(m, n, k, seed, torch.bfloat16)
        quantized = {id(a): {s: (*quantize(a, GRANULARITY[s][0]), *quantize(b, GRANULARITY[s][1])) for s in scalings}
                     for a, b in sets}
        a, b = sets[0]
        contenders, refs = [], {}
        for scaling in scalings:
            a8, sa, b8, sb = quantized[id(a)][scaling]
            ref = reference(a8, b8, sa, sb)
            for kernel in (x for x in fp8 if x.scaling == scaling):
                refs[kernel.name] = ref
                contenders.append(bench.Contender(kernel.name, lambda a, b, out, s=scaling, f=kernel.matmul: f(
                    quantized[id(a)][s][0], quantized[id(a)][s][2], quantized[id(a)][s][1], quantized[id(a)][s][3],
                    out)))
            for accumulate in ACCUMULATIONS if scaling != "block" else ("promoted",):
                name = cublas_name(scaling, accumulate)
                form, refused = cublas_fp8(scaling, a8, b8, sa, sb, fast=accumulate == "fast")
                if refused:
                    print(f"{m}x{n}x{k}: torch._scaled_mm takes no {scaling}-wise scales here: {refused}", flush=True)
                    continue
                cached = {key: (q[0], q[2].T, *cublas_scales(scaling, q[1], q[3], form))
                          for key, q in ((key, q[scaling]) for key, q in quantized.items())}
                refs[name] = ref
                contenders.append(bench.Contender(name, lambda a, b, out, c=cached, fast=accumulate == "fast":
                                                  torch._scaled_mm(*c[id(a)], out_dtype=torch.bfloat16,
                                                                   use_fast_accum=fast)))
                if peer and accumulate == "fast" and scaling in PEER_SCALINGS:
                    print(f"{m}x{n}x{k}: torch.compile autotunes its Triton templates for {scaling}-wise fp8 on the "
                          "first call...", flush=True)
                    compiled = bench.compile_peer(lambda x, y, sx, sy: torch._scaled_mm(
                        x, y, sx, sy, out_dtype=torch.bfloat16, use_fast_accum=True))
                    refs[f"triton fp8 {scaling} fast"] = ref
                    contenders.append(bench.Contender(f"triton fp8 {scaling} fast", lambda a, b, out, c=cached,
                                                      f=compiled: f(*c[id(a)])))
        with_version = bf16 and "bf16" in groups
        if with_version or "cublas bf16" in groups:
            refs["cublas"] = a.float() @ b.float().T
            if with_version:
                refs[bf16[0]] = refs["cublas"]
                contenders.append(bench.Contender(bf16[0], bf16[1]))
            contenders.append(bench.Contender("cublas", lambda a, b, out: torch.matmul(a, b.T)))
        print(f"{m}x{n}x{k}: the first call at a size bucket builds and tunes each kernel (cached afterwards)...",
              flush=True)
        errors = {}
        for c in contenders:
            out = torch.full((m, n), math.nan, dtype=torch.bfloat16, device="cuda")
            result = c.call(a, b, out)
            measure.sync_or_exit(f"{c.name} at {m}x{n}x{k}", timeout_s)
            errors[c.name] = measure.relative_error(result, refs[c.name])
        del refs
        schedules = {x.name: config_of(x.script_cls, x.scaling, m, n, k, quantized[id(a)][x.scaling][1],
                                       quantized[id(a)][x.scaling][3]) for x in fp8 if x.scaling in scalings}
        timed = [c for c in contenders if measure.passes(errors[c.name], torch.bfloat16)]
        outs = {c.name: torch.empty((m, n), dtype=torch.bfloat16, device="cuda") for c in timed}
        burst_telemetry = {c.name: bench.Telemetry(handle) for c in timed}
        burst = bench.time_burst(timed, a, b, outs, repeat, burst_telemetry, seed)
        hosts = bench.host_us(timed, sets, {name: bench.median_ms(r) for name, r in burst.items()})
        loop_telemetry = {c.name: bench.Telemetry(handle) for c in timed}
        loop = bench.time_back_to_back(timed, sets, loop_telemetry, seed)
        common = {"gpu": torch.cuda.get_device_name(), "m": m, "n": n, "k": k, "tilus": tilus.__version__,
                  "torch": torch.__version__, "date": datetime.date.today().isoformat()}
        size_rows = [common | {"version": c.name, "dtype": dtype_of(c.name), "rel_err": f"{errors[c.name]:.3g}"}
                     for c in contenders if c not in timed]
        for regime, rounds, telemetry in (("burst", burst, burst_telemetry), ("back-to-back", loop, loop_telemetry)):
            for c in timed:
                ms = bench.median_ms(rounds[c.name])
                versus = versus_of(c.name, rounds)
                pct, spread = ("", "") if versus is None else bench.ratio_and_spread(
                    {"cublas": rounds[versus], c.name: rounds[c.name]}, c.name if versus != c.name else "cublas")
                data_bytes = (m * k + n * k) * (1 if "fp8" in dtype_of(c.name) else 2) + m * n * 2
                mj = telemetry[c.name].mj_per_call
                size_rows.append(common | {key: f"{value:.5g}" if isinstance(value, float) else value for key, value in {
                    "version": c.name, "dtype": dtype_of(c.name), "regime": regime, "ms": ms,
                    "tflops": measure.tflops(m, n, k, ms), "pct_of_cublas": pct, "pct_spread": spread,
                    "versus": versus or "", "host_us": hosts[c.name], "sm_mhz": telemetry[c.name].sm_mhz,
                    "power_w": telemetry[c.name].power_w,
                    "pct_of_clock_peak": 100 * measure.tflops(m, n, k, ms) / (telemetry[c.name].sm_mhz / 1000)
                    / (num_sms * bench.FLOP_PER_CLOCK_PER_SM * (2 if "fp8" in dtype_of(c.name) else 1) / 1000),
                    "pct_of_bandwidth": 100 * data_bytes / (ms * 1e-3) / copy_bytes_per_s,
                    "mj_per_gemm": mj if regime == "back-to-back" else math.nan,
                    "rel_err": errors[c.name], "config": schedules.get(c.name, ""),
                }.items()})
        rows += size_rows
        if on_size:
            on_size(size_rows)
    return rows


def scaling_in(name: str) -> str | None:
    """The scaling a contender's name ends in or carries ('v11 row promoted': 'row'), or None (bf16)."""
    return next((word for word in name.split() if word in SCALINGS), None)


def dtype_of(name: str) -> str:
    """The dtype column: 'fp8 tensor', 'fp8 row', 'fp8 block' or 'bf16'."""
    scaling = scaling_in(name)
    return f"fp8 {scaling}" if scaling else "bf16"


def accumulation_of(name: str) -> str:
    """'fast' or 'promoted', from a contender's name: cuBLAS and Triton promote unless the name says 'fast'; a
    version's kernel is fast unless it is block-wise or the name says 'promoted'."""
    words = name.split()
    if "fast" in words:
        return "fast"
    if "promoted" in words or "block" in words or words[0] in ("cublas", "triton"):
        return "promoted"
    return "fast"


def versus_of(name: str, timed) -> str | None:
    """The contender a row's % is of: cuBLAS with the same scaling that adds as it does (``cublas_name``), or
    cuBLAS in bf16; a cuBLAS row is of itself (100%). None where that contender was not timed: no %."""
    scaling = scaling_in(name)
    if name.startswith("cublas"):
        return name
    versus = cublas_name(scaling, accumulation_of(name)) if scaling else "cublas"
    return versus if versus in timed else None


def config_of(script_cls, scaling: str, m: int, n: int, k: int, scale_a, scale_b) -> str:
    """The schedule the tuner picked for these scales (their scaling and strides) at this size."""
    return dispatch.format_schedule(chosen_schedule(script_cls, m, n, k, strides(scaling, scale_a, scale_b)))


def check(version: str, kernels: list[Fp8Kernel], sizes, timeout_s: float) -> int:
    """Every one of a version's kernels (each scaling and accumulation it takes) at every size against the fp32
    product of the dequantized inputs; 1 if any is wrong."""
    results = []
    for seed, (m, n, k) in enumerate(sizes):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        a = torch.randn((m, k), generator=gen, device="cuda")
        b = torch.randn((n, k), generator=gen, device="cuda")
        for kernel in kernels:
            ga, gb = GRANULARITY[kernel.scaling]
            (a8, sa), (b8, sb) = quantize(a, ga), quantize(b, gb)
            out = torch.full((m, n), math.nan, dtype=torch.bfloat16, device="cuda")
            kernel.matmul(a8, b8, sa, sb, out)
            measure.sync_or_exit(f"{kernel.name} at {m}x{n}x{k}", timeout_s)
            err = measure.relative_error(out, reference(a8, b8, sa, sb))
            results.append([f"{m}x{n}x{k}", kernel.scaling, kernel.accumulate, f"{err:.2e}",
                            "ok" if measure.passes(err, torch.bfloat16) else "WRONG",
                            config_of(kernel.script_cls, kernel.scaling, m, n, k, sa, sb)])
    print(text_table(["size", "scaling", "accumulation", "rel. error", "result", "schedule"], results))
    return 1 if any(row[4] != "ok" for row in results) else 0


# the groups --sizes and --full time at a size: each scaling, and bf16 (the 16-bit version and cuBLAS). A version's
# default may name "cublas bf16" instead: cuBLAS alone, with no 16-bit kernel to build and tune in a first run
GROUPS = (*SCALINGS, "bf16")


def plan_of(sizes, full: bool, default) -> list[tuple[tuple[int, int, int], tuple[str, ...]]]:
    """What a benchmark run times, [((M, N, K), groups)]: every group at the given ``sizes``, or at SIZES with
    ``full`` (or where the version gives no ``default``), else the version's ``default``."""
    if sizes or full or not default:
        return [(tuple(size), GROUPS) for size in sizes or SIZES]
    return [(tuple(size), tuple(groups)) for size, groups in default]


def main(version: str, kernels: dict, blockwise_kernels: dict | None, matmul, argv=None, *,
         promoted_kernels: dict | None = None, beside: str | None = None, bf16: str | None = None,
         default=None) -> int:
    """An fp8 version's command line: check each scaling and accumulation it takes, benchmark them against cuBLAS's
    fp8 kernels that add alike, or build only.

    v10 (no ``blockwise_kernels``) takes and times per-tensor and row-wise scales, fast. v11
    takes all three and times block-wise and, with ``promoted_kernels`` (its matmul's
    accumulate="promoted"), per-tensor and row-wise promoted. The caller names the modules
    timed beside: ``beside``, an fp8 version whose fast per-tensor and row-wise kernels are
    timed too; ``bf16``, the 16-bit version timed in bf16. ``default`` is what a run without
    --sizes or --full times: [((M, N, K), groups)], groups from ``GROUPS``.
    """
    from support import build

    parser = argparse.ArgumentParser(description=f"{version}: fp8 GEMMs with scales, checked and timed")
    parser.add_argument("--sizes", nargs="+", type=parse_size, default=None, help="sizes, N or MxNxK (every scaling)")
    parser.add_argument("--full", action="store_true", help="every scaling at every size of the full table")
    parser.add_argument("--check-only", action="store_true", help="check every scaling; no timing")
    parser.add_argument("--compile-only", action="store_true", help="build every schedule without a GPU")
    parser.add_argument("--repeat", type=int, default=100, help="burst runs per contender")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds before a kernel counts as hung")
    parser.add_argument("--peer", action="store_true", help="also time the Triton kernel torch.compile makes of "
                        "torch._scaled_mm(..., use_fast_accum=True) (per-tensor, row-wise)")
    args = parser.parse_args(argv)
    tables = [("per-tensor and row-wise", kernels), ("block-wise", blockwise_kernels),
              ("per-tensor and row-wise, promoted", promoted_kernels)]
    tables = [(name, table) for name, table in tables if table]
    arch = None
    try:
        arch = None if args.compile_only else gpu_arch()
        if arch is not None:
            for table in filter(None, (kernels, blockwise_kernels)):  # the promoted kernels are Hopper's only
                table[arch]  # noqa: B018  (UnsupportedGPUError: this GPU has no kernel of this version)
    except UnsupportedGPUError as reason:
        if arch is not None:
            print(f"{reason}", flush=True)
            return 1
        print(f"No Hopper or Blackwell GPU here ({reason}): building {version} instead (compile-only).", flush=True)
    if arch is None:
        failed = 0
        for name, table in tables:
            for arch_name, script_cls in table.items():
                print(f"{name}: {script_cls.__name__} for {ARCHS[arch_name].sm}", flush=True)
                results = build.build_schedules(script_cls, arch_name, call_args=BUILD_ARGS)
                failed += sum(not r.ok for r in results)
        return 1 if failed else 0
    # the version's own kernels: v10's fast ones; v11's block-wise and promoted ones (its fast ones are v10's)
    fast = [Fp8Kernel(f"{version} {s}", s, "fast", matmul, kernels[arch]) for s in ("tensor", "row")]
    own = [] if blockwise_kernels else list(fast)
    if blockwise_kernels:
        own.append(Fp8Kernel(f"{version} block", "block", "promoted", matmul, blockwise_kernels[arch]))
    if promoted_kernels and arch in promoted_kernels:
        promoted = functools.partial(matmul, accumulate="promoted")
        own += [Fp8Kernel(f"{version} {s} promoted", s, "promoted", promoted, promoted_kernels[arch])
                for s in ("tensor", "row")]
    if args.check_only:
        return check(version, (fast if blockwise_kernels else []) + own, args.sizes or CHECK_SIZES, args.timeout)
    timed = list(own)
    if beside:  # an earlier version's fast kernels, timed in the same run as this one's
        module, name = importlib.import_module(beside), beside.removeprefix("matmul_")
        timed += [Fp8Kernel(f"{name} {s}", s, "fast", module.matmul, module.KERNELS[arch]) for s in ("tensor", "row")]
    path = RESULTS_DIR / f"{gpu_label()}_fp8.csv"
    bf16_version = (bf16.removeprefix("matmul_"), importlib.import_module(bf16).matmul) if bf16 else None
    rows = benchmark(timed, bf16_version, plan_of(args.sizes, args.full, default), args.repeat, args.timeout,
                     on_size=lambda size_rows: save_rows(size_rows, path), peer=args.peer)
    from support import provenance

    # the programs these rows were measured with, the bf16 version's too: a version changed since its rows in
    # another file were measured leaves that file with the old programs' digest (support/provenance.py)
    timed_versions = {r["version"].split()[0] for r in rows}
    for name in [version, *(m.removeprefix("matmul_") for m in (beside, bf16) if m)]:
        if name in timed_versions:
            provenance.record_measured(name, path)
    print(text_table(["size", "regime", "contender", "ms", "TFLOPS", "versus", "% of versus (its ms / this ms)",
                      "spread (points)", "% of copy BW", "rel. error", "schedule"],
                     [["x".join(str(r[d]) for d in "mnk"), r.get("regime", "-"), r["version"], r.get("ms", "-"),
                       r.get("tflops", "-"), r.get("versus") or "-", r.get("pct_of_cublas") or "-",
                       r.get("pct_spread") or "-", r.get("pct_of_bandwidth", "-"), r["rel_err"], r.get("config", "")]
                      for r in rows]))
    print("fast: all of K in the fp8 wgmma's own accumulator (cuBLAS: use_fast_accum=True); promoted: each K block's "
          "sum added into fp32 (cuBLAS's default). Each % is of the contender that adds alike.")
    print(f"wrote {path.relative_to(REPO)}")
    return 0 if all(measure.passes(float(r["rel_err"]), torch.bfloat16) for r in rows) else 1
