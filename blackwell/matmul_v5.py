"""Blackwell v5: persistent blocks, one per SM, each walking the grouped tile order.

The Blackwell kernel of matmul_v5.py's idea, without its overlapped epilogue: all four warps
store each tile after a block-wide sync that also holds the producer.
Built for sm_100a and protocol-checked in CI (tests/test_protocol.py), never run: there was no
Blackwell GPU. docs/blackwell.md says what it changes against the Hopper page of the same idea.

Run: python blackwell/matmul_v5.py [--sizes ...] [--check-only] [--compile-only]
"""

import sys

import tilus
import torch
from tilus import DataType, float16, float32, int32, uint32, void_p
from tilus.utils import cdiv

import support
from blackwell.tcgen05_fences import after_thread_sync, before_thread_sync
from pipeline import Pipeline
from schedulers import GroupedTileOrder, persistent_blocks


# v4's Blackwell kernel made persistent, and nothing else. Its epilogue is not overlapped:
# all four warps store each tile (one TMEM lane per thread), after a block-wide sync that
# also holds the producer, so the next tile's loads wait for the store. An epilogue
# overlapped through a second TMEM accumulator, and clusters (cta_group 2), are the
# Blackwell counterparts of Hopper's v5 and v7, left for a GPU to measure them on. The
# space is v4's.
@tilus.autotune("block_m, block_n, e_block_n", [[128, 64, 32], [128, 128, 32], [128, 256, 32]])
@tilus.autotune("block_k", [64])
@tilus.autotune("stages", [2, 3, 4])
@tilus.autotune("group_m", [8, 16])
class BlackwellMatmulV5(GroupedTileOrder, tilus.Script):
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
        num_sms: int32,
    ):
        num_m = cdiv(m_size, self.block_m)
        num_n = cdiv(n_size, self.block_n)
        self.attrs.blocks = persistent_blocks(num_m * num_n, num_sms, 1)
        self.attrs.warps = 4  # 128 threads: one per TMEM lane (row) for the epilogue

        # 2. operands: global views, shared tiles, the accumulator
        self.g_a = self.global_view(a_ptr, dtype=self.dtype, shape=[m_size, k_size])
        self.g_b = self.global_view(b_ptr, dtype=self.dtype, shape=[n_size, k_size])
        self.g_c = self.global_view(c_ptr, dtype=self.dtype, shape=[m_size, n_size])
        self.s_a = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.block_m, self.block_k])
        self.s_b = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.block_n, self.block_k])
        self.s_c = self.shared_tensor(dtype=self.dtype, shape=[self.block_m, self.e_block_n])
        self.t_acc = self.tcgen05.alloc(dtype=float32, shape=[self.block_m, self.block_n])

        # 3. barriers
        self.pipe = Pipeline(self.stages, consumer_arrivals=1)  # the tensor core arrives once per slot
        self.flush_barrier = self.mbarrier.alloc(counts=[1])
        self.sync()
        self.pipe.producer_start()
        self.pipe.consumer_start()
        flush_phase: uint32 = 0
        # every tile takes whole trips round the ring, as on Hopper
        k_trips = cdiv(k_size, self.block_k * self.stages) * (self.block_k * self.stages)

        # 1. the tiles of C this block computes: every gridDim.x-th, in the grouped order
        for tile in self.range(self.blockIdx.x, num_m * num_n, self.gridDim.x):
            tile_m, tile_n = self.grouped_tile(tile, num_m, num_n)
            offset_m: int32 = self.block_m * tile_m
            offset_n: int32 = self.block_n * tile_n

            # 4. the K loop, one per role; the ring's cursors run on from tile to tile
            with self.thread_group(thread_begin=0, num_threads=32):  # producer: the TMA warp
                self.producer(offset_m, offset_n, k_trips)
            with self.thread_group(thread_begin=32, num_threads=32):  # consumer: the MMA warp
                self.mma(k_trips)
                self.mbarrier.wait(self.flush_barrier, phase=flush_phase)  # every MMA has finished: TMEM holds the tile
            flush_phase ^= 1
            self.sync()  # all four warps store the tile: the producer loads the next one only after

            # 5. epilogue
            self.epilogue(offset_m, offset_n)

        after_thread_sync()  # every warp's reads of TMEM before it is freed
        self.tcgen05.dealloc(self.t_acc)

    def producer(self, offset_m: int32, offset_n: int32, k_trips: int32):
        """The TMA warp: every K step of the tile into the ring, as far ahead as the empty slots allow."""
        self.pipe.producer_start_trips()
        for offset_k in self.range(0, k_trips, self.block_k, unroll=self.stages):
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

    def mma(self, k_trips: int32):
        """The MMA warp, the ring's consumer: one tcgen05.mma per K step into TMEM, none waited for."""
        after_thread_sync()  # the last tile's reads of TMEM (before a block sync) before this tile overwrites it
        self.pipe.consumer_start_trips()
        for offset_k in self.range(0, k_trips, self.block_k, unroll=self.stages):
            self.pipe.consumer_acquire()
            # the first step overwrites TMEM, which holds the last tile
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


KERNELS = support.kernels("v5", blackwell=BlackwellMatmulV5)


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """C = A @ B.T for A (M x K) and B (N x K) on a Blackwell GPU, fp32 accumulation; A, B and C all fp16 or bf16.

    Raises TypeError/ValueError naming the rule for input the kernel cannot take.
    """
    return support.launch(KERNELS, a, b, out)


if __name__ == "__main__":
    sys.exit(support.main("v5", KERNELS, matmul))
