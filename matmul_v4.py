"""v4: the ring becomes a Pipeline class, and blocks visit tiles in groups that share L2.

Three changes from v3:

1. pipeline.py. The barrier pairs, each side's stage index and phase, and the flip on
   wrap move into ``Pipeline``; each side reads as what it does (``producer_acquire``,
   loads, ``producer_advance``; ``consumer_acquire``, MMA, ``consumer_release_*``,
   ``consumer_advance``). Hopper frees the slot of the step before once ``wait_group(1)``
   proves its wgmma done, every consumer thread arriving as in v3; Blackwell hands the
   slot to the tensor core (a tcgen05.commit). Each role starts its own cursor where its
   loop begins (``producer_start``, ``consumer_start``): the loop is unrolled ``stages``
   times, and a cursor known to be 0 there makes every slot index a constant.

2. Grouped tile order. v3's 2-D grid starts blocks tile row first: at 8192^3 (64 x 32
   tiles of 128 x 256) the 132 blocks in flight span all 64 tile rows, so each wave reads
   all of A (128 MiB) from HBM again. v4 launches one dimension, and ``grouped_tile``
   (``GroupedTileOrder`` in schedulers.py) maps block i to a tile so that the blocks in
   flight cover group_m tile rows: with 16, a wave touches 16 x 128 x 8192 x 2 B = 32 MiB
   of A and ceil(132 / 16) = 9 tile columns, 36 MiB, of B (docs/raster.py's model).

3. A tile space for every shape class (Hopper):
   - 128 x 256 with 4 stages: a step is 2 consumers x 4 wgmma m64n256k16 = 1024
     tensor-core cycles, 0.56 us at 1.83 GHz, so 4 stages give a load 3 steps, 1.7 us.
     The two consumers share one 32 KiB output tile in turns (``s_c_free``) to make
     room: 4 x 48 + 32 = 224 KiB of the 227 a block may have.
   - 128 x 64 with 8 stages for skinny shapes: at M = 128, N = 8192 it makes 128 blocks
     where 128 x 256 makes 32; 8 x 24 + 8 = 200 KiB.
   - v3's 128 x 128 with 6 and 4 stages and 128 x 256 with 3.
   - group_m 8, 16 or 32: the best patch depends on the shape.

What remains: each block ends by storing its tile and waiting for the TMA engine to read
it before the next block starts on that SM; at 4096^3 (512 tiles, 3 x 132 + 116) most SMs
pay that four times. v5 keeps blocks resident over many tiles.

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
from tcgen05_fences import after_thread_sync, before_thread_sync


# block_m = 128: the tcgen05.mma shape for one CTA; block_n up to 256 (TMEM columns used).
# block_k = 64 x 2 B = 128 B, the widest row TMA's 128-byte swizzle allows.
# stages: 2..4 slots; 4 x 48 KiB is the most the 128 x 256 tile fits.
# group_m: tile rows visited together, as on Hopper (not measured: no Blackwell GPU).
@tilus.autotune("block_m, block_n, e_block_n", [[128, 64, 32], [128, 128, 32], [128, 256, 32]])
@tilus.autotune("block_k", [64])
@tilus.autotune("stages", [2, 3, 4])
@tilus.autotune("group_m", [8, 16])
class BlackwellMatmulV4(GroupedTileOrder, tilus.Script):
    def __init__(
        self,
        block_m: int,
        block_n: int,
        block_k: int,
        e_block_n: int,
        stages: int,
        group_m: int,
        dtype: DataType = float16,
    ):
        super().__init__()
        self.dtype = dtype  # float16 or bfloat16: A, B and C
        self.block_m = block_m
        self.block_n = block_n
        self.block_k = block_k
        self.e_block_n = e_block_n
        self.stages = stages
        self.group_m = group_m

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
        self.attrs.warps = 4  # 128 threads: one per TMEM lane (row) for the epilogue

        # 1. the tile of C this block computes
        tile_m, tile_n = self.grouped_tile(self.blockIdx.x, num_m, num_n)
        offset_m: int32 = self.block_m * tile_m
        offset_n: int32 = self.block_n * tile_n

        # 2. operands: global views, shared tiles, the accumulator
        self.g_a = self.global_view(a_ptr, dtype=self.dtype, shape=[m_size, k_size])
        self.g_b = self.global_view(b_ptr, dtype=self.dtype, shape=[n_size, k_size])
        self.s_a = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.block_m, self.block_k])
        self.s_b = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.block_n, self.block_k])
        self.t_acc = self.tcgen05.alloc(dtype=float32, shape=[self.block_m, self.block_n])

        # 3. barriers
        self.pipe = Pipeline(self.stages, consumer_arrivals=1)  # the tensor core arrives once per slot
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
        self.pipe.producer_start()
        for offset_k in self.range(0, k_size, self.block_k, unroll=self.stages):
            self.pipe.producer_acquire(transaction_bytes=self.s_a[0].nbytes + self.s_b[0].nbytes)
            self.tma.global_to_shared(
                src=self.g_a,
                dst=self.s_a[self.pipe.producer_stage],
                offsets=[offset_m, offset_k],
                mbarrier=self.pipe.producer_barrier(),
            )
            self.tma.global_to_shared(
                src=self.g_b,
                dst=self.s_b[self.pipe.producer_stage],
                offsets=[offset_n, offset_k],
                mbarrier=self.pipe.producer_barrier(),
            )
            self.pipe.producer_advance()

    def mma(self, k_size: int32):
        """The MMA warp, the ring's consumer: one tcgen05.mma per K step into TMEM, none waited for."""
        self.pipe.consumer_start()
        for offset_k in self.range(0, k_size, self.block_k, unroll=self.stages):
            self.pipe.consumer_acquire()
            # the first step overwrites TMEM, which starts with garbage
            self.tcgen05.mma(
                self.s_a[self.pipe.consumer_stage],
                self.s_b[self.pipe.consumer_stage].transpose(),
                self.t_acc,
                enable_input_d=offset_k != 0,
            )
            # no wait: the hardware arrives on the slot's empty barrier once this MMA has finished
            self.pipe.consumer_release_async()
            self.pipe.consumer_advance()

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


# Two consumer warpgroups split the tile's rows, as in v3. 128 x 256 with 4 stages: 4 x 48
# KiB of ring and one 32 KiB output tile the consumers take turns with (224 KiB of 227).
# 128 x 64 with 8 stages (8 x 24 + 8 = 200 KiB): four times the blocks for skinny shapes,
# each with up to 192 KiB of loads in flight. 128 x 128 with 6 stages (6 x 32 + 16 =
# 208 KiB): v3's deep-ring schedule, which serves skinny and decode shapes where 128 x 256
# tiles make less than a wave and 128 x 64 ones load A four times. v3's shallower rings
# stay beside them, 128 x 256 with 3 stages (176 KiB) and 128 x 128 with 4 (144 KiB): no
# one depth is best at every shape. block_k = 64 as on Blackwell.
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


KERNELS = {"blackwell": BlackwellMatmulV4, "hopper": HopperMatmulV4}


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """C = A @ B.T for A (M x K) and B (N x K) on a Hopper or Blackwell GPU, fp32 accumulation.

    A, B and C are all fp16 or all bf16.

    Raises TypeError/ValueError naming the rule for input the kernels cannot take.
    """
    return support.launch(KERNELS, a, b, out)


if __name__ == "__main__":
    sys.exit(support.main("v4", KERNELS, matmul))
