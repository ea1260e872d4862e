"""Blackwell v1: one warp loads a tile, waits, multiplies into tensor memory (TMEM), waits.

The Blackwell kernel of matmul_v1.py's idea: tcgen05.mma keeps the accumulator in TMEM, one
warp issues it, and tcgen05.commit makes the tensor core arrive on an mbarrier when it is done.
Built for sm_100a and protocol-checked in CI (tests/test_protocol.py), never run: there was no
Blackwell GPU. docs/blackwell.md says what it changes against the Hopper page of the same idea.

Run: python blackwell/matmul_v1.py [--sizes ...] [--check-only] [--compile-only]
"""

import sys

import tilus
import torch
from tilus import DataType, float16, float32, int32, uint8, uint32, void_p
from tilus.utils import cdiv

import support
from blackwell.tcgen05_fences import after_thread_sync, before_thread_sync


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


KERNELS = support.kernels("v1", blackwell=BlackwellMatmulV1)


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """C = A @ B.T for A (M x K) and B (N x K) on a Blackwell GPU, fp32 accumulation; A, B and C all fp16 or bf16.

    Raises TypeError/ValueError naming the rule for input the kernel cannot take.
    """
    return support.launch(KERNELS, a, b, out)


if __name__ == "__main__":
    sys.exit(support.main("v1", KERNELS, matmul))
