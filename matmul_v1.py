"""v1: one warpgroup loads a tile with TMA, waits, multiplies it with wgmma, waits.

C = A @ B.T: A is M x K, B is N x K, C is M x N, all fp16 or all bf16, accumulated in fp32.
Each block owns one block_m x block_n tile of C and walks K in steps of block_k. A step: TMA
loads A's and B's tiles into shared memory, an mbarrier counts their bytes, the warpgroup's
wgmma multiplies them into registers, and wait_group(0) waits for it. A TMA store writes the
tile. Nothing overlaps inside a block; docs/v1.md counts what that costs.

Constraints (support/checks.py): one dtype, fp16 or bf16; contiguous; K and N multiples of 8.
Run: python matmul_v1.py [--sizes 4096 8192 1000x1016x1024] [--check-only] [--compile-only]
Walkthrough: docs/v1.md
"""

import sys

import tilus
import torch
from tilus import DataType, RegisterTensor, float16, float32, int32, uint32, void_p
from tilus.ir.layout.ops.shared_ops import shared_row_major
from tilus.utils import cdiv

import support


# The accumulator takes block_m * block_n / 128 fp32 registers per thread: 128 x 256 would
# need 256 and spill, so 128 is the most. block_k: 64 x 2 B = 128 B, the widest row TMA's
# 128-byte swizzle allows; 32 halves the wait per step at twice the number of steps.
@tilus.autotune("block_m, block_n", [[64, 128], [128, 64], [128, 128], [64, 256]])
@tilus.autotune("block_k", [32, 64])
class HopperMatmulV1(tilus.Script):
    def __init__(self, block_m: int, block_n: int, block_k: int, dtype: DataType = float16):
        super().__init__()
        self.dtype = dtype  # float16 or bfloat16: A, B and C
        self.block_m = block_m
        self.block_n = block_n
        self.block_k = block_k

    def __call__(
        self,
        m_size: int32,
        n_size: int32,
        k_size: int32,
        a_ptr: void_p,
        b_ptr: void_p,
        c_ptr: void_p,
    ):
        self.attrs.blocks = [cdiv(m_size, self.block_m), cdiv(n_size, self.block_n)]
        self.attrs.warps = 4  # one warpgroup: wgmma is issued by 4 warps together

        # 1. the tile of C this block computes
        offset_m: int32 = self.block_m * self.blockIdx.x
        offset_n: int32 = self.block_n * self.blockIdx.y

        # 2. operands: global views, shared tiles, the accumulator
        self.g_a = self.global_view(a_ptr, dtype=self.dtype, shape=[m_size, k_size])
        self.g_b = self.global_view(b_ptr, dtype=self.dtype, shape=[n_size, k_size])
        self.s_a = self.shared_tensor(dtype=self.dtype, shape=[self.block_m, self.block_k])
        self.s_b = self.shared_tensor(dtype=self.dtype, shape=[self.block_n, self.block_k])
        acc = self.register_tensor(dtype=float32, shape=[self.block_m, self.block_n], init=0.0)

        # 3. barriers
        tma_barrier = self.mbarrier.alloc(counts=[1])
        phase: uint32 = 0

        # 4. the K loop: load a step, wait for it, multiply, wait for the multiply
        for offset_k in self.range(0, k_size, self.block_k):
            with self.single_warp():
                with self.single_thread():
                    self.mbarrier.arrive_and_expect_tx(tma_barrier, transaction_bytes=self.s_a.nbytes + self.s_b.nbytes)
                self.tma.global_to_shared(src=self.g_a, dst=self.s_a, offsets=[offset_m, offset_k], mbarrier=tma_barrier)
                self.tma.global_to_shared(src=self.g_b, dst=self.s_b, offsets=[offset_n, offset_k], mbarrier=tma_barrier)
            self.mbarrier.wait(tma_barrier, phase=phase)

            self.wgmma.fence()
            self.wgmma.mma(self.s_a, self.s_b.transpose(), acc)
            self.wgmma.commit_group()
            self.wgmma.wait_group(0)  # the next load overwrites s_a and s_b
            self.sync()
            phase ^= 1

        # 5. epilogue: the output tile reuses the operand tiles' shared memory, which nothing reads now
        self.free_shared(self.s_a)
        self.free_shared(self.s_b)
        self.g_c = self.global_view(c_ptr, dtype=self.dtype, shape=[m_size, n_size])
        self.epilogue(acc, offset_m, offset_n)

    def epilogue(self, acc: RegisterTensor, offset_m: int32, offset_n: int32):
        """Registers -> shared -> global (TMA), the whole tile at once."""
        s_c = self.shared_tensor(dtype=self.dtype, shape=[self.block_m, self.block_n])
        # row-major, unswizzled: one TMA box for the whole tile (a 128-byte swizzle caps a box at 64 columns)
        self.annotate_layout(s_c, shared_row_major(self.block_m, self.block_n))
        self.store_shared(s_c, acc.to(self.dtype))
        # generic-proxy stores must be made visible to the async proxy (TMA) before it reads s_c
        self.fence.proxy_async(space="shared")
        self.sync()
        with self.single_warp():
            self.tma.shared_to_global(s_c, self.g_c, offsets=[offset_m, offset_n], dims=[0, 1])
            self.tma.commit_group()
            self.tma.wait_group(n=0, read=True)  # s_c must outlive the TMA engine's read of it


KERNELS = support.kernels("v1", hopper=HopperMatmulV1)


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """C = A @ B.T for A (M x K) and B (N x K) on a Hopper GPU, fp32 accumulation.

    A, B and C are all fp16 or all bf16.

    Raises TypeError/ValueError naming the rule for input the kernels cannot take.
    """
    return support.launch(KERNELS, a, b, out)


if __name__ == "__main__":
    sys.exit(support.main("v1", KERNELS, matmul))
