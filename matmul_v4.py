"""v4: the ring becomes a Pipeline class, and blocks visit tiles in groups that share L2.

v3's 2-D grid starts blocks a tile row at a time: at 8192^3 the 132 blocks in flight span
every tile row, so each wave reads all of A from memory again. v4 launches a 1-D grid, and
grouped_tile (schedulers.py) maps block i to a tile so that the blocks in flight cover
group_m tile rows and share their A and B tiles in L2. The ring's barriers, stages and
phases move into Pipeline (pipeline.py), so each role reads as what it does.

Constraints as in v1. Run: python matmul_v4.py [--sizes ...] [--check-only] [--compile-only]
Walkthrough: docs/v4.md
"""

import sys

import tilus
import torch
from tilus import DataType, RegisterTensor, float16, float32, int32, void_p
from tilus.ir.layout.ops.shared_ops import shared_row_major
from tilus.utils import cdiv

import support
from pipeline import Pipeline
from schedulers import GroupedTileOrder


# Two consumer warpgroups split the tile's rows, as in v3. 128 x 256 with 4 stages: 4 x 48
# KiB of ring and one 32 KiB output tile the consumers take turns with (224 KiB of 227).
# 128 x 64 with 8 stages (8 x 24 + 8 = 200 KiB): four times the blocks for skinny shapes,
# each with up to 192 KiB of loads in flight. 128 x 128 with 6 stages (6 x 32 + 16 =
# 208 KiB): v3's deep-ring schedule, which serves skinny and decode shapes where 128 x 256
# tiles make less than a wave and 128 x 64 ones load A four times. v3's shallower rings
# stay beside them, 128 x 256 with 3 stages (176 KiB) and 128 x 128 with 4 (144 KiB): no
# one depth is best at every shape. block_k = 64 as in v1.
# group_m: the height of the patch of tiles in flight; the best one depends on the shape
# (see the docstring).
@tilus.autotune("block_m, block_n, stages",
                [[128, 256, 4], [128, 256, 3], [128, 128, 6], [128, 128, 4], [128, 64, 8]])
@tilus.autotune("block_k", [64])
@tilus.autotune("group_m", [8, 16, 32])
class HopperMatmulV4(GroupedTileOrder, tilus.Script):
    def __init__(self, block_m: int, block_n: int, block_k: int, stages: int, group_m: int, dtype: DataType = float16):
        super().__init__()
        self.dtype = dtype  # float16 or bfloat16: A, B and C
        self.block_m = block_m
        self.block_n = block_n
        self.block_k = block_k
        self.stages = stages
        self.group_m = group_m
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
        num_m = cdiv(m_size, self.block_m)
        num_n = cdiv(n_size, self.block_n)
        self.attrs.blocks = num_m * num_n  # one dimension: grouped_tile picks the tile
        self.attrs.warps = 9  # consumer warpgroups (warps 0-3, 4-7) + producer warp (warp 8)

        # 1. the tile of C this block computes
        tile_m, tile_n = self.grouped_tile(self.blockIdx.x, num_m, num_n)
        offset_m: int32 = self.block_m * tile_m
        offset_n: int32 = self.block_n * tile_n

        # 2. operands: global views, shared tiles (each consumer holds its own accumulator)
        self.g_a = self.global_view(a_ptr, dtype=self.dtype, shape=[m_size, k_size])
        self.g_b = self.global_view(b_ptr, dtype=self.dtype, shape=[n_size, k_size])
        # A's slot holds one half per consumer; both consumers read the whole B slot
        self.s_a = self.shared_tensor(dtype=self.dtype, shape=[self.stages, 2, self.consumer_m, self.block_k])
        self.s_b = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.block_n, self.block_k])

        # 3. barriers
        self.pipe = Pipeline(self.stages, consumer_arrivals=256)  # every thread of both consumers arrives

        # 4. the K loop, one per role: the producer, each consumer
        self.producer(offset_m, offset_n, k_size)
        self.g_c = self.global_view(c_ptr, dtype=self.dtype, shape=[m_size, n_size])
        # one output tile for both consumers, in turn: its 32 KiB pay for the ring's fourth slot
        self.s_c = self.shared_tensor(dtype=self.dtype, shape=[self.consumer_m, self.block_n])
        # row-major, unswizzled: one TMA box for the whole tile (a 128-byte swizzle caps a box at 64 columns)
        self.annotate_layout(self.s_c, shared_row_major(self.consumer_m, self.block_n))
        self.s_c_free = self.mbarrier.alloc(counts=[1])  # warpgroup 0's rows have left s_c
        self.consumer(0, offset_m, offset_n, k_size)
        self.consumer(1, offset_m, offset_n, k_size)

    def producer(self, offset_m: int32, offset_n: int32, k_size: int32):
        """The TMA warp: every K step into the ring, as far ahead as the empty slots allow."""
        with self.thread_group(thread_begin=256, num_threads=32):  # producer: the TMA warp
            self.pipe.producer_start()
            self.load_tile(offset_m, offset_n, k_size)

    def load_tile(self, offset_m: int32, offset_n: int32, k_size: int32):
        """The tile's K loop: A in two halves, one per consumer, then B."""
        for offset_k in self.range(0, k_size, self.block_k, unroll=self.stages):
            self.pipe.producer_acquire(transaction_bytes=self.s_a[0].nbytes + self.s_b[0].nbytes)
            for part in range(2):
                self.tma.global_to_shared(
                    src=self.g_a,
                    dst=self.s_a[self.pipe.producer_stage, part],
                    offsets=[offset_m + part * self.consumer_m, offset_k],
                    mbarrier=self.pipe.producer_barrier(),
                )
            self.tma.global_to_shared(
                src=self.g_b,
                dst=self.s_b[self.pipe.producer_stage],
                offsets=[offset_n, offset_k],
                mbarrier=self.pipe.producer_barrier(),
            )
            self.pipe.producer_advance()

    def consumer(self, warpgroup: int, offset_m: int32, offset_n: int32, k_size: int32):
        """One consumer warpgroup: its half of the tile's rows, the K loop then the epilogue."""
        with self.thread_group(thread_begin=128 * warpgroup, num_threads=128):
            acc = self.mma(warpgroup, k_size)
            self.epilogue(warpgroup, acc, offset_m, offset_n)

    def mma(self, warpgroup: int, k_size: int32):
        """This warpgroup's half of every A slot times the whole B slot, one wgmma group in flight."""
        acc = self.register_tensor(dtype=float32, shape=[self.consumer_m, self.block_n], init=0.0)
        self.pipe.consumer_start()
        for offset_k in self.range(0, k_size, self.block_k, unroll=self.stages):
            self.pipe.consumer_acquire()
            self.wgmma.fence()
            self.wgmma.mma(
                self.s_a[self.pipe.consumer_stage, warpgroup], self.s_b[self.pipe.consumer_stage].transpose(), acc
            )
            self.wgmma.commit_group()
            self.wgmma.wait_group(1)  # this step may still run; the previous one has finished
            if offset_k > 0:
                self.pipe.consumer_release_previous()
            self.pipe.consumer_advance()
        # Hopper's flush: the accumulator is final only now. The last slot is never
        # released: the producer has nothing more to load into it.
        self.wgmma.wait_group(0)
        return acc

    def epilogue(self, warpgroup: int, acc: RegisterTensor, offset_m: int32, offset_n: int32):
        """Registers -> shared -> global (TMA). The consumers take turns with one output tile:
        warpgroup 1 waits until the TMA engine has read warpgroup 0's rows."""
        if warpgroup == 1:
            self.mbarrier.wait(self.s_c_free, phase=0)
        self.store_shared(self.s_c, acc.to(self.dtype))
        # generic-proxy stores must be made visible to the async proxy (TMA) before it reads s_c
        self.fence.proxy_async(space="shared")
        self.sync()  # this warpgroup only (a named barrier)
        with self.single_warp():
            self.tma.shared_to_global(
                self.s_c, self.g_c, offsets=[offset_m + warpgroup * self.consumer_m, offset_n], dims=[0, 1]
            )
            self.tma.commit_group()
            self.tma.wait_group(n=0, read=True)  # s_c must outlive the TMA engine's read of it
            if warpgroup == 0:
                with self.single_thread():
                    self.mbarrier.arrive(self.s_c_free)


KERNELS = support.kernels("v4", hopper=HopperMatmulV4)


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """C = A @ B.T for A (M x K) and B (N x K) on a Hopper GPU, fp32 accumulation.

    A, B and C are all fp16 or all bf16.

    Raises TypeError/ValueError naming the rule for input the kernels cannot take.
    """
    return support.launch(KERNELS, a, b, out)


if __name__ == "__main__":
    sys.exit(support.main("v4", KERNELS, matmul))
