"""Blackwell v8: stream-K, with a fix-up that gives the same bits every run, and an exact K tail.

The Blackwell kernel of matmul_v8.py's idea, on Blackwell v5: the last waves' tiles are cut
along K into equal ranges, one per SM (schedulers.StreamKTileScheduler); a piece that ends
before its tile's last K block leaves its sum in a workspace, and the tile's owner adds them.
Built for sm_100a and protocol-checked in CI (tests/test_protocol.py), never run: there was no
Blackwell GPU. docs/blackwell.md says what it changes against the Hopper page of the same idea.

Run: python blackwell/matmul_v8.py [--sizes ...] [--check-only] [--compile-only]
"""

import sys

import tilus
import torch
from tilus import DataType, RegisterTensor, float16, float32, int32, uint32, void_p
from tilus.utils import cdiv

import support
from blackwell.tcgen05_fences import after_thread_sync, before_thread_sync
from pipeline import Pipeline
from schedulers import MAX_SHARERS, StreamKTileScheduler, launch_blocks


# Blackwell v5's tiles at its deepest ring, four stages, on the stream-K scheduler, with the
# exact K tail; stream_k on or off per schedule, the tuner picks. group_m 8, as on Hopper.
@tilus.autotune("block_m, block_n, e_block_n", [[128, 64, 32], [128, 128, 32], [128, 256, 32]])
@tilus.autotune("block_k", [64])
@tilus.autotune("stages", [4])
@tilus.autotune("group_m", [8])
@tilus.autotune("stream_k", [False, True])
class BlackwellMatmulV8(tilus.Script):
    def __init__(
        self,
        block_m: int,
        block_n: int,
        block_k: int,
        e_block_n: int,
        stages: int,
        group_m: int,
        stream_k: bool,
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
        self.stream_k = stream_k

    def __call__(
        self,
        m_size: int32,
        n_size: int32,
        k_size: int32,
        a_ptr: void_p,
        b_ptr: void_p,
        c_ptr: void_p,
        num_sms: int32,
        flags_ptr: void_p,
        partials_ptr: void_p,
    ):
        # 2. operands: global views, shared tiles, the accumulator; the stream-K workspace (a
        # ready flag and a partial tile per CTA)
        self.g_a = self.global_view(a_ptr, dtype=self.dtype, shape=[m_size, k_size])
        self.g_b = self.global_view(b_ptr, dtype=self.dtype, shape=[n_size, k_size])
        self.g_c = self.global_view(c_ptr, dtype=self.dtype, shape=[m_size, n_size])
        num_m = cdiv(m_size, self.block_m)
        num_n = cdiv(n_size, self.block_n)
        self.attrs.blocks = launch_blocks(num_m * num_n, num_sms, 1, self.stream_k)
        self.attrs.warps = 4  # 128 threads: one per TMEM lane (row) for the epilogue
        self.g_flags = self.global_view(flags_ptr, dtype=int32, shape=[num_sms])
        self.g_partials = self.global_view(partials_ptr, dtype=float32, shape=[num_sms * self.block_m, self.block_n])
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
        # 1. this block's pieces of work: whole tiles, then a stream-K range of K blocks
        self.scheduler = StreamKTileScheduler(
            num_m, num_n, num_m * num_n, cdiv(k_size, self.block_k), self.group_m, 1, 0, self.stream_k
        )
        for item in self.scheduler.items():
            tile_m, tile_n, k_begin, k_end = self.scheduler.work(item)

            # 4. the K loop, one per role; the ring's cursors run on from piece to piece
            with self.thread_group(thread_begin=0, num_threads=32):  # producer: the TMA warp
                self.producer(tile_m, tile_n, k_begin, k_end)
            with self.thread_group(thread_begin=32, num_threads=32):  # consumer: the MMA warp
                self.mma(k_begin, k_end)
                self.mbarrier.wait(self.flush_barrier, phase=flush_phase)  # every MMA has finished: TMEM holds the piece
            flush_phase ^= 1
            self.sync()  # all four warps end the piece: the producer loads the next one only after
            after_thread_sync()  # the MMAs (the flush wait, then this sync) before any warp reads TMEM

            # 5. the piece's end: a partial to the workspace, or the tile (with the partials added) to C
            if self.stream_k:
                self.end_piece(tile_m, tile_n, k_begin, k_end)
            else:
                self.epilogue(tile_m, tile_n)

        after_thread_sync()  # every warp's reads of TMEM before it is freed
        self.tcgen05.dealloc(self.t_acc)

    def producer(self, tile_m: int32, tile_n: int32, k_begin: int32, k_end: int32):
        """The TMA warp: K blocks k_begin to k_end of the tile into the ring, the last one partial if K ends in it."""
        for k_block in self.range(k_begin, k_end, 1):
            offset_k = k_block * self.block_k
            self.pipe.producer_acquire(transaction_bytes=self.s_a[0].nbytes + self.s_b[0].nbytes)
            self.tma.global_to_shared(
                src=self.g_a,
                dst=self.s_a[self.pipe.producer_stage],
                offsets=[self.block_m * tile_m, offset_k],
                mbarrier=self.pipe.producer_barrier(),
            )
            self.tma.global_to_shared(
                src=self.g_b,
                dst=self.s_b[self.pipe.producer_stage],
                offsets=[self.block_n * tile_n, offset_k],
                mbarrier=self.pipe.producer_barrier(),
            )
            self.pipe.producer_advance()

    def mma(self, k_begin: int32, k_end: int32):
        """The MMA warp, the ring's consumer: one tcgen05.mma per K block into TMEM, none waited for."""
        after_thread_sync()  # the last tile's reads of TMEM (before a block sync) before this tile overwrites it
        for k_block in self.range(k_begin, k_end, 1):
            self.pipe.consumer_acquire()
            # the piece's first MMA overwrites TMEM, which holds the last piece
            self.tcgen05.mma(
                self.s_a[self.pipe.consumer_stage],
                self.s_b[self.pipe.consumer_stage].transpose(),
                self.t_acc,
                enable_input_d=k_block != k_begin,
            )
            # no wait: the hardware arrives on the slot's empty barrier once this MMA has finished
            self.pipe.consumer_release_async()
            self.pipe.consumer_advance()

        # flush barrier: one more commit tracks every MMA issued above
        self.tcgen05.commit(mbarrier=self.flush_barrier)

    def load_slice(self, e_offset_n: int32):
        """e_block_n columns of the accumulator, TMEM -> registers."""
        t_acc_slice = self.tcgen05.slice(
            self.t_acc, offsets=[0, e_offset_n], shape=[self.block_m, self.e_block_n], dims=[0, 1]
        )
        r_acc = self.tcgen05.load(t_acc_slice)
        self.tcgen05.wait_load()
        before_thread_sync()  # these reads of TMEM happen before the next thread sync
        return r_acc

    def epilogue(self, tile_m: int32, tile_n: int32):
        """TMEM -> registers -> shared -> global (TMA), e_block_n columns at a time, by all 4 warps."""
        for e_offset_n in range(0, self.block_n, self.e_block_n):
            self.store_slice(self.load_slice(e_offset_n).to(self.dtype), tile_m, tile_n, e_offset_n)

    def end_piece(self, tile_m: int32, tile_n: int32, k_begin: int32, k_end: int32):
        """A stream-K piece's end, as on Hopper: its sum to the workspace, or the tile with the sharers' sums to C."""
        if k_end < self.scheduler.k_blocks:
            for e_offset_n in range(0, self.block_n, self.e_block_n):
                self.store_global(self.g_partials, self.load_slice(e_offset_n),
                                  offsets=[self.blockIdx.x * self.block_m, e_offset_n])
            self.sync()  # every thread's stores happen before the release below
            self.release_semaphore(self.g_flags[self.blockIdx.x].item_ptr(), 1)
        else:
            first = self.scheduler.first_sharer()
            if k_begin > 0:
                self.wait_for_sharers(first)
            for e_offset_n in range(0, self.block_n, self.e_block_n):
                r_acc = self.load_slice(e_offset_n)
                if k_begin > 0:
                    self.add_partials(r_acc, first, e_offset_n)
                self.store_slice(r_acc.to(self.dtype), tile_m, tile_n, e_offset_n)
            if k_begin > 0:
                self.reset_flags(first)

    def wait_for_sharers(self, first: int32):
        """The owner's fix-up, 1: wait until every lower sharer of the tile has left its sum."""
        for sharer in range(MAX_SHARERS):
            if first + sharer < self.scheduler.worker:
                self.lock_semaphore(self.g_flags[first + sharer].item_ptr(), 1)

    def add_partials(self, r_acc: RegisterTensor, first: int32, e_offset_n: int32):
        """2: add their sums of these columns, lowest worker first (a fixed order: the same bits every run)."""
        for sharer in range(MAX_SHARERS):
            if first + sharer < self.scheduler.worker:
                partial = self.load_global(self.g_partials, offsets=[(first + sharer) * self.block_m, e_offset_n],
                                           shape=[self.block_m, self.e_block_n])
                self.add(r_acc, partial, out=r_acc)

    def reset_flags(self, first: int32):
        """3: their flags back to 0 for the next launch."""
        for sharer in range(MAX_SHARERS):
            if first + sharer < self.scheduler.worker:
                self.release_semaphore(self.g_flags[first + sharer].item_ptr(), 0)

    def store_slice(self, r_c: RegisterTensor, tile_m: int32, tile_n: int32, e_offset_n: int32):
        """e_block_n columns of the tile to C through s_c and one TMA store."""
        self.store_shared(self.s_c, r_c)
        self.write_s_c(self.block_m * tile_m, self.block_n * tile_n + e_offset_n)

    def write_s_c(self, offset_m: int32, offset_n: int32):
        """s_c to C at (offset_m, offset_n) by one TMA store, from one warp; s_c may be rewritten after."""
        # generic-proxy stores must be made visible to the async proxy (TMA) before it reads s_c
        self.fence.proxy_async(space="shared")
        self.sync()
        with self.single_warp():
            self.tma.shared_to_global(self.s_c, self.g_c, offsets=[offset_m, offset_n], dims=[0, 1])
            self.tma.commit_group()
            self.tma.wait_group(n=0, read=True)  # s_c is rewritten next iteration
        self.sync()


KERNELS = support.kernels("v8", blackwell=BlackwellMatmulV8)


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """C = A @ B.T for A (M x K) and B (N x K) on a Blackwell GPU, fp32 accumulation; A, B and C all fp16 or bf16.

    Raises TypeError/ValueError naming the rule for input the kernel cannot take.
    """
    return support.launch(KERNELS, a, b, out)


if __name__ == "__main__":
    sys.exit(support.main("v8", KERNELS, matmul))
