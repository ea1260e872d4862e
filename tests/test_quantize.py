"""The activation quantizer (quantize.py): its schedules build with 16-byte loads (CPU), it refuses bad inputs in
words (CPU), its op gives the kernel's shapes and strides to fake tensors (CPU), and on a GPU its bits are
scaled.quantize's."""

import re

import pytest
import tilus
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import quantize
import support  # noqa: F401  (the tilus 0.2.0 workarounds)
from support import build, dispatch, fp8_torch, gpu, scaled

KERNELS = [(quantize.QuantizeBlocks, 128), (quantize.QuantizeRows, 4096), (quantize.QuantizeRows, 14336)]


@pytest.mark.parametrize("kernel, group, dtype", [(kernel, group, dtype) for kernel, group in KERNELS
                                                  for dtype in (tilus.bfloat16, tilus.float32)]
                         # SiLU(gate) x up's: a Llama's MLP is bf16
                         + [(quantize.QuantizeGatedBlocks, 128, tilus.bfloat16),
                            (quantize.QuantizeGatedRows, 14336, tilus.bfloat16)])
def test_every_schedule_builds_with_vector_loads_and_no_local_memory(kernel, group, dtype):
    results = build.build_schedules(kernel, "hopper", progress=lambda line: None,
                                    script_kwargs={"group": group, "dtype": dtype},
                                    call_args=(2048, 14336 // quantize.VECTOR, 2048, 0, 0, 0, 1))
    assert len(results) == dispatch.space_size(kernel)
    for r in results:
        schedule = dispatch.format_schedule(r.schedule)
        assert r.ok and (r.spill_bytes, r.stack_bytes) == (0, 0), f"{schedule}: {r.describe(gpu.ARCHS['hopper'])}"
        ptx = (r.module_dir / "source.ptx").read_text()
        # K passed in whole vectors lets tilus prove each thread's 8 elements in bounds together: 16-byte loads of
        # a 16-bit x (two of fp32), 8-byte stores of the e4m3 values, never an element at a time
        loads, stores = re.findall(r"ld\.global\S*", ptx), re.findall(r"st\.global\S*", ptx)
        assert loads and all(".v4." in op for op in loads), (schedule, set(loads))
        assert {op for op in stores if not op.endswith(".f32")} == {"st.global.v2.u32"}, (schedule, set(stores))
        assert "cvt.rn.satfinite.e4m3x2.f32" in ptx  # rounds to nearest and saturates, as torch's cast of a clamp


def test_bad_inputs_are_refused_in_words():
    x = torch.zeros(4, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="per token .* per 1 x 128 block"):
        quantize.quantize(x, "128x128")
    with pytest.raises(ValueError, match="layout must be one of"):
        quantize.quantize(x, "row", layout="n")
    with pytest.raises(TypeError, match="2-D tensor of"):
        quantize.quantize(x.to(torch.int32), "row")
    with pytest.raises(TypeError, match="2-D tensor of"):
        quantize.quantize(x[None], "row")
    with pytest.raises(ValueError, match="whole 8-element vectors, got K = 20"):
        quantize.quantize(x[:, :20], "1x128")
    with pytest.raises(TypeError, match="runs on a GPU"):
        quantize.quantize(x, "row")
    with pytest.raises(ValueError, match="gate then up, two halves, got 249 columns"):
        quantize.quantize(x[:, :249], "row", gated=True)
    with pytest.raises(ValueError, match="whole 8-element vectors, got K = 60"):
        quantize.quantize(x[:, :120], "row", gated=True)
    with pytest.raises(ValueError, match="32-bit offsets"):
        quantize.quantize(torch.empty(2 ** 20, 2 ** 11, dtype=torch.bfloat16, device="meta"), "row")


@pytest.mark.parametrize("granularity", ["row", "1x128"])
def test_the_op_gives_the_kernels_shapes_and_strides_to_fake_tensors(granularity):
    with FakeTensorMode():
        for rows, k in [(1, 4096), (37, 256), (64, 14336)]:
            x = torch.empty(rows, k, dtype=torch.bfloat16, device="cuda")
            groups = 1 if granularity == "row" else k // 128
            padded = -(-rows // 4) * 4
            for layout, strides in [("m4", (1, padded)), ("m", (1, rows)), ("k", (groups, 1))]:
                x8, scale = fp8_torch.quantize_activations(x, granularity, layout)  # fake: through the op
                assert (tuple(x8.shape), x8.dtype, tuple(scale.shape)) == ((rows, k), scaled.FP8, (rows, groups))
                if groups > 1:
                    assert scale.stride() == strides, (rows, k, layout)
            # gated: gate then up in, SiLU(gate) x up's e4m3 and scales out
            x8, scale = fp8_torch.quantize_activations(x.new_empty(rows, 2 * k), granularity, gated=True)
            assert (tuple(x8.shape), tuple(scale.shape)) == ((rows, k), (rows, groups))


@pytest.mark.gpu
@pytest.mark.parametrize("granularity", ["row", "1x128"])
def test_on_the_gpu_the_bits_are_scaled_quantizes(granularity):
    # 200: a last 1 x 128 block of 72 columns; fp32: a kernel of its own (each a build and a tuning on a fresh GPU)
    shapes = [(1, 4096), (16, 14336), (2048, 4096), (5, 200), (37, 4096)]
    for (rows, k), dtype in zip(shapes, [torch.bfloat16] * 4 + [torch.float32], strict=True):
        x = torch.randn(rows, k, device="cuda").to(dtype) * 5
        want8, want_scale = scaled.quantize(x, granularity)
        for layout in quantize.LAYOUTS:
            x8, scale = quantize.quantize(x, granularity, layout)
            assert scale.shape == want_scale.shape, (rows, k, dtype, layout)
            # the kernel divides to within 2 ulp (tilus builds with fast math), torch exactly: a scale may differ in
            # its last bit, and a quotient on an e4m3 rounding boundary may land on the neighbouring value, rarely
            assert ((scale - want_scale).abs() <= 1e-6 * want_scale).all(), (rows, k, dtype, layout)
            if granularity == "1x128" and layout == "m4":
                assert scaled.m_major(scale) is scale  # v11 takes it as it is
            differ = x8.view(torch.uint8) != want8.view(torch.uint8)
            assert differ.float().mean() < 1e-4, (rows, k, dtype, layout)
            # one e4m3 step at most: e4m3 codes of one sign are in the order of their magnitudes
            steps = (x8.view(torch.uint8).int() - want8.view(torch.uint8).int()).abs()
            assert (steps <= 1).all(), (rows, k, dtype, layout)


@pytest.mark.gpu
@pytest.mark.parametrize("granularity", ["row", "1x128"])
def test_on_the_gpu_the_gated_kernel_quantizes_torchs_silu_times_up(granularity):
    # 200: a last 1 x 128 block of 72 columns, gate's masked before up's begin
    for rows, k in [(1, 14336), (37, 4096), (5, 200)]:
        x = torch.randn(rows, 2 * k, device="cuda").to(torch.bfloat16) * 3
        want8, want_scale = scaled.quantize(fp8_torch.swiglu(x), granularity)
        x8, scale = quantize.quantize(x, granularity, gated=True)
        assert x8.shape == (rows, k) and scale.shape == want_scale.shape
        # SiLU's exp and division in fast math may round a product to the neighbouring bf16 value, rarely: a group's
        # largest then moves its scale by a bf16 step (at most 2^-7 of it), and each value in it by an e4m3 step
        assert ((scale - want_scale).abs() <= 2 ** -7 * want_scale * (1 + 1e-6)).all(), (rows, k)
        steps = (x8.view(torch.uint8).int() - want8.view(torch.uint8).int()).abs()
        assert (steps <= 1).all() and (steps > 0).float().mean() < 1e-2, (rows, k)


@pytest.mark.gpu
def test_zeros_empty_rows_and_a_cuda_graph():
    x = torch.zeros(3, 256, dtype=torch.bfloat16, device="cuda")
    x8, scale = quantize.quantize(x, "1x128")
    assert not x8.float().any() and torch.allclose(scale, scaled.quantize(x, "1x128")[1], rtol=1e-6, atol=0)
    x8, scale = quantize.quantize(x[:0], "row")
    assert x8.shape == (0, 256) and scale.shape == (0, 1)
    # tuned by a first call, the kernel is recorded into a graph and replays on new values of the same tensor
    x = torch.randn(48, 4096, dtype=torch.bfloat16, device="cuda")
    quantize.quantize(x, "1x128")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out8, out_scale = quantize.quantize(x, "1x128")
    x.copy_(torch.randn_like(x) * 7)
    graph.replay()
    want8, want_scale = scaled.quantize(x, "1x128")
    assert torch.allclose(out_scale, want_scale, rtol=1e-6, atol=0)
    assert (out8.view(torch.uint8) != want8.view(torch.uint8)).float().mean() < 1e-4
    with pytest.raises(RuntimeError, match="first call at 48x1024 .* cannot be recorded"), \
            torch.cuda.graph(torch.cuda.CUDAGraph()):
        quantize.quantize(torch.randn(48, 1024, device="cuda"), "row")
