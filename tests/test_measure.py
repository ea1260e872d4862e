"""CPU (CI): the correctness check (support/measure.py) catches local errors and passes correct results."""

import math

import pytest
import torch

from support import measure


def rounded(m: int, n: int, k: int, dtype: torch.dtype, seed: int = 0):
    """(out, ref): the fp32 product of random normal inputs and that product rounded to dtype, as a correct kernel
    gives it."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=gen).to(dtype).float()
    b = torch.randn(n, k, generator=gen).to(dtype).float()
    ref = a @ b.T
    return ref.to(dtype), ref


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_check_catches_planted_errors(dtype):
    out, ref = rounded(8192, 8192, 64, dtype)
    assert measure.passes(measure.relative_error(out, ref), dtype)
    # a zeroed 64 x 64 block: 1/128 of C's norm, inside bf16's tolerance as a global Frobenius error
    block = out.clone()
    block[4096:4160, 1024:1088] = 0
    global_frobenius = (torch.linalg.norm(block.float() - ref) / torch.linalg.norm(ref)).item()
    assert global_frobenius < 1e-2
    assert not measure.passes(measure.relative_error(block, ref), dtype)
    # a single wrong element: one element of 67 million, zeroed where the reference is large
    element = out.clone()
    i, j = divmod(int(ref.abs().argmax()), ref.shape[1])
    element[i, j] = 0
    assert not measure.passes(measure.relative_error(element, ref), dtype)
    # a tile at the ragged edge counts its own elements only
    edge = out[:8190, :8190].clone()
    edge[-2:, -2:] = 0
    assert not measure.passes(measure.relative_error(edge, ref[:8190, :8190]), dtype)


# the shapes the tests and the benchmark check at: square, ragged, skinny, decode, long K
SHAPES = [(4096, 4096, 4096), (1000, 1016, 1024), (129, 264, 72), (7, 8, 8), (1, 4096, 4096), (16, 14336, 4104),
          (3000, 520, 4104), (128, 8192, 512)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_correct_results_pass_with_room(m, n, k, dtype):
    # no false alarm: a correctly rounded C stays at most half the tolerance at every committed kind of shape
    out, ref = rounded(m, n, k, dtype, seed=m + n + k)
    err = measure.relative_error(out, ref)
    global_frobenius = (torch.linalg.norm(out.float() - ref) / torch.linalg.norm(ref)).item()
    assert global_frobenius <= err <= measure.REL_ERR_TOL[dtype] / 2, (err, global_frobenius)


def test_unwritten_output_is_nan():
    out, ref = rounded(64, 64, 64, torch.float16)
    out[3, 5] = math.nan
    assert math.isnan(measure.relative_error(out, ref))


@pytest.mark.parametrize("b_shape, b_dtype", [((8, 64), torch.float8_e4m3fn), ((8, 32), torch.float8_e4m3fn),
                                              ((16, 64), torch.bfloat16)])
def test_the_tuners_warm_up_takes_any_kernels_first_two_tensors(monkeypatch, b_shape, b_dtype):
    # a GEMM's A and B; a quantizer's x and x8; the gated quantizer's x (2 K columns) and x8 (K), unlike widths
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    products = []
    monkeypatch.setattr(torch, "matmul", lambda a, b: products.append((a.shape, b.shape)))
    measure.warm_up_gpu(torch.randn(8, 64, dtype=torch.bfloat16), torch.zeros(b_shape).to(b_dtype), seconds=1e-3)
    assert products and all(a[-1] == b[0] for a, b in products)  # each product's shapes agree
