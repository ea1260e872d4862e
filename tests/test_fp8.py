"""v10 and v11, fp8 e4m3 with scales: the kernels build (CPU), the host side's quantize, scaling and input rules
(CPU), and the product on a GPU (marked `gpu`; skipped with the reason where there is none)."""

import functools
import math
import re
import sys

import pytest
import tilus
import torch

import matmul_v10
import matmul_v11
from matmul_v11 import BOX_K
from support import build, cache, dispatch, gpu, measure, protocol, scaled
from conftest import sanitizer
from test_gpu import run_child

FP8 = torch.float8_e4m3fn
# v10's per-tensor and row-wise kernels; v11's copy of them, its block-wise kernels, and its promoted
# per-tensor and row-wise kernels (Hopper only)
KERNEL_TABLES = ["matmul_v10.KERNELS", "matmul_v11.KERNELS", "matmul_v11.BLOCKWISE_KERNELS",
                 "matmul_v11.PROMOTED_KERNELS"]
MODULES = {"matmul_v10": matmul_v10, "matmul_v11": matmul_v11}
# each scaling's version and its matmul: v10 per-tensor and row-wise (fast), v11 block-wise
MATMUL = {"tensor": matmul_v10, "row": matmul_v10, "block": matmul_v11}
PROMOTED = functools.partial(matmul_v11.matmul, accumulate="promoted")


def kernel_table(table: str) -> dict:
    """'matmul_v11.BLOCKWISE_KERNELS' -> that module's table."""
    module, name = table.split(".")
    return getattr(MODULES[module], name)


# every (table, architecture) with a kernel
TABLE_ARCHS = [(table, arch) for table in KERNEL_TABLES for arch in ("hopper", "blackwell")
               if arch in kernel_table(table)]


@functools.cache  # each kernel's whole space once per session: 10-20 s each, CI has 2 cores
def built(table: str, arch: str = "hopper") -> list[build.BuildResult]:
    return build.build_schedules(kernel_table(table)[arch], arch, progress=lambda line: None, call_args=scaled.BUILD_ARGS)


def describe(r: build.BuildResult, arch: str = "hopper") -> str:
    return f"{dispatch.format_schedule(r.schedule)}: {r.describe(gpu.ARCHS[arch])}"


@pytest.mark.parametrize("table, arch", TABLE_ARCHS)
def test_every_schedule_builds(table, arch):
    # tilus' autotuner silently drops schedules that fail to build: count them here
    kernel = kernel_table(table)[arch]
    results = built(table, arch)
    assert len(results) == dispatch.space_size(kernel)
    failed = [describe(r, arch) for r in results if not r.ok]
    assert not failed, f"{kernel.__name__} schedules that do not build: {failed}"


@pytest.mark.parametrize("table, arch", TABLE_ARCHS)
def test_no_local_memory_no_ptxas_warnings(table, arch):
    # spills or a stack frame put registers in local memory, and ptxas warns where it serialises
    # wgmma (C7515, C7520) or drops setmaxnreg (C7508): each a silent slowdown
    for r in built(table, arch):
        assert r.ok, describe(r, arch)
        assert (r.spill_bytes, r.stack_bytes, r.ptxas_warnings) == (0, 0, []), describe(r, arch)


@pytest.mark.parametrize("table, arch", TABLE_ARCHS)
def test_every_schedule_follows_the_protocol(table, arch):
    # support/protocol.py's rules, as for v1-v9 (tests/test_protocol.py); on Blackwell, where fp8 never
    # runs here, they include TMEM allocation, the partials' ring's barrier counts and fences, and
    # every tcgen05.mma being kind::f8f6f4 with e4m3 operands and the tile's shape
    found = [str(v) for r in built(table, arch) for v in protocol.check_build(r, arch, operands="float8_e4m3")]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("table", KERNEL_TABLES)
def test_every_wgmma_is_e4m3_and_as_wide_as_the_tile(table):
    # an fp16/bf16 wgmma here would mean the operands were read as the wrong type; a narrower N
    # than the tile, that tilus split it (compat defect 7)
    for r in built(table):
        mmas = re.findall(r"wgmma\.mma_async\S*", (r.module_dir / "source.ptx").read_text())
        assert mmas, f"{describe(r)}: no wgmma in the PTX"
        assert all(mma.endswith(".f32.e4m3.e4m3") for mma in mmas), (describe(r), set(mmas))
        widths = {re.search(r"\.m64n(\d+)k32\.", mma).group(1) for mma in mmas}
        assert widths == {str(r.schedule["block_n"])}, f"{describe(r)}: wgmma N {widths}"


@pytest.mark.parametrize("table", KERNEL_TABLES)
def test_output_rings_only_on_per_tensor_tiles_of_several_boxes(table):
    # a consumer with its own ring of two output boxes waits for the store of two boxes back
    # (wait_group.read 1); where the consumers take turns with one tile (block-wise, one-box
    # tiles) each waits for all its stores (wait_group.read 0) before passing s_c on
    for r in built(table):
        ptx = (r.module_dir / "source.ptx").read_text()
        ring = table.endswith(".KERNELS") and not r.schedule["swap_ab"] and r.schedule["block_n"] >= 128
        assert ("cp.async.bulk.wait_group.read 1;" in ptx) == ring, describe(r)
        assert ("cp.async.bulk.wait_group.read 0;" in ptx) != ring, describe(r)


@pytest.mark.parametrize("table", KERNEL_TABLES)
def test_promoting_kernels_start_a_fresh_partial_every_k_block(table):
    # the promotion: each 128-column K block's four m64nNk32 steps start from a fresh partial (mma_fresh: the first
    # step's scale-d is 0), which is then added into the fp32 sum; a fast kernel's sum runs over all of K (scale-d 1)
    promotes = table.endswith(("BLOCKWISE_KERNELS", "PROMOTED_KERNELS"))
    for r in built(table):
        mmas = re.findall(r"wgmma\.mma_async[^;]*;", (r.module_dir / "source.ptx").read_text())
        fresh = [mma for mma in mmas if mma.endswith(", 0, 1, 1;")]
        assert len(fresh) * (BOX_K // 32) == len(mmas) if promotes else not fresh, describe(r)


@pytest.mark.parametrize("arch", ["hopper", "blackwell"])
def test_fp16_output_builds_and_stores_fp16(arch):
    # A and B are fp8, which TMA moves as bytes (UINT8); C's tensor map and the epilogue's conversion
    # carry the output dtype: bf16 in the default build, fp16 (and no bf16) in the fp16 one
    def output_types(r: build.BuildResult) -> tuple[set, set]:
        maps = set(re.findall(r"CU_TENSOR_MAP_DATA_TYPE_(\w+)", (r.module_dir / "source.cu").read_text()))
        return maps, set(re.findall(r"cvt\.rn\.(b?f16)(?:x2)?\.f32", (r.module_dir / "source.ptx").read_text()))

    assert output_types(built("matmul_v10.KERNELS", arch)[0]) == ({"UINT8", "BFLOAT16"}, {"bf16"})
    (r,) = build.build_schedules(matmul_v10.KERNELS[arch], arch, progress=lambda line: None,
                                 script_kwargs={"out_dtype": tilus.float16}, call_args=scaled.BUILD_ARGS, limit=1)
    assert r.ok and (r.spill_bytes, r.stack_bytes, r.ptxas_warnings) == (0, 0, []), describe(r, arch)
    assert output_types(r) == ({"UINT8", "FLOAT16"}, {"f16"})


# --- quantize, scaling_of, check_inputs, reference (CPU) ---

def block_amax(x: torch.Tensor, block_rows: int, block_cols: int) -> torch.Tensor:
    """The largest magnitude of each block_rows x block_cols block of x, the last ones partial."""
    rows, cols = x.shape
    padded = torch.nn.functional.pad(x.abs(), (0, -cols % block_cols, 0, -rows % block_rows))
    return padded.view(padded.shape[0] // block_rows, block_rows, -1, block_cols).amax(dim=(1, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("granularity", scaled.GRANULARITIES)
def test_quantize(granularity, dtype):
    rows, k = 1000, 2000  # neither a multiple of 128: partial blocks in both directions
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(0)).to(dtype)
    x8, scale = scaled.quantize(x, granularity)
    block = {"tensor": (rows, k), "row": (1, k), "1x128": (1, 128), "128x128": (128, 128)}[granularity]
    shape = {"tensor": None, "row": (rows, 1), "1x128": (rows, 16), "128x128": (8, 16)}[granularity]
    assert scale.dtype == torch.float32, scale.dtype
    assert scale.numel() == 1 if shape is None else tuple(scale.shape) == shape, scale.shape
    assert x8.dtype == FP8 and x8.shape == x.shape
    assert x8.float().abs().max() <= scaled.E4M3_MAX, "values past e4m3's range (or NaN)"
    # each scale maps its block's largest magnitude to 448 exactly (x / (amax / 448) rounds to 448)
    amax8 = block_amax(x8.float(), *block)
    assert torch.equal(amax8, torch.full_like(amax8, scaled.E4M3_MAX)), amax8.unique()
    # e4m3 keeps 3 mantissa bits: rounding to nearest errs by at most half an ulp, 2^-4 of the value's
    # power of two. Spread evenly, that is 2^-4 / sqrt(3) = 3.6% of the power of two RMS, and less of
    # the value, 1 to 2 times it: about 2.6% measured. Subnormals lie more than 2^14 below a block's
    # max and weigh nothing in the norm. 4% leaves room for that, not for a scale a few percent off.
    dequantized = x8.float() * scaled.expand(scale, rows, k)
    err = (torch.linalg.norm(dequantized - x.float()) / torch.linalg.norm(x.float())).item()
    assert err < 0.04, f"{granularity}: dequantized x is {err:.3%} off"


def test_activation_block_scales_come_m_major():
    # v11's Hopper kernel loads a K block's row scales by TMA (one box): M-major, 16-byte aligned rows
    _, scale = scaled.quantize(torch.randn(37, 300), "1x128")
    assert scale.stride(0) == 1 and scale.stride(1) == 40, scale.stride()
    assert scaled.m_major(scale) is scale
    k_major = scale.contiguous()
    copy = scaled.m_major(k_major)
    assert torch.equal(copy, k_major) and copy.stride() == (1, 40), copy.stride()


def test_quantize_rejects_an_unknown_granularity():
    with pytest.raises(ValueError, match="granularity must be one of"):
        scaled.quantize(torch.randn(4, 128), "64x64")


def wide(rows: int, k: int, gen: torch.Generator, device: str, along_k: bool = True) -> torch.Tensor:
    """Random normal values scaled by a power of two per row (2^-4 .. 2^4), per 128-row block (2^-4 .. 2^4) and,
    ``along_k``, per 128-column block (2^-8 .. 2^8): neighbouring scale blocks differ by orders of magnitude, so a
    kernel that reads a neighbour's scale errs by far, not by the few percent that i.i.d. normal blocks' scales
    differ by."""
    block = scaled.BLOCK
    row = torch.randint(-4, 5, (rows, 1), generator=gen, device=device)
    row_block = torch.randint(-4, 5, (-(-rows // block), 1), generator=gen, device=device)
    col_block = torch.randint(-8, 9, (1, -(-k // block)), generator=gen, device=device) * along_k
    exponent = (row + row_block.repeat_interleave(block, dim=0)[:rows]
                + col_block.repeat_interleave(block, dim=1)[:, :k])
    return torch.randn(rows, k, generator=gen, device=device) * torch.exp2(exponent.float())


def operands(m: int, n: int, k: int, scaling: str, device: str = "cpu", seed: int = 0, magnitudes: str = "wide"):
    """(a8, b8, scale_a, scale_b): A and B quantized with the scaling's granularities, of wide magnitudes (``wide``)
    or, with ``magnitudes="normal"``, random normal: C then stays within fp16's range (a wide C reaches 2^30).

    Wide along K only where the scales vary along K (block-wise). Per-tensor and row-wise sums run the whole of K
    in the fp8 wgmma's accumulator, which keeps about 14 bits: a few dominant K blocks would make its rounding,
    not the scales, what the test measures."""
    gen = torch.Generator(device=device).manual_seed(seed)
    if magnitudes == "wide":
        a, b = (wide(rows, k, gen, device, along_k=scaling == "block") for rows in (m, n))
    else:
        a, b = (torch.randn(rows, k, generator=gen, device=device) for rows in (m, n))
    (a8, sa), (b8, sb) = (scaled.quantize(x, g) for x, g in zip((a, b), scaled.GRANULARITY[scaling]))
    return a8, b8, sa, sb


# N and K past a multiple of 128 (3 and 4 blocks), and K of one block, where a block-wise scale_a
# is M x 1 like a row-wise one and scale_b tells them apart
@pytest.mark.parametrize("k", [400, 128])
@pytest.mark.parametrize("scaling", scaled.SCALINGS)
def test_scaling_is_read_from_the_scales_shapes(scaling, k):
    m, n = 40, 264
    a8, b8, sa, sb = operands(m, n, k, scaling)
    assert scaled.scaling_of(m, n, k, sa, sb) == scaling
    assert scaled.scaling_of(m, n, k, sa, torch.ones(n + 1, 1)) is None


@pytest.mark.parametrize("scaling", scaled.SCALINGS)
def test_reference_is_the_product_of_the_dequantized_inputs(scaling):
    # in float64, each element's scale indexed by hand rather than through scaled.expand
    m, n, k = 5, 136, 272
    a8, b8, sa, sb = operands(m, n, k, scaling, seed=1)
    kb, rows_a, rows_b = torch.arange(k) // 128, torch.arange(m)[:, None], torch.arange(n)[:, None]
    if scaling == "tensor":
        sa64, sb64 = sa.double().reshape(1, 1), sb.double().reshape(1, 1)
    elif scaling == "row":
        sa64, sb64 = sa.double(), sb.double()
    else:
        sa64, sb64 = sa.double()[rows_a, kb], sb.double()[rows_b // 128, kb]
    expected = (a8.double() * sa64) @ (b8.double() * sb64).T
    ref = scaled.reference(a8, b8, sa, sb)
    assert ref.dtype == torch.float32 and ref.shape == (m, n)
    err = (torch.linalg.norm(ref.double() - expected) / torch.linalg.norm(expected)).item()
    assert err < 1e-6, err  # fp32 sums of 272 products


@pytest.mark.parametrize("scaling, which, dim", [("block", "scale_a", 1), ("block", "scale_b", 1),
                                                 ("block", "scale_b", 0), ("row", "scale_a", 0), ("row", "scale_b", 0)])
def test_a_neighbouring_scale_fails_the_check_by_far(scaling, which, dim):
    # the inputs' blocks span 2^-16 .. 2^16: a reference (as a kernel would) that reads its scales one block or
    # row off, along K (dim 1) or along M and N (dim 0), is far outside the tolerance, not near it
    m, n, k = 256, 384, 640
    a8, b8, sa, sb = operands(m, n, k, scaling, seed=4)
    ref = scaled.reference(a8, b8, sa, sb)
    shifted = {"scale_a": sa, "scale_b": sb}
    shifted[which] = torch.roll(shifted[which], 1, dims=dim)
    wrong = scaled.reference(a8, b8, shifted["scale_a"], shifted["scale_b"])
    assert measure.relative_error(wrong, ref) > 100 * measure.REL_ERR_TOL[torch.bfloat16]


def valid_inputs(device: str) -> dict:
    """A valid call's arguments, row-wise, M x N x K = 32 x 64 x 256."""
    a8, b8, sa, sb = operands(32, 64, 256, "row", device)
    return dict(a=a8, b=b8, scale_a=sa, scale_b=sb, out=None, out_dtype=torch.bfloat16)


# name -> (change to valid_inputs(device), error, the rule's words in its message)
BAD_INPUTS = {
    "a not a tensor": (lambda x: {"a": x["a"].float().tolist()}, TypeError, "a must be a torch.Tensor"),
    "a not fp8": (lambda x: {"a": x["a"].to(torch.bfloat16)}, TypeError, "a must be torch.float8_e4m3fn"),
    "b bf16": (lambda x: {"b": x["b"].to(torch.bfloat16)}, TypeError,
               "b must be torch.float8_e4m3fn, got torch.bfloat16"),
    "a 3-D": (lambda x: {"a": x["a"][None]}, ValueError, "a must be 2-D"),
    "scale_a float64": (lambda x: {"scale_a": x["scale_a"].double()}, TypeError, "scale_a must be torch.float32"),
    "scale_b of no scaling's shape": (lambda x: {"scale_b": x["scale_b"][:8]}, ValueError,
                                      "fit no scaling for 32x64x256"),
    "scale_a 1-D": (lambda x: {"scale_a": x["scale_a"][:, 0]}, ValueError, "fit no scaling"),
    "K not a multiple of 16": (lambda x: {"a": x["a"][:, :200].contiguous(), "b": x["b"][:, :200].contiguous()},
                               ValueError, "K must be a multiple of 16"),
    "N not a multiple of 8": (lambda x: {"b": x["b"][:60], "scale_b": x["scale_b"][:60]}, ValueError,
                              "N must be a multiple of 8"),
    "K mismatch": (lambda x: {"b": x["b"][:, :240].contiguous()}, ValueError, "K mismatch"),
    "M = 0": (lambda x: {"a": x["a"][:0], "scale_a": x["scale_a"][:0]}, ValueError, "empty dimension"),
    "K = 0": (lambda x: {"a": x["a"][:, :0], "b": x["b"][:, :0]}, ValueError, "empty dimension"),
    "a not contiguous": (lambda x: {"a": x["a"].T.contiguous().T}, ValueError, r"a must be contiguous"),
    "out of the wrong dtype": (lambda x: {"out": torch.empty(32, 64, device=x["a"].device)}, ValueError,
                               r"out must be torch.bfloat16 or torch.float16 of shape \(32, 64\), got torch.float32"),
    "out of the wrong shape": (lambda x: {"out": torch.empty(32, 72, dtype=torch.bfloat16, device=x["a"].device)},
                               ValueError, r"out must be torch.bfloat16 or torch.float16 of shape \(32, 64\)"),
    "out_dtype float32": (lambda x: {"out_dtype": torch.float32}, TypeError,
                          "out_dtype must be torch.bfloat16 or torch.float16"),
    "scale_b on the CPU": (lambda x: {"scale_b": x["scale_b"].cpu()}, ValueError, "is on the CPU; move it to the GPU"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_refused_naming_the_rule(case):
    change, error, words = BAD_INPUTS[case]
    inputs = valid_inputs("cpu")
    with pytest.raises(error, match=words):
        scaled.check_inputs(**inputs | change(inputs))


def test_valid_input_on_the_cpu_is_told_to_move_to_the_gpu():
    with pytest.raises(ValueError, match="a is on the CPU; move it to the GPU"):
        scaled.check_inputs(**valid_inputs("cpu"))


# accumulate= (v11's matmul): value -> (error, the rule's words); checked before the tensors, so on the CPU too
BAD_ACCUMULATE = {"exact": (ValueError, r"accumulate must be None or one of \('fast', 'promoted'\), got 'exact'"),
                  "Promoted": (ValueError, "accumulate must be None or one of"),
                  True: (TypeError, "accumulate must be None or one of .*, got bool")}


@pytest.mark.parametrize("value", BAD_ACCUMULATE, ids=str)
def test_bad_accumulate_is_refused_naming_the_rule(value):
    error, words = BAD_ACCUMULATE[value]
    with pytest.raises(error, match=words):
        scaled.check_accumulate(value)
    inputs = valid_inputs("cpu")
    with pytest.raises(error, match=words):
        matmul_v11.matmul(inputs["a"], inputs["b"], inputs["scale_a"], inputs["scale_b"], accumulate=value)


def test_each_contender_is_compared_with_cublas_adding_alike():
    # a kernel that adds in the fp8 wgmma's accumulator against torch._scaled_mm(use_fast_accum=True), one that
    # promotes against its default; cuBLAS rows against themselves; no % where that contender was not timed
    timed = {"v10 tensor", "v10 row", "v11 tensor promoted", "v11 row promoted", "v11 block", "cublas fp8 tensor",
             "cublas fp8 tensor fast", "cublas fp8 row fast", "cublas fp8 block", "triton fp8 row fast", "v9", "cublas"}
    expected = {"v10 tensor": "cublas fp8 tensor fast", "v10 row": "cublas fp8 row fast",
                "v11 tensor promoted": "cublas fp8 tensor", "v11 row promoted": None, "v11 block": "cublas fp8 block",
                "triton fp8 row fast": "cublas fp8 row fast", "cublas fp8 tensor": "cublas fp8 tensor",
                "cublas fp8 tensor fast": "cublas fp8 tensor fast", "v9": "cublas", "cublas": "cublas"}
    assert {name: scaled.versus_of(name, timed) for name in expected} == expected
    assert [scaled.dtype_of(name) for name in ("v11 row promoted", "cublas fp8 tensor fast", "v11 block", "v9")] == [
        "fp8 row", "fp8 tensor", "fp8 block", "bf16"]


def test_a_first_run_times_the_versions_default_and_full_every_size():
    default = [((4096, 4096, 4096), ("tensor", "bf16")), ((64, 14336, 4096), ("tensor",))]
    assert scaled.plan_of(None, False, default) == default
    assert scaled.plan_of(None, True, default) == [(size, scaled.GROUPS) for size in scaled.SIZES]
    assert scaled.plan_of([(128, 8192, 8192)], False, default) == [((128, 8192, 8192), scaled.GROUPS)]
    assert scaled.plan_of(None, False, None) == [(size, scaled.GROUPS) for size in scaled.SIZES]


# --- on a GPU ---

def call(scaling: str, m: int, n: int, k: int, out_dtype=torch.bfloat16, seed: int = 0):
    """(out, reference): matmul into a NaN-poisoned out, so any tile left unwritten fails; fp16 C from normal inputs."""
    magnitudes = "normal" if out_dtype == torch.float16 else "wide"
    a8, b8, sa, sb = operands(m, n, k, scaling, "cuda", seed, magnitudes)
    out = torch.full((m, n), math.nan, dtype=out_dtype, device="cuda")
    assert MATMUL[scaling].matmul(a8, b8, sa, sb, out=out) is out
    measure.sync_or_exit(f"{MATMUL[scaling].__name__} {scaling} at {m}x{n}x{k}", 60)
    return out, scaled.reference(a8, b8, sa, sb)


# decode (M = 1, swap_ab's tiles), K past a multiple of 128 (2064: a partial K block, and a scale block
# of 16 columns) with N past a multiple of every tile width, and a large one
@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(1, 4096, 4096), (37, 1000, 2064), (512, 4096, 4096)])
@pytest.mark.parametrize("scaling", scaled.SCALINGS)
def test_matmul_matches_the_dequantized_reference(scaling, m, n, k):
    out, ref = call(scaling, m, n, k)
    err = measure.relative_error(out, ref)
    assert measure.passes(err, torch.bfloat16), f"{scaling} at {m}x{n}x{k}: relative error {err:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("scaling", scaled.SCALINGS)
def test_matmul_stores_fp16(scaling):
    # fp16's bound where the product itself is that exact: block-wise, whose error in bf16 is bf16's
    # rounding alone (1.66e-3 at 4096^3, results/h100_fp8.csv). Per-tensor and row-wise sums run the
    # whole of K in the fp8 wgmma's narrower accumulator (2.1e-3 there: about 1.3e-3 of its own), so
    # bf16's bound; fp16 bits read as bf16 (or the reverse) would be far off either way
    out, ref = call(scaling, 37, 1000, 2064, out_dtype=torch.float16, seed=1)
    err = measure.relative_error(out, ref)
    bound = torch.float16 if scaling == "block" else torch.bfloat16
    assert out.dtype == torch.float16 and measure.passes(err, bound), f"{scaling}, fp16: relative error {err:.3g}"
    a8, b8, sa, sb = operands(37, 1000, 2064, scaling, "cuda", 1, "normal")
    assert MATMUL[scaling].matmul(a8, b8, sa, sb, out_dtype=torch.float16).dtype == torch.float16


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", scaled.CHECK_SIZES)
@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_promoted_matches_the_reference_at_the_check_sizes(scaling, m, n, k):
    # accumulate="promoted" (HopperMatmulV11Promoted) into a NaN-poisoned C, normal inputs as the CLI's check
    a8, b8, sa, sb = operands(m, n, k, scaling, "cuda", 5, "normal")
    out = torch.full((m, n), math.nan, dtype=torch.bfloat16, device="cuda")
    assert PROMOTED(a8, b8, sa, sb, out=out) is out
    measure.sync_or_exit(f"v11 {scaling} promoted at {m}x{n}x{k}", 60)
    err = measure.relative_error(out, scaled.reference(a8, b8, sa, sb))
    assert measure.passes(err, torch.bfloat16), f"{scaling} promoted at {m}x{n}x{k}: relative error {err:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_promoted_is_as_precise_as_cublas_default_and_fast_is_not(scaling):
    # at K = 8192 the fast sum's error is well above C's bf16 rounding (2.6e-3 against 1.66e-3 at 8192^3 on the
    # H100), while a promoted one stays at the rounding, as torch._scaled_mm's default does. 1.2 x the rounding
    # leaves room for the worst 64 x 64 tile's spread around C's error, not for a fast sum
    m, n, k = 128, 8192, 8192
    a8, b8, sa, sb = operands(m, n, k, scaling, "cuda", 6, "normal")
    ref = scaled.reference(a8, b8, sa, sb)
    bound = 1.2 * measure.rounding_error(torch.bfloat16)
    promoted = measure.relative_error(PROMOTED(a8, b8, sa, sb), ref)
    cublas = measure.relative_error(torch._scaled_mm(a8, b8.T, *scaled.cublas_scales(scaling, sa, sb),
                                                     out_dtype=torch.bfloat16), ref)
    fast = measure.relative_error(matmul_v11.matmul(a8, b8, sa, sb, accumulate="fast"), ref)
    assert promoted <= bound and cublas <= bound, (promoted, cublas, bound)
    assert fast > bound, f"the fast sum at K = {k}: {fast:.3g}, within the promoted bound {bound:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", scaled.CHECK_SIZES)
@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_cublas_fast_contender_at_the_check_sizes(scaling, m, n, k):
    # torch._scaled_mm(..., use_fast_accum=True), the benchmark's contender for v10: within the bound where torch
    # takes the shape (N and K multiples of 16), refused with a reason (not an exception) where it does not
    a8, b8, sa, sb = operands(m, n, k, scaling, "cuda", 7, "normal")
    form, refused = scaled.cublas_fp8(scaling, a8, b8, sa, sb, fast=True)
    if n % 16 or k % 16:
        assert form is None and refused, f"{m}x{n}x{k}"
    else:
        assert form == 0 and refused is None, refused


@pytest.mark.gpu
def test_bad_accumulate_on_the_gpu_is_refused_naming_the_rule():
    inputs = valid_inputs("cuda")
    for value, (error, words) in BAD_ACCUMULATE.items():
        with pytest.raises(error, match=words):
            matmul_v11.matmul(inputs["a"], inputs["b"], inputs["scale_a"], inputs["scale_b"], accumulate=value)
    with pytest.raises(TypeError, match="accumulate"):  # v10 adds one way only
        matmul_v10.matmul(inputs["a"], inputs["b"], inputs["scale_a"], inputs["scale_b"], accumulate="promoted")
    a8, b8, sa, sb = operands(32, 64, 256, "block", "cuda")
    with pytest.raises(ValueError, match="accumulate='fast' takes per-tensor and row-wise scales"):
        matmul_v11.matmul(a8, b8, sa, sb, accumulate="fast")
    out = matmul_v11.matmul(a8, b8, sa, sb, accumulate="promoted")  # what block-wise scales always get
    assert torch.equal(out, matmul_v11.matmul(a8, b8, sa, sb))


@pytest.mark.gpu
def test_blockwise_takes_k_major_activation_scales():
    # matmul copies them M-major (scaled.m_major): the same kernel, the same bits
    a8, b8, sa, sb = operands(37, 1000, 2064, "block", "cuda", 2)
    m_major = matmul_v11.matmul(a8, b8, sa, sb)
    assert torch.equal(matmul_v11.matmul(a8, b8, sa.contiguous(), sb), m_major)


def every_schedule(scaling: str, m: int, n: int, k: int, seed: int):
    """(what, launch, args, out, reference) for every built schedule of the scaling's Hopper kernel at m x n x k
    ('tensor promoted', 'row promoted': v11's promoted kernel)."""
    scaling, _, promoted = scaling.partition(" ")
    tables = (matmul_v11.BLOCKWISE_KERNELS if scaling == "block" else matmul_v11.PROMOTED_KERNELS if promoted
              else matmul_v10.KERNELS)
    kernel = tables["hopper"]
    cache.use_cache(kernel, gpu.gpu_label())
    a8, b8, sa, sb = operands(m, n, k, scaling, "cuda", seed)
    ref = scaled.reference(a8, b8, sa, sb)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    args = scaled.kernel_args(m, n, k, a8, b8, out, sa, sb, scaled.strides(scaling, sa, sb))
    jit = kernel(out_dtype=tilus.bfloat16)._jit_instance_for(*args)
    jit.programs()
    assert len(jit.valid_schedules) == dispatch.space_size(kernel), f"{kernel.__name__}: schedules failed to build"
    return [(f"{kernel.__name__} {dispatch.format_schedule(jit.schedules[i])} at {m}x{n}x{k}", compiled,
             jit.schedules[i], args, out, ref) for compiled, i in zip(jit.compiled_programs, jit.valid_schedules)]


@pytest.mark.gpu
@pytest.mark.parametrize("scaling", ["tensor", "row", "block", "tensor promoted", "row promoted"])
def test_every_schedule_matches_the_reference(scaling):
    # the tuner runs only the schedule it picks: every one of them here, with ragged M (for the
    # 64-, 128- and 192-row tiles), ragged N and a partial last K block, into a NaN-poisoned C.
    # Per-tensor scales take one multiply an element, row-wise ones the column scales in shared memory
    for what, compiled, _, args, out, ref in every_schedule(scaling, 200, 1000, 2064, seed=3):
        out.fill_(math.nan)
        compiled.get_launch_func()(*args)
        measure.sync_or_exit(what, 60)
        err = measure.relative_error(out, ref)
        assert measure.passes(err, torch.bfloat16), f"{what}: relative error {err:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("scaling", [*scaled.SCALINGS, "row promoted"])
def test_stream_k_schedules_are_bitwise_deterministic(scaling):
    # the owner adds its sharers' sums in a fixed order: every stream-K schedule, not only the tuned
    # one, gives the same bits run after run on shapes whose tiles are split over several SMs
    # (a skinny and a decode one), and leaves the workspace's flags at 0 for the next launch
    for m, n, k in [(128, 8192, 8192), (16, 4096, 14336)]:
        stream_k = [case for case in every_schedule(scaling, m, n, k, seed=2) if case[2]["stream_k"]]
        assert stream_k, f"{scaling}: no stream-K schedule"
        for what, compiled, _, args, out, ref in stream_k:
            runs = []
            for _ in range(3):
                out.fill_(math.nan)
                compiled.get_launch_func()(*args)
                runs.append(out.clone())
            measure.sync_or_exit(what, 60)
            assert all(torch.equal(run, runs[0]) for run in runs[1:]), f"{what}: runs differ"
            assert measure.passes(measure.relative_error(runs[0], ref), torch.bfloat16), what
            assert int(args[7].abs().sum()) == 0, f"{what}: stream-K flags left set"


@pytest.mark.gpu
@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_gpu_input_is_refused_naming_the_rule(case):
    change, error, words = BAD_INPUTS[case]
    inputs = valid_inputs("cuda")
    inputs |= change(inputs)
    # the checks alone first, which launch nothing: input that slips through them would reach a kernel
    with pytest.raises(error, match=words):
        scaled.check_inputs(**inputs)
    with pytest.raises(error, match=words):
        matmul_v10.matmul(**inputs)
    with pytest.raises(error, match=words):
        matmul_v11.matmul(**inputs)


@pytest.mark.gpu
def test_out_sharing_memory_with_an_input_is_refused():
    inputs = valid_inputs("cuda")
    raw = torch.empty(32 * 256, dtype=torch.uint8, device="cuda")  # a's bytes, and out's from the same address
    inputs["a"] = raw.view(FP8).view(32, 256).copy_(inputs["a"])
    with pytest.raises(ValueError, match="must not share memory"):
        matmul_v10.matmul(**inputs | {"out": raw[:32 * 64 * 2].view(torch.bfloat16).view(32, 64)})


SANITIZER_SIZES = ["129x264x144", "1x264x144"]
CLEAN = {"memcheck": "ERROR SUMMARY: 0 errors", "racecheck": "RACECHECK SUMMARY: 0 hazards displayed (0 errors",
         "synccheck": "ERROR SUMMARY: 0 errors"}  # ragged M and N, a 16-column K block; a decode tile


@pytest.mark.gpu
@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck"])
def test_sanitizer_clean_at_a_small_size(tool):
    # every scaling's tuned schedule: built and tuned outside the sanitizer, then picked from the cache
    for version in ("matmul_v10.py", "matmul_v11.py"):
        check = [sys.executable, version, "--check-only", "--sizes", *SANITIZER_SIZES]
        run_child(check, 600)
        output = run_child([sanitizer(), "--tool", tool, "--error-exitcode", "1", *check], 900)
        assert CLEAN[tool] in output, version


# block-wise tiles never the tuned schedule at the sizes above, launched here one by one: the 192-row
# ones (three consumer warpgroups taking turns with s_c) at a ragged M, and the swap_ab ones (decode:
# the weights' scales stored into the slot by the TMA warp, the activations' by TMA) at M = 5
SCHEDULES = """
import sys
sys.path[:0] = [".", "tests"]
import torch
import test_fp8
for what, compiled, schedule, args, out, ref in test_fp8.every_schedule("block", {m}, 264, 144, seed=3):
    if schedule[{key!r}] == {value!r}:
        compiled.get_launch_func()(*args)
        torch.cuda.synchronize()
        print("ran", what)
"""


@pytest.mark.gpu
@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck"])
@pytest.mark.parametrize("m, key, value, count", [(200, "block_m", 192, 4), (5, "swap_ab", True, 6)],
                         ids=["three-consumers", "swap_ab"])
def test_untuned_blockwise_tiles_sanitizer_clean(tool, m, key, value, count):
    child = [sys.executable, "-c", SCHEDULES.format(m=m, key=key, value=value)]
    assert run_child(child, 600).count("ran ") == count  # built outside the sanitizer
    assert CLEAN[tool] in run_child([sanitizer(), "--tool", tool, "--error-exitcode", "1", *child], 900)


@pytest.mark.gpu
def test_v10_refuses_block_wise_scales_naming_v11():
    # v10 has no block-wise kernel: its matmul says which version takes those scales, and launches nothing
    a8, b8, sa, sb = operands(32, 64, 256, "block", "cuda")
    with pytest.raises(ValueError, match=r"v10 takes per-tensor and row-wise scales; .* matmul_v11\.matmul"):
        matmul_v10.matmul(a8, b8, sa, sb)
