"""v10: fp8 (e4m3) A and B at twice the tensor rate, with per-tensor or row-wise scales.

An fp8 value holds 3 mantissa bits and a range of +-448, so each operand comes with scales:
A ~= A8 * scale_a, B ~= B8 * scale_b, one each (per-tensor) or one per row of A and of B
(row-wise). They multiply the sums in the epilogue: C[i, j] = scale_a[i] scale_b[j] sum_k
A8[i, k] B8[j, k], each sum all of K in the fp8 wgmma's accumulator (torch: use_fast_accum).
wgmma takes e4m3 K-major, 32 K a step; a K block of 128 fp8 is 128 bytes a row, one box.
The K loop takes half the time, so the epilogue weighs twice as much: each consumer owns a
ring of two output boxes, box b's TMA store running while box b + 1 is written.

Constraints: A, B float8_e4m3fn, contiguous, K a multiple of 16; scales float32; C bf16 or
fp16, N a multiple of 8. Run: python matmul_v10.py [--sizes ...]. Walkthrough: docs/v10.md
"""

import sys

import tilus
import torch
from tilus import DataType, RegisterTensor, bfloat16, boolean, float8_e4m3, float32, int32, uint32, void_p
from tilus.hidet.ir.expr import if_then_else
from tilus.hidet.ir.primitives.cuda.setmaxnreg import setmaxnreg
from tilus.ir.layout.register_layout import register_layout
from tilus.ir.layout.shared_layout import Swizzle, shared_layout
from tilus.utils import cdiv

import support
from support import scaled
from pipeline import Pipeline
from schedulers import MAX_SHARERS, StreamKTileScheduler, launch_blocks

# columns of an operand's TMA box: 128 B of fp8, the widest the 128-byte swizzle takes; a K
# block of block_k columns is block_k // BOX_K boxes side by side
BOX_K = 128

# v9's tiles and rings in bytes: a K block of 128 fp8 columns is 128 B a row, as 64 fp16 columns
# were, so slots and rings keep v9's sizes (128 x 256: 4 x (16 + 32) KiB + two 16 KiB output
# rings); decode tiles take 256 columns, two boxes. No 128 x 224 (its 32-column boxes would need
# their own ring), no swapped 128 x 64 (not carried over). stream_k and swap_ab: the tuner picks.
# Then v9's 64 x 128 in clusters of two sharing B's tile, 8 stages of 8 + 16 KiB: ncu names it
# cuBLAS's fp8 tile at M = 128 and 256 too. Last, that tile swapped (128 tokens on wgmma's N):
# at M = 128 and 256 the tuner's back-to-back ranking put it first on the H100.
@tilus.autotune("block_m, block_n, block_k, stages, cluster_m, swap_ab, stream_k", [
    [128, 256, 128, 4, 1, False, False], [128, 256, 128, 4, 2, False, False],
    [128, 256, 128, 4, 2, False, True],
    [128, 128, 128, 6, 1, False, False], [128, 128, 128, 6, 2, False, False],
    [128, 128, 128, 6, 1, False, True], [128, 128, 128, 6, 2, False, True],
    [128, 64, 128, 8, 1, False, False], [128, 64, 128, 8, 1, False, True],
    [128, 16, 256, 6, 1, True, False], [128, 16, 256, 6, 1, True, True],
    [64, 16, 256, 10, 1, True, False], [64, 16, 256, 10, 1, True, True],
    [64, 64, 256, 6, 1, True, False], [64, 64, 256, 6, 1, True, True],
    [64, 128, 128, 8, 2, False, False], [64, 128, 128, 8, 1, True, False],
])
@tilus.autotune("group_m", [8])
class HopperMatmulV10(tilus.Script):
    def __init__(
        self,
        block_m: int,
        block_n: int,
        block_k: int,
        stages: int,
        group_m: int,
        cluster_m: int,
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
        self.stages = stages
        self.group_m = group_m
        self.cluster_m = cluster_m
        self.swap_ab = swap_ab
        self.stream_k = stream_k
        # a consumer warpgroup per 64 rows (wgmma's M): two for 128-row tiles, one for a 64-row one
        self.consumers = block_m // 64
        self.consumer_m = 64  # rows of the tile each consumer warpgroup owns
        # 128 x 256 stream-K: the owner starts from its one sharer's sum, and a producer
        # warpgroup hands its registers to the consumers (setmaxnreg 40 and 232: 128 x 40 +
        # 256 x 232 = 64,512 of 65,536), room for the sharer's partial beside the sum
        self.owner_starts_from_partial = stream_k and block_n > 128
        # every 128 x 256 tile splits the registers: the scales' product beside a 64 x 256 sum
        # needs more than the 168 a thread that 9 warps on 4 schedulers leave
        self.register_split = block_n > 128
        self.k_boxes = block_k // BOX_K  # TMA boxes per operand per slot
        # a CTA's loads of B go to every CTA of its cluster
        self.multicast_mask = (1 << cluster_m) - 1 if cluster_m > 1 else None
        # the output goes out in 64-column boxes (a swap_ab tile is one box of C^T's). Tiles of
        # several boxes give each consumer a ring of two; one-box tiles have no next box to
        # overlap, and their consumers take turns with one tile, as in v9
        self.boxes = 1 if swap_ab else block_n // 64
        self.takes_turns = self.boxes == 1
        if swap_ab:
            self.epilogue = self.epilogue_transposed

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
        # with swap_ab the kernel computes C^T = B A^T: its A is the caller's B and its M the
        # caller's N; only the epilogue, which stores the tile transposed, knows
        swapped, plain = (b_ptr, a_ptr, n_size, m_size), (a_ptr, b_ptr, m_size, n_size)
        ptr_a, ptr_b, rows_a, rows_b = swapped if self.swap_ab else plain
        num_m = cdiv(rows_a, self.block_m)
        num_n = cdiv(rows_b, self.block_n)
        # a unit of work: cluster_m tiles stacked in M, one per CTA of a cluster, sharing B
        num_units_m = cdiv(num_m, self.cluster_m)
        num_units = num_units_m * num_n
        self.attrs.blocks = launch_blocks(num_units, num_sms, self.cluster_m, self.stream_k)
        self.attrs.cluster_blocks = self.cluster_m
        # one or two consumer warpgroups, then the producer warp (a warpgroup with the register split)
        self.attrs.warps = 4 * self.consumers + (4 if self.register_split else 1)

        # 2. operands: global views, shared tiles (each consumer holds its own accumulator)
        self.g_a = self.global_view(ptr_a, dtype=self.dtype, shape=[rows_a, k_size])
        self.g_b = self.global_view(ptr_b, dtype=self.dtype, shape=[rows_b, k_size])
        self.g_c = self.global_view(c_ptr, dtype=self.out_dtype, shape=[m_size, n_size])
        # the scales, in the kernel's rows (A's) and columns (B's): swap_ab swaps them too
        if self.swap_ab:
            self.scale_views(sb_ptr, sb_stride_0, sb_stride_1, sa_ptr, sa_stride_0, sa_stride_1, rows_a, rows_b)
        else:
            self.scale_views(sa_ptr, sa_stride_0, sa_stride_1, sb_ptr, sb_stride_0, sb_stride_1, rows_a, rows_b)
        # the stream-K workspace: a ready flag and a partial tile per (CTA, consumer warpgroup)
        self.g_flags = self.global_view(flags_ptr, dtype=int32, shape=[num_sms * 2])
        self.g_partials = self.global_view(
            partials_ptr, dtype=float32, shape=[num_sms * 2 * self.consumer_m, self.block_n]
        )
        # a slot is k_boxes boxes of BOX_K columns side by side; in each, A holds one part per
        # consumer, and every consumer reads the whole of B
        self.s_a = self.shared_tensor(
            dtype=self.dtype, shape=[self.stages, self.k_boxes, self.consumers, self.consumer_m, BOX_K]
        )
        # B's slot in cluster_m parts: each CTA of the cluster loads one part into every CTA
        self.s_b = self.shared_tensor(
            dtype=self.dtype, shape=[self.stages, self.k_boxes, self.cluster_m, self.block_n // self.cluster_m, BOX_K]
        )
        self.s_c = self.output_rings()
        # each consumer's copy of the tile's column scales: the epilogue reads them from here, not from global
        self.s_scale_cols = self.shared_tensor(dtype=float32, shape=[self.consumers, 1, self.block_n])

        # 3. barriers: a slot is free once both consumer warpgroups of every CTA that reads it let go
        self.pipe = Pipeline(self.stages, consumer_arrivals=self.consumers * self.cluster_m)
        if self.takes_turns:
            self.s_c_free = self.mbarrier.alloc(counts=[1] * self.consumers)  # s_c is free for warpgroup 0 (, 1)
        if self.cluster_m > 1:
            self.cluster.sync()  # a peer may signal our barriers only once they are initialised
            rank: int32 = self.cluster.blockRank
        else:
            self.sync()
            rank: int32 = 0
        self.rank = rank  # this CTA's place in its cluster
        # 1. this block's (this cluster's) pieces of work: whole tiles, then a stream-K range of K blocks
        self.scheduler = StreamKTileScheduler(
            num_units_m, num_n, num_units, cdiv(k_size, self.block_k), self.group_m, self.cluster_m, rank,
            self.stream_k, 1 if self.owner_starts_from_partial else MAX_SHARERS,
        )

        # 4. the K loop of every piece, one per role: each consumer, then the producer. Its setmaxnreg.dec
        # leaves it 40 registers, so no value the consumers need may live across its code: ptxas would spill it
        self.consumer(0)
        if self.consumers == 2:
            self.consumer(1)
        self.producer()

        if self.cluster_m > 1:
            self.cluster.sync()  # stay until the peer has stopped writing into our slots and barriers

    def output_rings(self):
        """A ring of two output boxes a consumer, or one tile (one or two boxes) the consumers share,
        each box 64 columns of 128 B rows under TMA's 128-byte swizzle: a TMA store a box."""
        rows = self.block_n if self.swap_ab else self.consumer_m
        shape = [1 if self.takes_turns else self.consumers, min(self.boxes, 2), rows, 64]
        s_c = self.shared_tensor(dtype=self.out_dtype, shape=shape)
        # row r's 16-byte chunk c sits at chunk c ^ (r % 8): the 8 rows an stmatrix writes hit 8 bank groups
        self.annotate_layout(s_c, shared_layout(
            shape=shape, mode_shape=shape, mode_strides=[2 * rows * 64, rows * 64, 64, 1],
            optional_swizzle=Swizzle(base=3, bits=3, shift=3),
        ))
        return s_c

    def producer(self):
        """The TMA warp: every K block of every piece of this block, as far ahead as the ring allows."""
        if self.register_split:
            with self.thread_group(thread_begin=128 * self.consumers, num_threads=128):
                setmaxnreg(40, "dec")  # the producer warpgroup gives registers to the consumers
                with self.thread_group(thread_begin=0, num_threads=32):  # the TMA warp
                    self.load_pieces()
        else:
            with self.thread_group(thread_begin=128 * self.consumers, num_threads=32):  # producer: the TMA warp
                self.load_pieces()

    def load_pieces(self):
        """Piece after piece with nothing in between: the next piece's loads overlap the last one's end."""
        self.pipe.producer_start()
        for item in self.scheduler.items():
            tile_m, tile_n, k_begin, k_end = self.scheduler.work(item)
            self.load_piece(tile_m, tile_n, k_begin, k_end)

    def load_piece(self, tile_m: int32, tile_n: int32, k_begin: int32, k_end: int32):
        """K blocks k_begin to k_end of a tile: A in 64-row parts, one per consumer, then B, box by box.

        The ring's cursor runs on from piece to piece, whatever its length: no piece is
        padded to whole trips, and the last K block is partial where block_k does not
        divide K (TMA fills what lies past K with zeros).
        """
        for k_block in self.range(k_begin, k_end, 1):
            offset_k = k_block * self.block_k
            self.pipe.producer_acquire(transaction_bytes=self.s_a[0].nbytes + self.s_b[0].nbytes)
            for box in range(self.k_boxes):
                for part in range(self.consumers):
                    self.tma.global_to_shared(
                        src=self.g_a,
                        dst=self.s_a[self.pipe.producer_stage, box, part],
                        offsets=[self.block_m * tile_m + part * self.consumer_m, offset_k + box * BOX_K],
                        mbarrier=self.pipe.producer_barrier(),
                    )
                self.load_b(self.block_n * tile_n, offset_k + box * BOX_K, box)
            self.pipe.producer_advance()

    def load_b(self, offset_n: int32, offset_k: int32, box: int32):
        """Load slot producer_stage of B: all of it alone, or this CTA's part, multicast to the cluster."""
        part_n = self.block_n // self.cluster_m
        self.tma.global_to_shared(
            src=self.g_b,
            dst=self.s_b[self.pipe.producer_stage, box, self.rank],
            offsets=[offset_n + self.rank * part_n, offset_k],
            mbarrier=self.pipe.producer_barrier(),
            multicast_mask=self.multicast_mask,
        )

    def next_consumer(self, warpgroup: int) -> int:
        """The warpgroup that writes s_c after this one: the other of two, or itself when it is alone."""
        return (warpgroup + 1) % self.consumers

    def consumer(self, warpgroup: int):
        """One consumer warpgroup: its rows of every piece, the K loop then the piece's end."""
        with self.thread_group(thread_begin=128 * warpgroup, num_threads=128):
            if self.register_split:
                setmaxnreg(232, "inc")
            self.pipe.consumer_start()
            # per-tensor scales (strides 0): their product, the one scale of every element of C
            self.scale = self.load_global(self.g_scale_rows, offsets=[0, 0], shape=[1, 1]) * self.load_global(
                self.g_scale_cols, offsets=[0, 0], shape=[1, 1])
            c_phase: uint32 = 1 - warpgroup  # warpgroup 0 writes s_c first
            for item in self.scheduler.items():
                tile_m, tile_n, k_begin, k_end = self.scheduler.work(item)
                acc = self.mma(warpgroup, tile_m, tile_n, k_begin, k_end)

                # 5. the piece's end: where they take turns, the consumers wait for s_c
                if self.takes_turns:
                    self.mbarrier.wait(self.s_c_free[warpgroup], phase=c_phase)
                    c_phase ^= 1
                if self.stream_k:
                    self.end_piece(warpgroup, acc, tile_m, tile_n, k_begin, k_end)
                else:
                    self.epilogue(warpgroup, acc, tile_m, tile_n)
            with self.single_warp():
                self.tma.wait_group(n=0)  # the last stores have read s_c before the block exits

    def mma(self, warpgroup: int, tile_m: int32, tile_n: int32, k_begin: int32, k_end: int32):
        """This warpgroup's rows of one piece, K blocks k_begin to k_end, into a fresh accumulator; the tile's
        place says which scales to load."""
        if self.owner_starts_from_partial:
            acc = self.start_from_partial(warpgroup, k_begin, k_end)
        else:
            acc = self.register_tensor(dtype=float32, shape=[self.consumer_m, self.block_n], init=0.0)
        # the tile's column scales, a few a thread, in flight during the K loop (tile_scales stores them)
        self.cols_ahead = self.load_global(self.g_scale_cols, offsets=[0, self.block_n * tile_n],
                                           shape=[1, self.block_n])
        for k_block in self.range(k_begin, k_end, 1):
            self.pipe.consumer_acquire()
            self.wgmma.fence()
            for box in range(self.k_boxes):
                s_b_slot = self.reshape_shared(self.s_b[self.pipe.consumer_stage, box], [self.block_n, BOX_K])
                self.wgmma.mma(self.s_a[self.pipe.consumer_stage, box, warpgroup], s_b_slot.transpose(), acc)
            self.wgmma.commit_group()
            self.wgmma.wait_group(1)  # this step may still run; the previous one has finished
            if k_block > k_begin:
                self.pipe.consumer_release_previous_in_cluster(self.cluster_m, self.rank)
            self.pipe.consumer_advance()
        if not self.stream_k:
            # the row scales in flight, and the column scales stored, during the last K block's wgmmas; stream-K's
            # owner holds a sharer's partial beside the sum, and there the scales would spill
            self.row_scales = self.tile_scales(warpgroup, tile_m, tile_n)
        # Hopper's flush: the accumulator is final only now, and the piece's last slot is free
        self.wgmma.wait_group(0)
        self.pipe.consumer_release_previous_in_cluster(self.cluster_m, self.rank)
        return acc

    def end_piece(self, warpgroup: int, acc: RegisterTensor, tile_m: int32, tile_n: int32, k_begin: int32,
                  k_end: int32):
        """A stream-K piece's end: its sum to the workspace, or the tile, with its sharers' sums added, to C."""
        if k_end < self.scheduler.k_blocks:
            self.save_partial(warpgroup, acc)  # the tile's owner adds it
            if self.takes_turns:
                with self.single_thread():
                    self.release_s_c(warpgroup)  # s_c unused: the next one's turn
        else:
            if k_begin > 0 and not self.owner_starts_from_partial:
                self.add_partials(warpgroup, acc)
            self.epilogue(warpgroup, acc, tile_m, tile_n)

    def add_partials(self, warpgroup: int, acc: RegisterTensor):
        """The owner's fix-up: the sums of the tile's sharers (at most MAX_SHARERS), lowest worker first.

        Written out for MAX_SHARERS = 2 rather than looped: here a load_global in a runtime
        loop does not build in tilus 0.2.0. The first sharer always exists: a lower worker
        holds K block 0.
        """
        first = self.scheduler.first_sharer()
        self.add_partial(warpgroup, acc, first, True)
        if first + 1 < self.scheduler.worker:
            self.add_partial(warpgroup, acc, first + 1, True)

    def add_partial(self, warpgroup: int, acc: RegisterTensor, worker: int32, owner: boolean):
        """Wait for a sharer's flag, add its sum to acc, and set the flag back to 0 for the next launch.

        ``owner`` false (a run-time condition, start_from_partial) adds zeros instead: the
        rows past the workspace, which load_global masks to zeros without reading.
        """
        entry: int32 = (worker * self.cluster_m + self.rank) * 2 + warpgroup
        flag: ~int32 = self.g_flags[entry].item_ptr()
        if owner:
            self.lock_semaphore(flag, 1)
        row = if_then_else(owner, entry * self.consumer_m, self.g_partials.shape[0])
        partial = self.load_global(self.g_partials, offsets=[row, 0], shape=[self.consumer_m, self.block_n])
        self.add(acc, partial, out=acc)
        if owner:
            self.release_semaphore(flag, 0)

    def start_from_partial(self, warpgroup: int, k_begin: int32, k_end: int32):
        """A fresh accumulator: the sharer's sum for the owner's piece, zeros for any other piece.

        Every piece adds a loaded partial to zeros: the owner its sharer's, the others rows past
        the workspace, masked to zeros. Branching between loaded and zeros makes ptxas serialise
        every wgmma (C7515); loading straight into the accumulator does too (C7514).
        """
        acc = self.register_tensor(dtype=float32, shape=[self.consumer_m, self.block_n], init=0.0)
        owner = k_begin > 0 and k_end == self.scheduler.k_blocks
        self.add_partial(warpgroup, acc, self.scheduler.first_sharer(), owner)
        return acc

    def save_partial(self, warpgroup: int, acc: RegisterTensor):
        """The piece's sum to this CTA and warpgroup's workspace entry, then its flag (st.release: after every
        thread's stores)."""
        entry: int32 = self.blockIdx.x * 2 + warpgroup
        flag: ~int32 = self.g_flags[entry].item_ptr()
        self.store_global(self.g_partials, acc, offsets=[entry * self.consumer_m, 0])
        self.sync()  # this warpgroup's named barrier: all 128 threads have stored
        self.release_semaphore(flag, 1)

    def scale_views(self, ptr_a: void_p, a_0: int32, a_1: int32, ptr_b: void_p, b_0: int32, b_1: int32,
                    rows_a: int32, rows_b: int32):
        """A scale per row of the kernel's A and per row of its B (its C's columns). A per-tensor scale
        is a row-wise one whose stride is 0; where both strides are 0, `scaled` takes their product."""
        self.g_scale_rows = self.global_view(ptr_a, dtype=float32, shape=[rows_a, 1], strides=[a_0, 1])
        self.g_scale_cols = self.global_view(ptr_b, dtype=float32, shape=[1, rows_b], strides=[1, b_0])
        per_tensor: boolean = a_0 == 0 and b_0 == 0
        self.per_tensor = per_tensor

    def tile_scales(self, warpgroup: int, tile_m: int32, tile_n: int32):
        """This warpgroup's row scales; the tile's column scales, loaded as the piece began, go to shared memory."""
        rows = self.load_global(self.g_scale_rows, offsets=[self.block_m * tile_m + warpgroup * self.consumer_m, 0],
                                shape=[self.consumer_m, 1])
        self.store_shared(self.s_scale_cols[warpgroup], self.cols_ahead)
        self.sync()  # this warpgroup's named barrier: every column scale is in place
        return rows

    def scaled(self, warpgroup: int, acc: RegisterTensor, tile_m: int32, tile_n: int32) -> RegisterTensor:
        """The tile's fp32 sums times one scale (per-tensor), or the outer product of its rows' and columns'."""
        rows = self.tile_scales(warpgroup, tile_m, tile_n) if self.stream_k else self.row_scales
        if self.per_tensor:  # one multiply an element, not two
            self.assign(acc, acc * self.scale)
        else:
            # 64 column scales a thread. From global memory each is a load with its own bounds check, while
            # both consumers' tensor cores wait; from shared memory they are 32 vector loads
            cols = self.load_shared(self.s_scale_cols[warpgroup])
            self.assign(acc, acc * rows * cols)
        return acc

    def epilogue(self, warpgroup: int, acc: RegisterTensor, tile_m: int32, tile_n: int32):
        """Registers -> swizzled boxes in shared memory -> global, a TMA store a box: through the warpgroup's
        ring box by box (box b's store runs while box b + 1 is written), or, taking turns, the tile at once."""
        offset_m = self.block_m * tile_m + warpgroup * self.consumer_m
        offset_n = self.block_n * tile_n
        c = self.scaled(warpgroup, acc, tile_m, tile_n).to(self.out_dtype)
        if self.takes_turns:  # the tile at once: its one box seen as one consumer_m x block_n tile
            s_c_rows = self.reshape_shared(self.s_c[0].permute([1, 0, 2]), [self.consumer_m, self.block_n])
            self.store_shared(s_c_rows, c)
            self.send(warpgroup, 0, self.boxes, offset_m, offset_n)
        else:
            # wgmma's accumulator holds its 8-column chunks in order, so each box is a run of registers
            self.annotate_layout(c, register_layout(
                shape=[self.consumer_m, self.block_n], mode_shape=[4, 2, 8, self.block_n // 8, 4, 2],
                spatial_modes=[0, 2, 4], local_modes=[3, 1, 5]))
            c_boxes = self.view(c, layout=register_layout(
                shape=[self.boxes, self.consumer_m, 64], mode_shape=[self.boxes, 4, 2, 8, 8, 4, 2],
                spatial_modes=[1, 3, 5], local_modes=[0, 4, 2, 6]))
            for box in range(self.boxes):
                self.wait_for_box()
                self.store_shared(self.s_c[warpgroup, box % 2], c_boxes[box])
                self.send(warpgroup, box, 1, offset_m, offset_n)
        self.pass_turn(warpgroup)

    def epilogue_transposed(self, warpgroup: int, acc: RegisterTensor, tile_m: int32, tile_n: int32):
        """swap_ab: the tile is C^T's, so it goes to s_c transposed (stmatrix .trans), then to C as one box."""
        self.store_shared(self.s_c[0, 0], self.transpose(self.scaled(warpgroup, acc, tile_m, tile_n).to(self.out_dtype)))
        self.send(warpgroup, 0, 1, self.block_n * tile_n, self.block_m * tile_m + warpgroup * self.consumer_m)
        self.pass_turn(warpgroup)

    def ring(self, warpgroup: int) -> int:
        """Which output ring a warpgroup writes: its own, or the one all take turns with."""
        return 0 if self.takes_turns else warpgroup

    def wait_for_box(self):
        """A ring's next box is free once the store that last used it, two boxes ago, has read it."""
        with self.single_warp():
            self.tma.wait_group(n=1, read=True)
        self.sync()  # this warpgroup only (a named barrier)

    def send(self, warpgroup: int, first: int32, count: int, offset_m: int32, offset_n: int32):
        """Boxes first to first + count - 1 of the written ring to C from (offset_m, offset_n) on, by TMA."""
        # generic-proxy stores must be made visible to the async proxy (TMA) before it reads s_c
        self.fence.proxy_async(space="shared")
        self.sync()
        with self.single_warp():
            for i in range(count):
                box = first + i
                self.tma.shared_to_global(self.s_c[self.ring(warpgroup), box % 2], self.g_c,
                                          offsets=[offset_m, offset_n + box * 64], dims=[0, 1])
            self.tma.commit_group()

    def pass_turn(self, warpgroup: int):
        """Where the consumers take turns: once the TMA engine has read s_c, it is the next one's."""
        if self.takes_turns:
            with self.single_warp():
                self.tma.wait_group(n=0, read=True)
                with self.single_thread():
                    self.release_s_c(warpgroup)

    def release_s_c(self, warpgroup: int):
        """Hand s_c to the next warpgroup (the other of two, or itself); this one goes on to its next tile."""
        self.mbarrier.arrive(self.s_c_free[self.next_consumer(warpgroup)])



KERNELS = support.kernels("v10", hopper=HopperMatmulV10)


def matmul(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
           out: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """C = (A * scale_a) @ (B * scale_b).T for fp8 e4m3 A (M x K) and B (N x K), fp32 accumulation, C bf16 or fp16.

    The scaling is read from the float32 scales' shapes: one value each (per-tensor), or
    scale_a M x 1 and scale_b N x 1 (row-wise); ``quantize`` makes them (block-wise scales are
    v11's). C is ``out_dtype``, or the dtype of ``out`` where one is given. Raises
    TypeError/ValueError naming the rule for input the kernels cannot take.
    """
    return scaled.launch(KERNELS, None, a, b, scale_a, scale_b, out, out_dtype)


quantize = scaled.quantize


if __name__ == "__main__":
    # a first run: per-tensor at a square, beside cuBLAS in bf16, and at decode; --full times every scaling and
    # size, and v9 in bf16
    sys.exit(scaled.main("v10", KERNELS, None, matmul, bf16="matmul_v9",
                         default=[((4096, 4096, 4096), ("tensor", "cublas bf16")), ((64, 14336, 4096), ("tensor",))]))
