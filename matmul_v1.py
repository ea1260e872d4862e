"""v1: one warp (Blackwell) or one warpgroup (Hopper) loads a tile, waits, multiplies, waits.

C = A @ B.T with A (M x K), B (N x K), C (M x N) all fp16 or all bf16, and fp32
accumulation. Each thread block owns one block_m x block_n tile of C and walks K in steps
of block_k:

    TMA load A[block_m, block_k] and B[block_n, block_k] into shared memory
    wait on an mbarrier until the TMA engine reports all bytes arrived
    tensor-core MMA into the accumulator, and wait for it to finish
    (repeat), then the epilogue writes the accumulator to C in C's dtype

Against a textbook CUDA GEMM (every thread copies tiles, then FMAs or mma.sync), the TMA
engine moves the tiles and the edges (it zero-fills reads and drops writes past them), an
mbarrier counts the bytes, and wgmma (Hopper: accumulator in one warpgroup's registers) or
tcgen05.mma (Blackwell: accumulator in tensor memory) multiplies whole tiles from shared
memory. A proxy fence orders the epilogue's shared-memory stores before the TMA store.

Nothing overlaps inside a block. For 128 x 128 x 64 (a model, H100 numbers):

    tensor-core time   2 * 128 * 128 * 64 FLOP / 4096 FLOP/cycle/SM = 512 cycles
    load latency       a TMA round trip, ~1 us = ~1800 cycles at 1.83 GHz
                       (989 TFLOPS / (132 SMs * 4096 FLOP/cycle) = 1.83 GHz)

so one block keeps its SM's tensor cores busy at most 512 / (1800 + 512) = 22% of the
time. Several blocks share an SM and take turns: on Hopper 32 KiB of tiles would let 6 fit
(228 KiB / 33.1 KiB), but 154 registers a thread (allocated as 160) over 128 threads let
only 3 (65,536 / 20,480). v2 overlaps loads and MMAs inside one block.

Constraints (checked by support/checks.py): fp16 or bf16, one dtype for A, B and C,
contiguous, K and N multiples of 8 (TMA needs 16-byte row strides).

Run: python matmul_v1.py [--sizes 4096 8192 1000x1016x1024] [--check-only] [--compile-only]
Walkthrough: docs/v1.md
"""

import sys

import tilus
import torch
from tilus import DataType, RegisterTensor, float16, float32, int32, uint8, uint32, void_p
from tilus.ir.layout.ops.shared_ops import shared_row_major
from tilus.utils import cdiv

import support
from tcgen05_fences import after_thread_sync, before_thread_sync


# block_m = 128: the tcgen05.mma shape for one CTA; block_n up to 256 (TMEM columns used).
# block_k: 64 x 2 B = 128 B is the widest row TMA's 128-byte swizzle allows; 32 halves the
# wait per step at twice the number of steps. e_block_n: the epilogue's shared staging tile.
@tilus.autotune("block_m, block_n, e_block_n", [[128, 64, 32], [128, 128, 32], [128, 256, 32]])
@tilus.autotune("block_k", [32, 64])
class BlackwellMatmulV1(tilus.Script):
    def __init__(self, block_m: int, block_n: int, block_k: int, e_block_n: int, dtype: DataType = float16):
        super().__init__()
        self.dtype = dtype  # float16 or bfloat16: A, B and C
        self.block_m = block_m
        self.block_n = block_n
        self.block_k = block_k
        self.e_block_n = e_block_n

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
        self.attrs.warps = 4  # 128 threads: one per TMEM lane (row) for the epilogue

        # 1. the tile of C this block computes
        offset_m: int32 = self.block_m * self.blockIdx.x
        offset_n: int32 = self.block_n * self.blockIdx.y

        # 2. operands: global views, shared tiles, the accumulator, kept on self, where the
        # epilogue (a method of its own) finds them
        self.g_a = self.global_view(a_ptr, dtype=self.dtype, shape=[m_size, k_size])
        self.g_b = self.global_view(b_ptr, dtype=self.dtype, shape=[n_size, k_size])
        self.s_a = self.shared_tensor(dtype=self.dtype, shape=[self.block_m, self.block_k])
        self.s_b = self.shared_tensor(dtype=self.dtype, shape=[self.block_n, self.block_k])
        # An SM's TMEM is 512 columns and a block takes block_n of them; a block that finds
        # too few waits in tcgen05.alloc until another frees its columns. v1's tiles are small
        # enough for more blocks than that to share an SM, so it reserves shared memory it
        # does not use: with 228 KiB per SM and 1 KiB the driver keeps per block, a block of at
        # least 228 KiB / (512 / block_n + 1) leaves no room for one block too many.
        self.shared_tensor(dtype=uint8, shape=[228 * 1024 // (512 // self.block_n + 1)])
        self.t_acc = self.tcgen05.alloc(dtype=float32, shape=[self.block_m, self.block_n])

        # 3. barriers
        # one barrier for "the TMA bytes arrived", one for "the MMA finished"
        tma_barrier, mma_barrier = self.mbarrier.alloc(counts=[1, 1]).tolist()
        phase: uint32 = 0  # both barriers complete once per K step, so one phase bit serves both
        self.sync()

        # 4. the K loop: load a step, wait for it, multiply, wait for the multiply
        for offset_k in self.range(0, k_size, self.block_k):
            with self.single_warp():
                with self.single_thread():
                    self.mbarrier.arrive_and_expect_tx(tma_barrier, transaction_bytes=self.s_a.nbytes + self.s_b.nbytes)
                self.tma.global_to_shared(src=self.g_a, dst=self.s_a, offsets=[offset_m, offset_k], mbarrier=tma_barrier)
                self.tma.global_to_shared(src=self.g_b, dst=self.s_b, offsets=[offset_n, offset_k], mbarrier=tma_barrier)
                self.mbarrier.wait(tma_barrier, phase=phase)

                # the first step overwrites TMEM, which starts with garbage
                self.tcgen05.mma(self.s_a, self.s_b.transpose(), self.t_acc, enable_input_d=offset_k != 0)
                self.tcgen05.commit(mbarrier=mma_barrier)
                self.mbarrier.wait(mma_barrier, phase=phase)
            self.sync()
            phase ^= 1

        # 5. epilogue
        self.g_c = self.global_view(c_ptr, dtype=self.dtype, shape=[m_size, n_size])
        self.s_c = self.shared_tensor(dtype=self.dtype, shape=[self.block_m, self.e_block_n])
        self.epilogue(offset_m, offset_n)
        after_thread_sync()  # every warp's reads of TMEM before it is freed
        self.tcgen05.dealloc(self.t_acc)

    def epilogue(self, offset_m: int32, offset_n: int32):
        """TMEM -> registers -> shared -> global (TMA), e_block_n columns at a time, by all 4 warps."""
        after_thread_sync()  # the MMAs (the flush wait, then a block sync) before this thread reads TMEM
        for e_offset_n in range(0, self.block_n, self.e_block_n):
            t_acc_slice = self.tcgen05.slice(
                self.t_acc, offsets=[0, e_offset_n], shape=[self.block_m, self.e_block_n], dims=[0, 1]
            )
            r_acc = self.tcgen05.load(t_acc_slice)
            self.tcgen05.wait_load()
            before_thread_sync()  # these reads of TMEM happen before the next thread sync
            self.store_shared(self.s_c, r_acc.to(self.dtype))
            # generic-proxy stores must be made visible to the async proxy (TMA) before it reads s_c
            self.fence.proxy_async(space="shared")
            self.sync()
            with self.single_warp():
                self.tma.shared_to_global(self.s_c, self.g_c, offsets=[offset_m, offset_n + e_offset_n], dims=[0, 1])
                self.tma.commit_group()
                self.tma.wait_group(n=0, read=True)  # s_c is rewritten next iteration
            self.sync()


# The accumulator takes block_m * block_n / 128 fp32 registers per thread: 128 x 256 would
# need 256 and spill, so 128 is the most. block_k as on Blackwell.
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
        """Registers -> shared -> global (TMA), as on Blackwell, the whole tile at once."""
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


KERNELS = {"blackwell": BlackwellMatmulV1, "hopper": HopperMatmulV1}


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """C = A @ B.T for A (M x K) and B (N x K) on a Hopper or Blackwell GPU, fp32 accumulation.

    A, B and C are all fp16 or all bf16.

    Raises TypeError/ValueError naming the rule for input the kernels cannot take.
    """
    return support.launch(KERNELS, a, b, out)


if __name__ == "__main__":
    sys.exit(support.main("v1", KERNELS, matmul))
