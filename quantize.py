"""The activation quantizer: a 16-bit activation into e4m3 with float32 scales, in one pass.

A memory-bound kernel, unlike the GEMMs: each block loads its rows once, finds each group's
largest magnitude, stores the e4m3 values and one scale per group, and is done. No tensor
cores, no pipeline: its speed is the bytes it moves (for bf16, 2 read and 1 written an
element) against the copy bandwidth, and what hides memory latency is bytes in flight, so the
schedules differ in how many rows a block loads at once. A group is 128 columns (v11's 1 x 128
activation blocks) or a whole row (v10's per-token scales). The gated kernels first compute
x = SiLU(gate) x up from each row's two halves (a Llama MLP's), so that x is never stored in
16 bits. The arithmetic is ``scaled.quantize``'s; tilus' fast division may round a quotient
on an e4m3 boundary the other way (one e4m3 step, rarely).
"""

import tilus
import torch
from tilus import RegisterTensor, float8_e4m3, float32, int32, void_p
from tilus.ir.layout.ops.register_ops import local
from tilus.utils import cdiv

from support import dispatch

E4M3_MAX = 448.0  # e4m3's largest finite value: each group's largest magnitude maps to it
VECTOR = 8  # elements a thread loads at once: 16 bytes of bf16 or fp16
TINY = 1e-12  # the smallest amax a scale divides by: an all-zero group quantizes to zeros, not NaN
GROUPS = {"1x128": 128, "row": None}  # columns a scale covers: 128, or the whole row
LAYOUTS = ("m4", "m", "k")  # the scales': M-major with rows padded to 4 (v11's), M-major, K-major
DTYPES = {torch.bfloat16: tilus.bfloat16, torch.float16: tilus.float16, torch.float32: tilus.float32}


class QuantizeGroups(tilus.Script):
    """x (m x k) -> x8 (m x k, e4m3) and one float32 scale per row and group of ``group`` columns, at
    ``row_stride`` and ``group_stride`` (M-major for v11: a group's scales contiguous).

    Each thread loads 8 consecutive elements at a time (16 bytes of a 16-bit x), consecutive
    threads consecutive 8s, so a warp's loads coalesce. A block holds
    ``thread_rows`` rows a thread, and ``group`` columns rounded up to what its threads cover.
    """

    gated = False  # the Gated classes: x is SiLU(gate) x up, gate and up the two halves of each row of an m x 2k tensor

    def __init__(self, group: int, thread_rows: int, warps: int, dtype=tilus.bfloat16):
        super().__init__()
        self.group, self.warps, self.dtype = group, warps, dtype
        threads = warps * 32
        # threads side by side along a row: a power of two, so that the rows of threads fill the block
        self.across = min(threads, 1 << (cdiv(group, VECTOR) - 1).bit_length())
        self.block_k = cdiv(group, VECTOR * self.across) * VECTOR * self.across
        self.block_m = thread_rows * (threads // self.across)
        self.layout = local(thread_rows, self.block_k // (VECTOR * self.across)).spatial(
            threads // self.across, self.across).local(1, VECTOR)

    def __call__(self, m: int32, k_vectors: int32, group_stride: int32, x_ptr: void_p, x8_ptr: void_p,
                 scale_ptr: void_p, row_stride: int32):
        self.attrs.blocks = cdiv(m, self.block_m), cdiv(k_vectors * VECTOR, self.group)
        self.attrs.warps = self.warps
        # K in whole vectors: tilus 0.2.0 takes every size argument to divide only by 1 (its divisibility key has
        # no other entry, and assume() takes the gcd with it), so a vector's mask and alignment show only this way
        k = k_vectors * VECTOR
        m0 = self.blockIdx.x * self.block_m
        k0 = self.blockIdx.y * self.group
        g_x8 = self.global_view(x8_ptr, dtype=float8_e4m3, shape=[m, k])
        g_scale = self.global_view(scale_ptr, dtype=float32, shape=[m, cdiv(k, self.group)],
                                   strides=[row_stride, group_stride])

        # rows past m and columns past k load as zeros, which leave amax alone, and are not stored
        if self.gated:
            x = self.swiglu(x_ptr, m, k, m0, k0)
        else:
            loaded = self.load_global(self.global_view(x_ptr, dtype=self.dtype, shape=[m, k]), offsets=[m0, k0],
                                      shape=[self.block_m, self.block_k])
            self.annotate_layout(loaded, self.layout)
            x = self.cast(loaded, float32)
        amax = self.max(self.abs(x), dim=1, keepdim=True)
        tiny = self.register_tensor(dtype=float32, shape=[self.block_m, 1], init=TINY)
        scale = self.maximum(amax, tiny) / E4M3_MAX
        self.store_global(g_x8, self.cast(self.clip(x / scale, -E4M3_MAX, E4M3_MAX), float8_e4m3), offsets=[m0, k0])
        self.store_global(g_scale, scale, offsets=[m0, self.blockIdx.y])

    def swiglu(self, x_ptr: void_p, m: int32, k: int32, m0: int32, k0: int32) -> RegisterTensor:
        """SiLU(gate) x up in float32, gate and up the halves of each row of x (m x 2 x k, so each is masked at k),
        each product rounded to x's dtype as torch's SiLU and multiply round it in a 16-bit model."""
        g_halves = self.global_view(x_ptr, dtype=self.dtype, shape=[m, 2, k])
        gate = self.load_global(g_halves, offsets=[m0, 0, k0], shape=[self.block_m, self.block_k], dims=[0, 2])
        up = self.load_global(g_halves, offsets=[m0, 1, k0], shape=[self.block_m, self.block_k], dims=[0, 2])
        self.annotate_layout(gate, self.layout)
        self.annotate_layout(up, self.layout)
        g = self.cast(gate, float32)
        silu = self.cast(self.cast(g / (1.0 + self.exp(-g)), self.dtype), float32)
        return self.cast(self.cast(silu * self.cast(up, float32), self.dtype), float32)


# 1 x 128 groups: 16 threads a row, so block_m is 8 x thread_rows with 4 warps (16 x with 8); more rows a thread put
# more loads in flight (a memory-bound kernel hides latency with bytes in flight), fewer put more blocks on an SM
@tilus.autotune("thread_rows", [1, 2, 4])
@tilus.autotune("warps", [4, 8])
class QuantizeBlocks(QuantizeGroups):
    pass


# whole rows (K of 4096 to 14336 in a Llama): a block holds its row in registers, so the row's amax needs no second
# read (across warps it goes through shared memory); 4 to 32 warps hold a 14336-wide row at 112 to 16 elements a
# thread, some of them padding past K
@tilus.autotune("thread_rows", [1])
@tilus.autotune("warps", [4, 8, 16, 32])
class QuantizeRows(QuantizeGroups):
    pass


# SiLU(gate) x up and its quantization in one pass (a Llama's MLP, before the down projection): the same spaces
class QuantizeGatedBlocks(QuantizeBlocks):
    gated = True


class QuantizeGatedRows(QuantizeRows):
    gated = True


# schedules the tuner times back to back: a few microseconds a call and a space of 4 or 6 schedules, so two
# finalists (2.0 + 2 x 3 x 0.12 = 2.7 s of back-to-back windows a bucket, against 3.8 s for a GEMM's five)
FINALISTS = 2
_launchers: dict[tuple, object] = {}


def quantize(x: torch.Tensor, granularity: str, layout: str = "m4",
             gated: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(x8, scale) of a 2-D CUDA tensor (bf16, fp16 or fp32): per token ('row', rows x 1 scales) or per 1 x 128
    block ('1x128', rows x ceil(K / 128)), laid out as ``layout`` says: 'm4' M-major with the rows padded to a
    multiple of 4 (``scaled.m_major``: v11's), 'm' M-major unpadded, 'k' K-major (row-major). ``gated``: x is
    rows x 2K, gate then up, and what is quantized is SiLU(gate) x up (rows x K), in the same pass.

    The first call at a (granularity, dtype, K) and rows bucket builds and tunes the kernel, as a version's
    first call does (``support.dispatch``): never inside a CUDA graph capture."""
    check_granularity(granularity)
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if x.dim() != 2 or x.dtype not in DTYPES:
        raise TypeError(f"quantize takes a 2-D tensor of {', '.join(map(str, DTYPES))}, got {x.dim()}-D {x.dtype}")
    m, k = x.shape[0], x.shape[1] // 2 if gated else x.shape[1]
    if gated and x.shape[1] % 2:
        raise ValueError(f"gated quantize takes rows of gate then up, two halves, got {x.shape[1]} columns")
    if k % VECTOR or not k:
        raise ValueError(f"quantize takes rows of whole {VECTOR}-element vectors, got K = {k} (an fp8 GEMM's "
                         "K is a multiple of 16 anyway: TMA moves 16-byte rows)")
    if x.numel() >= 2 ** 31:
        raise ValueError(f"quantize indexes x with 32-bit offsets: at most 2^31 - 1 elements, got {x.numel()}")
    if not x.is_cuda:
        raise TypeError(f"quantize runs on a GPU, got a tensor on {x.device} (scaled.quantize is the CPU's)")
    if not x.is_contiguous() or x.data_ptr() % 16:
        x = x.clone(memory_format=torch.contiguous_format)  # whole rows, 16-byte aligned: the vector loads need it
    x8 = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
    shape, (row_stride, group_stride), size = scale_layout(m, k, granularity, layout)
    scales = torch.empty(size, dtype=torch.float32, device=x.device)
    if m:
        launch(GROUPS[granularity] or k, x, x8, scales, group_stride, row_stride, gated)
    return x8, scales.as_strided(shape, (row_stride, group_stride))


def check_granularity(granularity: str) -> None:
    if granularity not in GROUPS:
        raise ValueError(f"activations are quantized per token ('row') or per 1 x 128 block ('1x128'), got "
                         f"{granularity!r}")


def scale_layout(rows, k, granularity: str, layout: str) -> tuple[tuple, tuple, int]:
    """The scales' shape (rows x groups), their strides, and the elements of the buffer under them; ``rows`` may be
    symbolic (the op's fake implementation)."""
    groups = 1 if granularity == "row" else -(-k // GROUPS[granularity])
    if layout == "k":
        return (rows, groups), (groups, 1), rows * groups
    padded = rows + (-rows % 4 if layout == "m4" else 0)  # a group's scales at rows 16-byte aligned ('m4')
    return (rows, groups), (1, padded), groups * padded


def launch(group: int, x: torch.Tensor, x8: torch.Tensor, scales: torch.Tensor, group_stride: int,
           row_stride: int, gated: bool = False) -> None:
    """Run the kernel for ``group`` (building and tuning its bucket on the first call), on torch's current stream;
    ``scales`` is the whole buffer the scales go to, at the strides given."""
    m, k = x8.shape
    index = x.device.index
    key = (group, x.dtype, index, dispatch.bucket(m), k, group_stride == 1, gated)
    launcher = _launchers.get(key)
    if launcher is None:
        dispatch.refuse_capture(f"the activation quantizer's first call at {m}x{k}")
        script_cls = {(128, False): QuantizeBlocks, (128, True): QuantizeGatedBlocks}.get(
            (group, gated), QuantizeGatedRows if gated else QuantizeRows)
        # the GEMMs' argument order (three sizes, three tensors, the rest), which the tuner and dispatch.run take
        func = dispatch.build_tune_run(script_cls, dispatch.device(index),
                                       (m, k // VECTOR, group_stride, x, x8, scales, row_stride),
                                       size=f"{m}x{k}", finalist_count=FINALISTS, group=group, dtype=DTYPES[x.dtype])
        _launchers[key] = (func, (row_stride,), (row_stride,))
    else:
        dispatch.run(launcher, index, m, k // VECTOR, group_stride, x, x8, scales)
