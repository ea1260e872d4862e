"""v3: warp specialisation. A producer warp loads, consumer warpgroups multiply.

In v2 the warps that multiply also load, so a refill waits for a wgmma. v3 gives each job
its own warps, each with its own loop over K. The producer waits until a slot is empty,
announces its bytes on the slot's full barrier and issues the loads. Each consumer waits
until a slot is full, multiplies, and marks the slot empty on its empty barrier. Two
consumer warpgroups split the tile's rows, so it reaches 128 x 256; wait_group(0) after
the loop is the flush that makes the accumulator final.

Constraints as in v1. Run: python matmul_v3.py [--sizes ...] [--check-only] [--compile-only]
Walkthrough: docs/v3.md
"""

import sys

import tilus
import torch
from tilus import DataType, RegisterTensor, float16, float32, int32, uint32, void_p
from tilus.ir.layout.ops.shared_ops import shared_row_major
from tilus.utils import cdiv

import support


# Two consumer warpgroups split the tile's rows; each holds a (block_m / 2) x block_n
# accumulator, at most 128 fp32 registers per thread, so the tile can reach 128 x 256: the
# L2-to-shared bytes per FLOP, (block_m + block_n) / (block_m * block_n), drop by a quarter
# from 128 x 128. block_k = 64 as in v1. stages: a 128 x 256 or 256 x 128 slot is
# 48 KiB and the two output tiles 64 KiB, so 3 fit (208 KiB of the 227 KiB a block may
# have); a 128 x 128 slot is 32 KiB and its output tiles 32 KiB, so up to 6 (224 KiB): the
# deep rings of v2's space, which serve skinny and decode shapes, where few tiles each
# stream a long K.
@tilus.autotune(
    "block_m, block_n, stages",
    [[128, 128, 2], [128, 128, 3], [128, 128, 4], [128, 128, 6], [128, 256, 2], [128, 256, 3], [256, 128, 2],
     [256, 128, 3]],
)
@tilus.autotune("block_k", [64])
class HopperMatmulV3(tilus.Script):
    def __init__(self, block_m: int, block_n: int, block_k: int, stages: int, dtype: DataType = float16):
        super().__init__()
        self.dtype = dtype  # float16 or bfloat16: A, B and C
        self.block_m = block_m
        self.block_n = block_n
        self.block_k = block_k
        self.stages = stages
        self.consumer_m = block_m // 2  # rows of the tile each consumer warpgroup owns

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
        self.attrs.warps = 9  # consumer warpgroups (warps 0-3, 4-7) + producer warp (warp 8)

        # 1. the tile of C this block computes
        offset_m: int32 = self.block_m * self.blockIdx.x
        offset_n: int32 = self.block_n * self.blockIdx.y

        # 2. operands: global views, shared tiles (each consumer holds its own accumulator)
        self.g_a = self.global_view(a_ptr, dtype=self.dtype, shape=[m_size, k_size])
        self.g_b = self.global_view(b_ptr, dtype=self.dtype, shape=[n_size, k_size])
        # A's slot holds one half per consumer; both consumers read the whole B slot
        self.s_a = self.shared_tensor(dtype=self.dtype, shape=[self.stages, 2, self.consumer_m, self.block_k])
        self.s_b = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.block_n, self.block_k])

        # 3. barriers
        self.full_barriers = self.mbarrier.alloc(counts=[1] * self.stages)  # a slot's loads landed
        # every consumer thread arrives once its warpgroup's wgmma has finished reading the slot
        self.empty_barriers = self.mbarrier.alloc(counts=[256] * self.stages)

        # 4. the K loop, one per role: the producer, each consumer
        self.producer(offset_m, offset_n, k_size)
        self.g_c = self.global_view(c_ptr, dtype=self.dtype, shape=[m_size, n_size])
        self.consumer(0, offset_m, offset_n, k_size)
        self.consumer(1, offset_m, offset_n, k_size)

    def producer(self, offset_m: int32, offset_n: int32, k_size: int32):
        """The TMA warp: every K step into the ring, as far ahead as the empty slots allow."""
        with self.thread_group(thread_begin=256, num_threads=32):  # producer: the TMA warp
            self.load_tile(offset_m, offset_n, k_size)

    def load_tile(self, offset_m: int32, offset_n: int32, k_size: int32):
        """The tile's K loop: A in two halves, one per consumer, then B."""
        stage: int32 = 0
        producer_phase: uint32 = self.mbarrier.producer_initial_phase  # 1: every slot starts empty
        for offset_k in self.range(0, k_size, self.block_k, unroll=self.stages):
            self.mbarrier.wait(self.empty_barriers[stage], phase=producer_phase)
            with self.single_thread():
                self.mbarrier.arrive_and_expect_tx(
                    self.full_barriers[stage], transaction_bytes=self.s_a[stage].nbytes + self.s_b[stage].nbytes
                )
            for part in range(2):
                self.tma.global_to_shared(
                    src=self.g_a,
                    dst=self.s_a[stage, part],
                    offsets=[offset_m + part * self.consumer_m, offset_k],
                    mbarrier=self.full_barriers[stage],
                )
            self.tma.global_to_shared(
                src=self.g_b, dst=self.s_b[stage], offsets=[offset_n, offset_k], mbarrier=self.full_barriers[stage]
            )
            stage = (stage + 1) % self.stages
            producer_phase ^= stage == 0

    def consumer(self, warpgroup: int, offset_m: int32, offset_n: int32, k_size: int32):
        """One consumer warpgroup: its half of the tile's rows, the K loop then the epilogue."""
        with self.thread_group(thread_begin=128 * warpgroup, num_threads=128):
            acc = self.mma(warpgroup, k_size)
            self.epilogue(warpgroup, acc, offset_m, offset_n)

    def mma(self, warpgroup: int, k_size: int32):
        """This warpgroup's half of every A slot times the whole B slot, one wgmma group in flight."""
        acc = self.register_tensor(dtype=float32, shape=[self.consumer_m, self.block_n], init=0.0)
        stage: int32 = 0
        consumer_phase: uint32 = self.mbarrier.consumer_initial_phase  # 0: wait for the first load
        previous_stage: int32 = -1
        for offset_k in self.range(0, k_size, self.block_k, unroll=self.stages):
            self.mbarrier.wait(self.full_barriers[stage], phase=consumer_phase)
            self.wgmma.fence()
            self.wgmma.mma(self.s_a[stage, warpgroup], self.s_b[stage].transpose(), acc)
            self.wgmma.commit_group()
            self.wgmma.wait_group(1)  # this step may still run; the previous one has finished
            if previous_stage >= 0:
                # every thread arrives: one per warpgroup would do, but branching to one thread
                # here makes ptxas serialise the wgmmas (C7515, docs/v3.md)
                self.mbarrier.arrive(self.empty_barriers[previous_stage])
            previous_stage = stage
            stage = (stage + 1) % self.stages
            consumer_phase ^= stage == 0
        self.wgmma.wait_group(0)  # Hopper's flush: the accumulator is final only now
        return acc

    def epilogue(self, warpgroup: int, acc: RegisterTensor, offset_m: int32, offset_n: int32):
        """Registers -> shared -> global (TMA), each warpgroup its own rows and its own output tile."""
        s_c = self.shared_tensor(dtype=self.dtype, shape=[self.consumer_m, self.block_n])
        # row-major, unswizzled: one TMA box for the whole tile (a 128-byte swizzle caps a box at 64 columns)
        self.annotate_layout(s_c, shared_row_major(self.consumer_m, self.block_n))
        self.store_shared(s_c, acc.to(self.dtype))
        # generic-proxy stores must be made visible to the async proxy (TMA) before it reads s_c
        self.fence.proxy_async(space="shared")
        self.sync()  # this warpgroup only (a named barrier)
        with self.single_warp():
            self.tma.shared_to_global(
                s_c, self.g_c, offsets=[offset_m + warpgroup * self.consumer_m, offset_n], dims=[0, 1]
            )
            self.tma.commit_group()
            self.tma.wait_group(n=0, read=True)  # s_c must outlive the TMA engine's read of it


KERNELS = support.kernels("v3", hopper=HopperMatmulV3)


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """C = A @ B.T for A (M x K) and B (N x K) on a Hopper GPU, fp32 accumulation.

    A, B and C are all fp16 or all bf16.

    Raises TypeError/ValueError naming the rule for input the kernels cannot take.
    """
    return support.launch(KERNELS, a, b, out)


if __name__ == "__main__":
    sys.exit(support.main("v3", KERNELS, matmul))
