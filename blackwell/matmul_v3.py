"""Blackwell v3: warp specialisation. A TMA warp loads, an MMA warp multiplies; a flush barrier ends the tile.

The Blackwell kernel of matmul_v3.py's idea: the MMA warp frees each slot with a
tcgen05.commit on its empty barrier and never waits; one more commit on the flush barrier
proves every MMA finished before the epilogue reads TMEM.
Built for sm_100a and protocol-checked in CI (tests/test_protocol.py), never run: there was no
Blackwell GPU. docs/blackwell.md says what it changes against the Hopper page of the same idea.

Run: python blackwell/matmul_v3.py [--sizes ...] [--check-only] [--compile-only]
"""

import sys

import tilus
import torch
from tilus import DataType, float16, float32, int32, uint32, void_p
from tilus.utils import cdiv

import support
from blackwell.tcgen05_fences import after_thread_sync, before_thread_sync


# block_m = 128: the tcgen05.mma shape for one CTA; block_n up to 256 (TMEM columns used).
# block_k = 64 x 2 B = 128 B, the widest row TMA's 128-byte swizzle allows.
# stages: 2..4 slots; 4 x 48 KiB is the most the 128 x 256 tile fits.
@tilus.autotune("block_m, block_n, e_block_n", [[128, 64, 32], [128, 128, 32], [128, 256, 32]])
@tilus.autotune("block_k", [64])
@tilus.autotune("stages", [2, 3, 4])
class BlackwellMatmulV3(tilus.Script):
    def __init__(self, block_m: int, block_n: int, block_k: int, e_block_n: int, stages: int,
                 dtype: DataType = float16):
        super().__init__()
        self.dtype = dtype  # float16 or bfloat16: A, B and C
        self.block_m = block_m
        self.block_n = block_n
        self.block_k = block_k
        self.e_block_n = e_block_n
        self.stages = stages

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

        # 2. operands: global views, shared tiles, the accumulator
        self.g_a = self.global_view(a_ptr, dtype=self.dtype, shape=[m_size, k_size])
        self.g_b = self.global_view(b_ptr, dtype=self.dtype, shape=[n_size, k_size])
        self.s_a = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.block_m, self.block_k])
        self.s_b = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.block_n, self.block_k])
        self.t_acc = self.tcgen05.alloc(dtype=float32, shape=[self.block_m, self.block_n])

        # 3. barriers
        self.full_barriers = self.mbarrier.alloc(counts=[1] * self.stages)  # a slot's loads landed
        self.empty_barriers = self.mbarrier.alloc(counts=[1] * self.stages)  # a slot's MMA finished
        self.flush_barrier = self.mbarrier.alloc(counts=[1])
        self.sync()

        # 4. the K loop, one per role
        with self.thread_group(thread_begin=0, num_threads=32):  # producer: the TMA warp
            self.producer(offset_m, offset_n, k_size)
        with self.thread_group(thread_begin=32, num_threads=32):  # consumer: the MMA warp
            self.mma(k_size)
            self.mbarrier.wait(self.flush_barrier, phase=0)  # every MMA has finished: TMEM holds the tile
        self.sync()

        # 5. epilogue
        self.g_c = self.global_view(c_ptr, dtype=self.dtype, shape=[m_size, n_size])
        self.s_c = self.shared_tensor(dtype=self.dtype, shape=[self.block_m, self.e_block_n])
        self.epilogue(offset_m, offset_n)
        after_thread_sync()  # every warp's reads of TMEM before it is freed
        self.tcgen05.dealloc(self.t_acc)

    def producer(self, offset_m: int32, offset_n: int32, k_size: int32):
        """The TMA warp: every K step into the ring, as far ahead as the empty slots allow."""
        stage: int32 = 0
        producer_phase: uint32 = self.mbarrier.producer_initial_phase  # 1: every slot starts empty
        for offset_k in self.range(0, k_size, self.block_k, unroll=self.stages):
            self.mbarrier.wait(self.empty_barriers[stage], phase=producer_phase)
            with self.single_thread():
                self.mbarrier.arrive_and_expect_tx(
                    self.full_barriers[stage], transaction_bytes=self.s_a[stage].nbytes + self.s_b[stage].nbytes
                )
            self.tma.global_to_shared(
                src=self.g_a, dst=self.s_a[stage], offsets=[offset_m, offset_k], mbarrier=self.full_barriers[stage]
            )
            self.tma.global_to_shared(
                src=self.g_b, dst=self.s_b[stage], offsets=[offset_n, offset_k], mbarrier=self.full_barriers[stage]
            )
            stage = (stage + 1) % self.stages
            producer_phase ^= stage == 0

    def mma(self, k_size: int32):
        """The MMA warp, the ring's consumer: one tcgen05.mma per K step into TMEM, none waited for."""
        stage: int32 = 0
        consumer_phase: uint32 = self.mbarrier.consumer_initial_phase  # 0: wait for the first load
        for offset_k in self.range(0, k_size, self.block_k, unroll=self.stages):
            self.mbarrier.wait(self.full_barriers[stage], phase=consumer_phase)
            # the first step overwrites TMEM, which starts with garbage
            self.tcgen05.mma(self.s_a[stage], self.s_b[stage].transpose(), self.t_acc, enable_input_d=offset_k != 0)
            # no wait: the hardware arrives on empty_barriers[stage] once this MMA has finished
            self.tcgen05.commit(mbarrier=self.empty_barriers[stage])
            stage = (stage + 1) % self.stages
            consumer_phase ^= stage == 0

        # flush barrier: one more commit tracks every MMA issued above
        self.tcgen05.commit(mbarrier=self.flush_barrier)

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


KERNELS = support.kernels("v3", blackwell=BlackwellMatmulV3)


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """C = A @ B.T for A (M x K) and B (N x K) on a Blackwell GPU, fp32 accumulation; A, B and C all fp16 or bf16.

    Raises TypeError/ValueError naming the rule for input the kernel cannot take.
    """
    return support.launch(KERNELS, a, b, out)


if __name__ == "__main__":
    sys.exit(support.main("v3", KERNELS, matmul))
