"""Blackwell v11: fp8 block-wise scales, each K block's partial promoted into an fp32 sum in TMEM.

The Blackwell kernel of matmul_v11.py's idea, on Blackwell v10: the MMA warp fills a ring of
two TMEM partials, one per K block; four warps scale each and add it into the running sum.
Built for sm_100a and protocol-checked in CI (tests/test_protocol.py), never run: there was no
Blackwell GPU. docs/blackwell.md says what it changes against the Hopper page of the same idea.

Run: python blackwell/matmul_v11.py [--sizes ...] [--check-only] [--compile-only]
"""

import sys

import tilus
import torch
from tilus import DataType, RegisterTensor, bfloat16, float8_e4m3, float32, int32, uint32, void_p
from tilus.utils import cdiv

import support
from support import scaled
from blackwell.tcgen05_fences import after_thread_sync, before_thread_sync
from pipeline import Pipeline
from schedulers import MAX_SHARERS, StreamKTileScheduler, launch_blocks

# columns of an operand's TMA box: 128 B of fp8, the widest the 128-byte swizzle takes, and the
# length of a block-wise scale's K block
BOX_K = 128


# Blackwell v9's kernel and tiles in bytes (tcgen05.mma kind::f8f6f4 takes e4m3 K-major, K 32 a
# step): a K block of 128 fp8 columns is one box, as 64 fp16 columns were, and the decode
# tiles take 256 columns, two boxes. Per-tensor and row-wise: the scales multiply each TMEM
# slice in the epilogue.
@tilus.autotune("block_m, block_n, block_k, e_block_n, stages, swap_ab", [
    [128, 64, 128, 32, 4, False], [128, 128, 128, 32, 4, False], [128, 256, 128, 32, 4, False],
    [128, 16, 256, 16, 6, True], [128, 64, 256, 32, 4, True],
])
@tilus.autotune("group_m", [8])
@tilus.autotune("stream_k", [False, True])
class BlackwellMatmulV11(tilus.Script):
    warps = 4  # 128 threads: one per TMEM lane (row) for the epilogue

    def __init__(
        self,
        block_m: int,
        block_n: int,
        block_k: int,
        e_block_n: int,
        stages: int,
        group_m: int,
        swap_ab: bool,
        stream_k: bool,
        out_dtype: DataType = bfloat16,
    ):
        super().__init__()
        self.dtype = float8_e4m3  # A and B
        self.out_dtype = out_dtype  # C: bfloat16 or float16
        self.block_m = block_m
        self.block_n = block_n
        self.block_k = block_k
        self.e_block_n = e_block_n
        self.stages = stages
        self.group_m = group_m
        self.swap_ab = swap_ab
        self.stream_k = stream_k
        self.k_boxes = block_k // BOX_K  # TMA boxes per operand per slot, as on Hopper
        if swap_ab:
            self.store_slice = self.store_slice_transposed

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
        sa_ptr: void_p,
        sb_ptr: void_p,
        sa_stride_0: int32,
        sa_stride_1: int32,
        sb_stride_0: int32,
        sb_stride_1: int32,
    ):
        # 2. operands: global views (with swap_ab C^T = B A^T, as on Hopper), shared tiles, the
        # accumulator; the stream-K workspace (a ready flag and a partial tile per CTA)
        num_m, num_n = self.operands(m_size, n_size, k_size, a_ptr, b_ptr, c_ptr, num_sms, flags_ptr, partials_ptr,
                                     sa_ptr, sa_stride_0, sa_stride_1, sb_ptr, sb_stride_0, sb_stride_1)

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

    def operands(self, m_size: int32, n_size: int32, k_size: int32, a_ptr: void_p, b_ptr: void_p, c_ptr: void_p,
                 num_sms: int32, flags_ptr: void_p, partials_ptr: void_p, sa_ptr: void_p, sa_0: int32, sa_1: int32,
                 sb_ptr: void_p, sb_0: int32, sb_1: int32):
        """Global views, shared tiles and the TMEM sum, for both Blackwell kernels; returns the tile grid's size."""
        self.g_c = self.global_view(c_ptr, dtype=self.out_dtype, shape=[m_size, n_size])
        swapped, plain = (b_ptr, a_ptr, n_size, m_size), (a_ptr, b_ptr, m_size, n_size)
        ptr_a, ptr_b, rows_a, rows_b = swapped if self.swap_ab else plain
        self.g_a = self.global_view(ptr_a, dtype=self.dtype, shape=[rows_a, k_size])
        self.g_b = self.global_view(ptr_b, dtype=self.dtype, shape=[rows_b, k_size])
        # the scales of the kernel's rows (A's) and columns (B's): swap_ab swaps them too
        scale_a, scale_b = (sa_ptr, sa_0, sa_1), (sb_ptr, sb_0, sb_1)
        rows, cols = (scale_b, scale_a) if self.swap_ab else (scale_a, scale_b)
        self.scale_views(*rows, *cols, rows_a, rows_b, cdiv(k_size, BOX_K))
        num_m = cdiv(rows_a, self.block_m)
        num_n = cdiv(rows_b, self.block_n)
        self.attrs.blocks = launch_blocks(num_m * num_n, num_sms, 1, self.stream_k)
        self.attrs.warps = self.warps
        self.g_flags = self.global_view(flags_ptr, dtype=int32, shape=[num_sms])
        self.g_partials = self.global_view(partials_ptr, dtype=float32, shape=[num_sms * self.block_m, self.block_n])
        self.s_a = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.k_boxes, self.block_m, BOX_K])
        self.s_b = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.k_boxes, self.block_n, BOX_K])
        if not self.swap_ab:  # the transposed tile goes straight from registers to C
            self.s_c = self.shared_tensor(dtype=self.out_dtype, shape=[self.block_m, self.e_block_n])
        self.t_acc = self.tcgen05.alloc(dtype=float32, shape=[self.block_m, self.block_n])
        return num_m, num_n

    def producer(self, tile_m: int32, tile_n: int32, k_begin: int32, k_end: int32):
        """The TMA warp: K blocks k_begin to k_end of the tile into the ring, the last one partial if K ends in it."""
        for k_block in self.range(k_begin, k_end, 1):
            offset_k = k_block * self.block_k
            self.pipe.producer_acquire(transaction_bytes=self.s_a[0].nbytes + self.s_b[0].nbytes)
            for box in range(self.k_boxes):
                self.tma.global_to_shared(
                    src=self.g_a,
                    dst=self.s_a[self.pipe.producer_stage, box],
                    offsets=[self.block_m * tile_m, offset_k + box * BOX_K],
                    mbarrier=self.pipe.producer_barrier(),
                )
                self.tma.global_to_shared(
                    src=self.g_b,
                    dst=self.s_b[self.pipe.producer_stage, box],
                    offsets=[self.block_n * tile_n, offset_k + box * BOX_K],
                    mbarrier=self.pipe.producer_barrier(),
                )
            self.pipe.producer_advance()

    def mma(self, k_begin: int32, k_end: int32):
        """The MMA warp, the ring's consumer: one tcgen05.mma per K block into TMEM, none waited for."""
        after_thread_sync()  # the last tile's reads of TMEM (before a block sync) before this tile overwrites it
        for k_block in self.range(k_begin, k_end, 1):
            self.pipe.consumer_acquire()
            for box in range(self.k_boxes):
                # the piece's first MMA overwrites TMEM, which holds the last piece
                self.tcgen05.mma(
                    self.s_a[self.pipe.consumer_stage, box],
                    self.s_b[self.pipe.consumer_stage, box].transpose(),
                    self.t_acc,
                    enable_input_d=k_block != k_begin or box > 0,
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

    def scale_views(self, ptr_a: void_p, a_0: int32, a_1: int32, ptr_b: void_p, b_0: int32, b_1: int32,
                    rows_a: int32, rows_b: int32, k_blocks: int32):
        """A scale per row of the kernel's A and per row of its B (its C's columns); a per-tensor scale is a
        row-wise one whose stride is 0."""
        self.g_scale_rows = self.global_view(ptr_a, dtype=float32, shape=[rows_a, 1], strides=[a_0, 1])
        self.g_scale_cols = self.global_view(ptr_b, dtype=float32, shape=[1, rows_b], strides=[1, b_0])

    def scaled(self, r_acc: RegisterTensor, tile_m: int32, tile_n: int32, e_offset_n: int32) -> RegisterTensor:
        """A slice's fp32 sums times the outer product of its rows' and its columns' scales, in C's dtype."""
        rows = self.load_global(self.g_scale_rows, offsets=[self.block_m * tile_m, 0], shape=[self.block_m, 1])
        cols = self.load_global(self.g_scale_cols, offsets=[0, self.block_n * tile_n + e_offset_n],
                                shape=[1, self.e_block_n])
        return (r_acc * rows * cols).to(self.out_dtype)

    def epilogue(self, tile_m: int32, tile_n: int32):
        """TMEM -> registers, scaled -> shared -> global (TMA), e_block_n columns at a time, by all 4 warps."""
        for e_offset_n in range(0, self.block_n, self.e_block_n):
            self.store_slice(self.scaled(self.load_slice(e_offset_n), tile_m, tile_n, e_offset_n), tile_m, tile_n,
                             e_offset_n)

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
                self.store_slice(self.scaled(r_acc, tile_m, tile_n, e_offset_n), tile_m, tile_n, e_offset_n)
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

    def store_slice_transposed(self, r_c: RegisterTensor, tile_m: int32, tile_n: int32, e_offset_n: int32):
        """swap_ab: the slice is e_block_n rows of C (the caller's M) by block_m columns (TMEM's
        lanes are C's columns), stored from registers straight to C; the warps of one row of C
        write adjacent columns."""
        offsets = [self.block_n * tile_n + e_offset_n, self.block_m * tile_m]
        self.store_global(self.g_c, self.transpose(r_c), offsets=offsets)  # masked at M and N
        self.sync()  # every warp has read TMEM before the next piece's MMAs overwrite it

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


# The block-wise kernel on Blackwell: the accumulator stays in TMEM, so the
# promotion is a ring of two TMEM partials between the MMA warp and four promoting warps.
# Each K block's MMAs write a fresh partial (the ring's producer: tcgen05.commit marks it
# full); warps 4-7, one per 32 lanes, scale it and add it into the running sum in TMEM
# (the consumer), then do the piece's end, while the MMA warp fills the other partial.
# K blocks of 128 columns, one scale block a slot; 128 x 128 at most, as on Hopper (the
# tile's columns in one of B's 128-row scale blocks); TMEM: the sum and two partials,
# 3 x 128 of the SM's 512 columns.
@tilus.autotune("block_m, block_n, block_k, e_block_n, stages, swap_ab", [
    [128, 64, 128, 32, 4, False], [128, 128, 128, 32, 4, False],
    [128, 16, 128, 16, 12, True], [128, 64, 128, 32, 8, True],
])
@tilus.autotune("group_m", [8])
@tilus.autotune("stream_k", [False, True])
class BlackwellMatmulV11Blockwise(BlackwellMatmulV11):
    _autotune_space = {}  # its own space, not added to BlackwellMatmulV11's
    warps = 8  # the TMA warp, the MMA warp, two idle, and warps 4-7: one per 32 TMEM lanes

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
        sa_ptr: void_p,
        sb_ptr: void_p,
        sa_stride_0: int32,
        sa_stride_1: int32,
        sb_stride_0: int32,
        sb_stride_1: int32,
    ):
        # 2. operands, as in the per-tensor kernel; TMEM: the running sum and the partials' ring
        num_m, num_n = self.operands(m_size, n_size, k_size, a_ptr, b_ptr, c_ptr, num_sms, flags_ptr, partials_ptr,
                                     sa_ptr, sa_stride_0, sa_stride_1, sb_ptr, sb_stride_0, sb_stride_1)
        self.t_partials = self.tcgen05.alloc(dtype=float32, shape=[2, self.block_m, self.block_n])

        # 3. barriers: the shared-memory ring, and the partials' ring (full: a tcgen05.commit;
        # empty: every promoting thread has read the partial)
        self.pipe = Pipeline(self.stages, consumer_arrivals=1)
        self.partials = Pipeline(2, consumer_arrivals=128)
        self.sync()
        self.scheduler = StreamKTileScheduler(
            num_m, num_n, num_m * num_n, cdiv(k_size, self.block_k), self.group_m, 1, 0, self.stream_k
        )

        # 4. each role loops over this block's pieces on its own; the rings' cursors run on
        with self.thread_group(thread_begin=0, num_threads=32):  # the TMA warp
            self.pipe.producer_start()
            for item in self.scheduler.items():
                tile_m, tile_n, k_begin, k_end = self.scheduler.work(item)
                self.producer(tile_m, tile_n, k_begin, k_end)
        with self.thread_group(thread_begin=32, num_threads=32):  # the MMA warp
            self.pipe.consumer_start()
            self.partials.producer_start()
            for item in self.scheduler.items():
                tile_m, tile_n, k_begin, k_end = self.scheduler.work(item)
                self.mma_partials(k_begin, k_end)
        with self.thread_group(thread_begin=128, num_threads=128):  # the promoting warps
            self.partials.consumer_start()
            for item in self.scheduler.items():
                tile_m, tile_n, k_begin, k_end = self.scheduler.work(item)
                self.promote(tile_m, tile_n, k_begin, k_end)
                # 5. the piece's end, from the running sum, as in the per-tensor kernel
                if self.stream_k:
                    self.end_piece(tile_m, tile_n, k_begin, k_end)
                else:
                    self.epilogue(tile_m, tile_n)

        self.sync()
        after_thread_sync()  # every warp's reads of TMEM before it is freed
        self.tcgen05.dealloc(self.t_acc)
        self.tcgen05.dealloc(self.t_partials)

    def scale_views(self, ptr_a: void_p, a_0: int32, a_1: int32, ptr_b: void_p, b_0: int32, b_1: int32,
                    rows_a: int32, rows_b: int32, k_blocks: int32):
        """As on Hopper: a (row, K block) scale per activation row, a (128 rows, K block) one per weight block;
        with swap_ab the weights are the kernel's rows and the activations' scales are read as K blocks x rows."""
        if self.swap_ab:
            self.g_scale_rows = self.global_view(ptr_a, dtype=float32, shape=[cdiv(rows_a, 128), k_blocks],
                                                 strides=[a_0, a_1])
            self.g_scale_cols = self.global_view(ptr_b, dtype=float32, shape=[k_blocks, rows_b], strides=[b_1, b_0])
        else:
            self.g_scale_rows = self.global_view(ptr_a, dtype=float32, shape=[rows_a, k_blocks], strides=[a_0, a_1])
            self.g_scale_cols = self.global_view(ptr_b, dtype=float32, shape=[cdiv(rows_b, 128), k_blocks],
                                                 strides=[b_0, b_1])

    def mma_partials(self, k_begin: int32, k_end: int32):
        """The MMA warp: each K block into a free partial, which is full once its MMAs finish; none waited for."""
        for k_block in self.range(k_begin, k_end, 1):
            self.pipe.consumer_acquire()
            self.partials.producer_wait()
            after_thread_sync()  # the promoters' reads of this partial (then their arrivals) before it is overwritten
            for box in range(self.k_boxes):
                self.tcgen05.mma(
                    self.s_a[self.pipe.consumer_stage, box],
                    self.s_b[self.pipe.consumer_stage, box].transpose(),
                    self.t_partials[self.partials.producer_stage],
                    enable_input_d=box > 0,  # a fresh partial each K block
                )
            self.pipe.consumer_release_async()
            self.partials.producer_commit_async()
            self.pipe.consumer_advance()
            self.partials.producer_advance()

    def promote(self, tile_m: int32, tile_n: int32, k_begin: int32, k_end: int32):
        """Warps 4-7: each K block's partial, times its scales, into the running sum t_acc (the first one sets it)."""
        for k_block in self.range(k_begin, k_end, 1):
            self.partials.consumer_acquire()
            after_thread_sync()  # the MMAs (committed, then waited for) before these reads
            t_partial = self.t_partials[self.partials.consumer_stage]
            for e_offset_n in range(0, self.block_n, self.e_block_n):
                partial = self.tcgen05.load(self.tcgen05.slice(
                    t_partial, offsets=[0, e_offset_n], shape=[self.block_m, self.e_block_n], dims=[0, 1]))
                self.tcgen05.wait_load()
                rows, cols = self.block_scales(tile_m, tile_n, k_block, e_offset_n)
                t_sum = self.tcgen05.slice(self.t_acc, offsets=[0, e_offset_n], shape=[self.block_m, self.e_block_n],
                                           dims=[0, 1])
                scales = rows * cols  # a row's or a column's: then one FFMA an element
                if k_block > k_begin:
                    running = self.tcgen05.load(t_sum)
                    self.tcgen05.wait_load()
                    self.tcgen05.store(t_sum, running + partial * scales)
                else:
                    self.tcgen05.store(t_sum, partial * scales)
            self.tcgen05.wait_store()  # the sum is written before the next K block (or the epilogue) reads it
            before_thread_sync()  # these reads of the partial before the arrivals that free it
            self.partials.consumer_release()
            self.partials.consumer_advance()

    def block_scales(self, tile_m: int32, tile_n: int32, k_block: int32, e_offset_n: int32):
        """K block k_block's scales for the tile's rows and for e_block_n of its columns (one of them a 1 x 1)."""
        row = self.block_m * tile_m
        col = self.block_n * tile_n + e_offset_n
        if self.swap_ab:
            rows = self.load_global(self.g_scale_rows, offsets=[row // 128, k_block], shape=[1, 1])
            cols = self.load_global(self.g_scale_cols, offsets=[k_block, col], shape=[1, self.e_block_n])
        else:
            rows = self.load_global(self.g_scale_rows, offsets=[row, k_block], shape=[self.block_m, 1])
            cols = self.load_global(self.g_scale_cols, offsets=[col // 128, k_block], shape=[1, 1])
        return rows, cols

    def scaled(self, r_acc: RegisterTensor, tile_m: int32, tile_n: int32, e_offset_n: int32) -> RegisterTensor:
        return r_acc.to(self.out_dtype)  # scaled K block by K block already


KERNELS = support.kernels("v11", blackwell=BlackwellMatmulV11)
BLOCKWISE_KERNELS = support.kernels("v11", blackwell=BlackwellMatmulV11Blockwise)


def matmul(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
           out: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """C = (A * scale_a) @ (B * scale_b).T for fp8 e4m3 A (M x K) and B (N x K) on a Blackwell GPU, as
    matmul_v11.matmul does on Hopper (the same scalings, rules and errors)."""
    return scaled.launch(KERNELS, BLOCKWISE_KERNELS, a, b, scale_a, scale_b, out, out_dtype)


quantize = scaled.quantize


if __name__ == "__main__":
    sys.exit(scaled.main("v11", KERNELS, BLOCKWISE_KERNELS, matmul))
