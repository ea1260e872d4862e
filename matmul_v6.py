"""v6: a swizzled output tile, stored by TMA in 64-column boxes without bank conflicts.

v5's output tile is row-major: a row of 256 fp16 is 512 bytes, so the 8 rows an stmatrix
writes at once start in the same bank and collide 8 ways. v6 stores the tile as boxes of
64 columns under TMA's 128-byte swizzle (16-byte chunk c of row r at chunk c ^ r % 8), one
TMA store a box: the 8 rows land in 8 different bank groups. A box may also be 32 columns
(the 64-byte swizzle), which makes a 128 x 224 tile possible: at N = 14336 it gives 64
tile columns where 256 gives 56.

Constraints as in v1. Run: python matmul_v6.py [--sizes ...] [--check-only] [--compile-only]
Walkthrough: docs/v6.md
"""

import sys

import tilus
import torch
from tilus import DataType, RegisterTensor, float16, float32, int32, uint32, void_p
from tilus.ir.layout.shared_layout import Swizzle, shared_layout
from tilus.utils import cdiv

import support
from pipeline import Pipeline
from schedulers import PersistentTileScheduler, persistent_blocks


# v5's tiles, and 128 x 224 for N = 14336: 14336 / 224 = 64 tile columns where 256 gives 56,
# so M = 256 makes 128 tiles for 132 SMs, not 112. No room for a fifth stage: 4 x 44 KiB of
# ring and a 28 KiB output tile are 204 KiB.
@tilus.autotune("block_m, block_n, stages", [[128, 256, 4], [128, 224, 4], [128, 128, 6], [128, 128, 4], [128, 64, 8]])
@tilus.autotune("block_k", [64])
@tilus.autotune("group_m", [8, 16, 32])
class HopperMatmulV6(tilus.Script):
    def __init__(self, block_m: int, block_n: int, block_k: int, stages: int, group_m: int, dtype: DataType = float16):
        super().__init__()
        self.dtype = dtype  # float16 or bfloat16: A, B and C
        self.block_m = block_m
        self.block_n = block_n
        self.block_k = block_k
        self.stages = stages
        self.group_m = group_m
        self.consumer_m = block_m // 2  # rows of the tile each consumer warpgroup owns
        # the output tile's TMA boxes: 64 columns (128 bytes) where they divide the tile, else 32
        self.box_n = 64 if block_n % 64 == 0 else 32

    def __call__(
        self,
        m_size: int32,
        n_size: int32,
        k_size: int32,
        a_ptr: void_p,
        b_ptr: void_p,
        c_ptr: void_p,
        num_sms: int32,
    ):
        num_m = cdiv(m_size, self.block_m)
        num_n = cdiv(n_size, self.block_n)
        self.attrs.blocks = persistent_blocks(num_m * num_n, num_sms, 1)
        self.attrs.warps = 9  # consumer warpgroups (warps 0-3, 4-7) + producer warp (warp 8)

        # 2. operands: global views, shared tiles (each consumer holds its own accumulator)
        self.g_a = self.global_view(a_ptr, dtype=self.dtype, shape=[m_size, k_size])
        self.g_b = self.global_view(b_ptr, dtype=self.dtype, shape=[n_size, k_size])
        self.g_c = self.global_view(c_ptr, dtype=self.dtype, shape=[m_size, n_size])
        # A's slot holds one half per consumer; both consumers read the whole B slot
        self.s_a = self.shared_tensor(dtype=self.dtype, shape=[self.stages, 2, self.consumer_m, self.block_k])
        self.s_b = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.block_n, self.block_k])
        # one output tile for both consumers, in turn, as in v4
        self.s_c = self.output_tile()

        # 3. barriers
        self.pipe = Pipeline(self.stages, consumer_arrivals=256)  # every thread of both consumers arrives
        self.s_c_free = self.mbarrier.alloc(counts=[1, 1])  # s_c is free for warpgroup 0, 1
        self.sync()  # the block starts its roles together, after the barriers are initialised
        # every tile takes whole trips round the ring (TMA fills the steps past K with zeros),
        # so each tile starts at slot 0 and the unrolled loops index slots by constants
        k_trips = cdiv(k_size, self.block_k * self.stages) * (self.block_k * self.stages)
        # 1. the tiles of C this block computes: every gridDim.x-th, in grouped order
        self.scheduler = PersistentTileScheduler(num_m, num_n, num_m * num_n, self.group_m)

        # 4. the K loop of every tile, one per role: the producer, each consumer
        self.producer(k_trips)
        self.consumer(0, k_trips)
        self.consumer(1, k_trips)

    def output_tile(self):
        """s_c in 64-column boxes, each with TMA's 128-byte swizzle: no bank conflicts, a TMA store per box."""
        # row r's 16-byte chunk c sits at chunk c ^ (r % 8), so the 8 rows an stmatrix writes
        # hit 8 different bank groups; a 32-column box (64-byte rows, two to a bank line)
        # takes TMA's 64-byte swizzle, chunk c ^ (r // 2 % 4), conflict free as well
        boxes, box_n = self.block_n // self.box_n, self.box_n
        swizzle = Swizzle(base=3, bits=3, shift=3) if box_n == 64 else Swizzle(base=3, bits=2, shift=3)
        s_c = self.shared_tensor(dtype=self.dtype, shape=[boxes, self.consumer_m, box_n])
        self.annotate_layout(s_c, shared_layout(
            shape=[boxes, self.consumer_m, box_n], mode_shape=[boxes, self.consumer_m, box_n],
            mode_strides=[self.consumer_m * box_n, box_n, 1], optional_swizzle=swizzle,
        ))
        return s_c

    def producer(self, k_trips: int32):
        """The TMA warp: every K step of every tile of this block, as far ahead as the ring allows."""
        with self.thread_group(thread_begin=256, num_threads=32):  # producer: the TMA warp
            self.pipe.producer_start()
            self.load_units(k_trips)

    def load_units(self, k_trips: int32):
        """Tile after tile with nothing in between: the next tile's loads overlap the last one's epilogue."""
        for unit in self.scheduler.units():
            tile_m, tile_n = self.scheduler.tile(unit)
            self.load_tile(tile_m, tile_n, k_trips)

    def load_tile(self, tile_m: int32, tile_n: int32, k_trips: int32):
        """The tile's K loop, whole trips round the ring: A in two halves, one per consumer, then B."""
        self.pipe.producer_start_trips()
        for offset_k in self.range(0, k_trips, self.block_k, unroll=self.stages):
            self.pipe.producer_acquire(transaction_bytes=self.s_a[0].nbytes + self.s_b[0].nbytes)
            for part in range(2):
                self.tma.global_to_shared(
                    src=self.g_a,
                    dst=self.s_a[self.pipe.producer_stage, part],
                    offsets=[self.block_m * tile_m + part * self.consumer_m, offset_k],
                    mbarrier=self.pipe.producer_barrier(),
                )
            self.tma.global_to_shared(
                src=self.g_b,
                dst=self.s_b[self.pipe.producer_stage],
                offsets=[self.block_n * tile_n, offset_k],
                mbarrier=self.pipe.producer_barrier(),
            )
            self.pipe.producer_advance()

    def consumer(self, warpgroup: int, k_trips: int32):
        """One consumer warpgroup: its rows of every tile, the K loop then the epilogue."""
        with self.thread_group(thread_begin=128 * warpgroup, num_threads=128):
            self.pipe.consumer_start()
            c_phase: uint32 = 1 - warpgroup  # warpgroup 0 writes s_c first
            for unit in self.scheduler.units():
                tile_m, tile_n = self.scheduler.tile(unit)
                acc = self.mma(warpgroup, k_trips)

                # 5. epilogue: the two consumers take turns with s_c
                self.mbarrier.wait(self.s_c_free[warpgroup], phase=c_phase)
                c_phase ^= 1
                self.epilogue(warpgroup, acc, tile_m, tile_n)

    def mma(self, warpgroup: int, k_trips: int32):
        """This warpgroup's rows of one tile, whole trips round the ring, into a fresh accumulator."""
        acc = self.register_tensor(dtype=float32, shape=[self.consumer_m, self.block_n], init=0.0)
        self.pipe.consumer_start_trips()
        for offset_k in self.range(0, k_trips, self.block_k, unroll=self.stages):
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
        # Hopper's flush: the accumulator is final only now, and the tile's last slot is free
        # (the producer loads the next tile into it)
        self.wgmma.wait_group(0)
        self.pipe.consumer_release_previous()
        return acc

    def epilogue(self, warpgroup: int, acc: RegisterTensor, tile_m: int32, tile_n: int32):
        """Registers -> the swizzled s_c -> global, one TMA store per box; then s_c is the other's."""
        offset_m = self.block_m * tile_m + warpgroup * self.consumer_m
        offset_n = self.block_n * tile_n
        # the boxes seen as one consumer_m x block_n tile: the store is v5's
        s_c_rows = self.reshape_shared(self.s_c.permute([1, 0, 2]), [self.consumer_m, self.block_n])
        self.store_shared(s_c_rows, acc.to(self.dtype))
        # generic-proxy stores must be made visible to the async proxy (TMA) before it reads s_c
        self.fence.proxy_async(space="shared")
        self.sync()  # this warpgroup only (a named barrier)
        with self.single_warp():
            for box in range(self.block_n // self.box_n):
                self.tma.shared_to_global(
                    self.s_c[box], self.g_c, offsets=[offset_m, offset_n + box * self.box_n], dims=[0, 1]
                )
            self.tma.commit_group()
            self.tma.wait_group(n=0, read=True)  # the TMA engine has read s_c: the next writer may go
            with self.single_thread():
                self.release_s_c(warpgroup)

    def release_s_c(self, warpgroup: int):
        """Hand s_c to the other warpgroup; this one goes on to its next tile at once."""
        self.mbarrier.arrive(self.s_c_free[1 - warpgroup])


KERNELS = support.kernels("v6", hopper=HopperMatmulV6)


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """C = A @ B.T for A (M x K) and B (N x K) on a Hopper GPU, fp32 accumulation.

    A, B and C are all fp16 or all bf16.

    Raises TypeError/ValueError naming the rule for input the kernels cannot take.
    """
    return support.launch(KERNELS, a, b, out)


if __name__ == "__main__":
    sys.exit(support.main("v6", KERNELS, matmul))
