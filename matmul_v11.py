"""v11: fp8 block-wise scales (DeepSeek-V3's), each K block's sum promoted into an fp32 sum.

Block-wise scales change every 128 K: 1 x 128 blocks for activations, 128 x 128 for weights.
So each K block's wgmmas write a fresh partial, which is scaled and added into an fp32 sum in
registers: the promotion (HopperMatmulV11Blockwise). A sum that never runs longer than 128 K
also loses less to the fp8 wgmma's short accumulator. Each slot brings its K block's scales
with its A and B. The sum and a partial are 2 x 64 registers a thread at 64 x 128 per
warpgroup, so tiles are at most 128 wide; 192 x 128 tiles have three consumer warpgroups, so
two others' wgmmas run while one promotes. Per-tensor and row-wise scales run v10's kernel, or,
with accumulate="promoted", the promotion with v10's scales after it (HopperMatmulV11Promoted).

Constraints as in v10. Run: python matmul_v11.py [--sizes ...]. Walkthrough: docs/v11.md
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
from wgmma_fresh import mma_fresh

# columns of an operand's TMA box: 128 B of fp8, the widest the 128-byte swizzle takes; a K
# block of block_k columns is block_k // BOX_K boxes side by side
BOX_K = 128

# v9's tiles and rings in bytes: a K block of 128 fp8 columns is 128 B a row, as 64 fp16 columns
# were, so slots and rings keep v9's sizes (128 x 256: 4 x (16 + 32) KiB + two 16 KiB output
# rings); decode tiles take 256 columns, two boxes. No 128 x 224 (its 32-column boxes would need
# their own ring), no swapped 128 x 64 (not carried over). stream_k and swap_ab: the tuner picks.
@tilus.autotune("block_m, block_n, block_k, stages, cluster_m, swap_ab, stream_k", [
    [128, 256, 128, 4, 1, False, False], [128, 256, 128, 4, 2, False, False],
    [128, 256, 128, 4, 2, False, True],
    [128, 128, 128, 6, 1, False, False], [128, 128, 128, 6, 2, False, False],
    [128, 128, 128, 6, 1, False, True], [128, 128, 128, 6, 2, False, True],
    [128, 64, 128, 8, 1, False, False], [128, 64, 128, 8, 1, False, True],
    [128, 16, 256, 6, 1, True, False], [128, 16, 256, 6, 1, True, True],
    [64, 16, 256, 10, 1, True, False], [64, 16, 256, 10, 1, True, True],
    [64, 64, 256, 6, 1, True, False], [64, 64, 256, 6, 1, True, True],
])
@tilus.autotune("group_m", [8])
class HopperMatmulV11(tilus.Script):
    promotes = False  # the block-wise kernel's promotion, below

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
        # a consumer warpgroup per 64 rows (wgmma's M): two for 128-row tiles, one for a 64-row one,
        # three for the block-wise 192-row tiles
        self.consumers = 2 if block_m == 256 else block_m // 64
        # 64-row parts a consumer computes in turn: two in the block-wise 256-row tiles, else one
        self.consumer_parts = block_m // 64 // self.consumers
        self.parts = self.consumers * self.consumer_parts
        assert self.consumer_parts == 1 or not (stream_k or swap_ab), "two parts a consumer: no stream-K, no swap_ab"
        # the stream-K workspace's entries a CTA, one per consumer warpgroup (two where there is one)
        self.entries = max(self.consumers, 2)
        self.consumer_m = 64  # rows of the tile each consumer warpgroup owns
        # 128 x 256 stream-K: the owner starts from its one sharer's sum, and a producer
        # warpgroup hands its registers to the consumers (setmaxnreg 40 and 232: 128 x 40 +
        # 256 x 232 = 64,512 of 65,536), room for the sharer's partial beside the sum
        self.owner_starts_from_partial = stream_k and block_n > 128
        # A tile of two or three consumers splits the registers where they need more than the 168
        # a thread that 9 warps on 4 schedulers leave: the scales' product beside a 64 x 256 sum,
        # or the block-wise running sum beside a K block's partial. Of an SM's 65,536 registers
        # the producer warpgroup keeps 40 a thread and gives the rest to the consumers: 232 each
        # for two, 152 for three (128 x (40 + 3 x 152) = 63,488)
        self.register_split = block_n > 128 or (self.promotes and self.consumers >= 2)
        self.consumer_registers = 232 if self.consumers <= 2 else 152
        self.k_boxes = block_k // BOX_K  # TMA boxes per operand per slot
        # a CTA's loads of B go to every CTA of its cluster
        self.multicast_mask = (1 << cluster_m) - 1 if cluster_m > 1 else None
        # the output goes out in 64-column boxes (a swap_ab tile is one box of C^T's). Tiles of
        # several boxes give each consumer a ring of two; one-box tiles have no next box to
        # overlap, and their consumers take turns with one tile, as in v9; so do the block-wise
        # consumers, whose promotion, not their store, bounds them: a ring each is slower there
        self.boxes = 1 if swap_ab else block_n // 64
        self.takes_turns = self.promotes or self.boxes == 1
        if swap_ab:
            self.epilogue = self.epilogue_transposed
            if self.promotes:
                self.mma = self.mma_slot_in_flight  # block-wise decode: a slot's two K blocks at once

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
        # one to three consumer warpgroups, then the producer warp (a warpgroup with the register split)
        self.attrs.warps = 4 * self.consumers + (4 if self.register_split else 1)

        # 2. operands: global views, shared tiles (each consumer holds its own accumulator)
        self.g_a = self.global_view(ptr_a, dtype=self.dtype, shape=[rows_a, k_size])
        self.g_b = self.global_view(ptr_b, dtype=self.dtype, shape=[rows_b, k_size])
        self.g_c = self.global_view(c_ptr, dtype=self.out_dtype, shape=[m_size, n_size])
        # the scales, in the kernel's rows (A's) and columns (B's): swap_ab swaps them too
        if self.swap_ab:
            self.scale_views(sb_ptr, sb_stride_0, sb_stride_1, sa_ptr, sa_stride_0, sa_stride_1, rows_a, rows_b,
                             cdiv(k_size, BOX_K))
        else:
            self.scale_views(sa_ptr, sa_stride_0, sa_stride_1, sb_ptr, sb_stride_0, sb_stride_1, rows_a, rows_b,
                             cdiv(k_size, BOX_K))
        # the stream-K workspace: a ready flag and a partial tile per (CTA, consumer warpgroup)
        self.g_flags = self.global_view(flags_ptr, dtype=int32, shape=[num_sms * self.entries])
        self.g_partials = self.global_view(
            partials_ptr, dtype=float32, shape=[num_sms * self.entries * self.consumer_m, self.block_n]
        )
        # a slot is k_boxes boxes of BOX_K columns side by side; in each, A holds one part per
        # consumer, and every consumer reads the whole of B
        self.s_a = self.shared_tensor(
            dtype=self.dtype, shape=[self.stages, self.k_boxes, self.parts, self.consumer_m, BOX_K]
        )
        # B's slot in cluster_m parts: each CTA of the cluster loads one part into every CTA
        self.s_b = self.shared_tensor(
            dtype=self.dtype, shape=[self.stages, self.k_boxes, self.cluster_m, self.block_n // self.cluster_m, BOX_K]
        )
        self.s_c = self.output_rings()
        if not self.promotes:
            # each consumer's copy of the tile's column scales: the epilogue reads them from here, not from global
            self.s_scale_cols = self.shared_tensor(dtype=float32, shape=[self.consumers, 1, self.block_n])

        # 3. barriers: a slot is free once both consumer warpgroups of every CTA that reads it let go
        self.pipe = Pipeline(self.stages, consumer_arrivals=self.consumers * self.cluster_m)
        if self.takes_turns:
            self.s_c_free = self.mbarrier.alloc(counts=[1] * self.consumers)  # s_c is free for warpgroup 0 (, 1, 2)
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
        if self.consumer_parts == 2:
            self.consumer_two_parts(0)
            self.consumer_two_parts(1)
        else:
            self.consumer(0)
            if self.consumers >= 2:
                self.consumer(1)
            if self.consumers == 3:
                self.consumer(2)
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
        """K blocks k_begin to k_end of a tile, a slot each.

        The ring's cursor runs on from piece to piece, whatever its length: no piece is
        padded to whole trips, and the last K block is partial where block_k does not
        divide K (TMA fills what lies past K with zeros).
        """
        for k_block in self.range(k_begin, k_end, 1):
            self.acquire_slot(tile_m, tile_n, k_block)
            self.load_slot(tile_m, tile_n, k_block * self.block_k)
            self.pipe.producer_advance()

    def acquire_slot(self, tile_m: int32, tile_n: int32, k_block: int32):
        """Wait until slot producer_stage is empty, then announce the bytes its loads will bring."""
        self.pipe.producer_acquire(transaction_bytes=self.s_a[0].nbytes + self.s_b[0].nbytes)

    def load_slot(self, tile_m: int32, tile_n: int32, offset_k: int32):
        """Slot producer_stage's boxes from column offset_k on: A in 64-row parts, one per consumer, then B."""
        for box in range(self.k_boxes):
            for part in range(self.parts):
                self.tma.global_to_shared(
                    src=self.g_a,
                    dst=self.s_a[self.pipe.producer_stage, box, part],
                    offsets=[self.block_m * tile_m + part * self.consumer_m, offset_k + box * BOX_K],
                    mbarrier=self.pipe.producer_barrier(),
                )
            self.load_b(self.block_n * tile_n, offset_k + box * BOX_K, box)

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
        """The warpgroup that writes s_c after this one: the next in turn, or itself when it is alone."""
        return (warpgroup + 1) % self.consumers

    def consumer(self, warpgroup: int):
        """One consumer warpgroup: its rows of every piece, the K loop then the piece's end."""
        with self.thread_group(thread_begin=128 * warpgroup, num_threads=128):
            if self.register_split:
                setmaxnreg(self.consumer_registers, "inc")
            self.pipe.consumer_start()
            if not self.promotes:
                # per-tensor scales (strides 0): their product, the one scale of every element of C
                self.scale = self.load_global(self.g_scale_rows, offsets=[0, 0], shape=[1, 1]) * self.load_global(
                    self.g_scale_cols, offsets=[0, 0], shape=[1, 1])
            # warpgroup 0 writes s_c first (phase 1 passes at once); the others wait for their turn
            c_phase: uint32 = 1 if warpgroup == 0 else 0
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
        entry: int32 = (worker * self.cluster_m + self.rank) * self.entries + warpgroup
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
        entry: int32 = self.blockIdx.x * self.entries + warpgroup
        flag: ~int32 = self.g_flags[entry].item_ptr()
        self.store_global(self.g_partials, acc, offsets=[entry * self.consumer_m, 0])
        self.sync()  # this warpgroup's named barrier: all 128 threads have stored
        self.release_semaphore(flag, 1)

    def scale_views(self, ptr_a: void_p, a_0: int32, a_1: int32, ptr_b: void_p, b_0: int32, b_1: int32,
                    rows_a: int32, rows_b: int32, k_blocks: int32):
        """Per-tensor and row-wise scales: a scale per row of the kernel's A and per row of its B (its C's
        columns). A per-tensor scale is a row-wise one whose stride is 0; where both strides are 0, `scaled`
        takes their product."""
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
        self.store_part(warpgroup, acc, tile_m, tile_n)
        self.pass_turn(warpgroup)

    def store_part(self, warpgroup: int, acc: RegisterTensor, tile_m: int32, tile_n: int32):
        """The epilogue's stores of 64 rows, part ``warpgroup`` of the tile (a two-part consumer stores two)."""
        offset_m = self.block_m * tile_m + warpgroup * self.consumer_m
        offset_n = self.block_n * tile_n
        c = self.scaled(warpgroup, acc, tile_m, tile_n).to(self.out_dtype)
        if self.takes_turns:  # the tile at once: its one or two boxes seen as one consumer_m x block_n tile
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


# The block-wise kernel: the same tiles but the 256-wide ones (the running sum and a K block's
# partial are 2 x 128 registers a thread at 64 x 256, more than the 232 a consumer can
# have), and 128 x 64 for the shapes with few 128 x 128 tiles. 192 x 128: three consumer
# warpgroups, so that two others' wgmmas run while one promotes (2 x 64 of the 152
# registers each can have; 4 slots of 40 KiB), stream-K too (at M = N = 4096, 22 x 32 = 704 such
# tiles are 5.33 waves of 132 SMs). A tile's columns lie in one 128-row block of B's scales
# (block_n divides 128), a warpgroup's 64 rows in one of A's with swap_ab. 256 x 128: two
# consumers, each promoting its two 64-row parts in turn (two sums and one partial, 3 x 64 of
# its 232 registers; 4 slots of 48 KiB and a 16 KiB s_c).
BLOCKWISE_TILES = [
    [256, 128, 128, 4, 1, False, False], [256, 128, 128, 4, 2, False, False],
    [192, 128, 128, 4, 1, False, False], [192, 128, 128, 4, 2, False, False],
    [192, 128, 128, 4, 1, False, True], [192, 128, 128, 4, 2, False, True],
    [128, 128, 128, 6, 1, False, False], [128, 128, 128, 6, 2, False, False],
    [128, 128, 128, 6, 1, False, True], [128, 128, 128, 6, 2, False, True],
    [128, 64, 128, 8, 1, False, False], [128, 64, 128, 8, 1, False, True],
    [128, 16, 256, 6, 1, True, False], [128, 16, 256, 6, 1, True, True],
    [64, 16, 256, 10, 1, True, False], [64, 16, 256, 10, 1, True, True],
    [64, 64, 256, 6, 1, True, False], [64, 64, 256, 6, 1, True, True],
]


@tilus.autotune("block_m, block_n, block_k, stages, cluster_m, swap_ab, stream_k", BLOCKWISE_TILES)
@tilus.autotune("group_m", [8])
class HopperMatmulV11Blockwise(HopperMatmulV11):
    _autotune_space = {}  # its own space, not added to HopperMatmulV11's
    promotes = True

    def scale_views(self, ptr_a: void_p, a_0: int32, a_1: int32, ptr_b: void_p, b_0: int32, b_1: int32,
                    rows_a: int32, rows_b: int32, k_blocks: int32):
        """Activations' scales a (row, K block) each, weights' a (128 rows, K block) each: with swap_ab
        the weights are the kernel's A, and the activations' scales are read as K blocks x rows."""
        if self.swap_ab:
            # the weights' scales, one a box for the tile's 128-row block, stored into the slot by the TMA
            # warp; the activations', M-major, a TMA box of k_boxes K blocks x block_n
            self.g_scale_rows = self.global_view(ptr_a, dtype=float32, shape=[cdiv(rows_a, 128), k_blocks],
                                                 strides=[a_0, a_1])
            self.g_scale_cols = self.global_view(ptr_b, dtype=float32, shape=[k_blocks, rows_b], strides=[b_1, 1])
            self.s_scale_rows = self.shared_tensor(dtype=float32, shape=[self.stages, self.k_boxes, 32, 1, 1])
            self.s_scale_cols = self.shared_tensor(dtype=float32, shape=[self.stages, self.k_boxes, self.block_n])
        else:
            # the activations' scales M-major (matmul below makes them so): a K block's block_m of them
            # are one TMA box, loaded into the slot with its A and B; the column scale, one a K block, is
            # stored there by the TMA warp, in 128 bytes (TMA's alignment for the boxes beside it)
            self.g_scale_rows = self.global_view(ptr_a, dtype=float32, shape=[k_blocks, rows_a], strides=[a_1, 1])
            self.g_scale_cols = self.global_view(ptr_b, dtype=float32, shape=[cdiv(rows_b, 128), k_blocks],
                                                 strides=[b_0, b_1])
            self.s_scale_rows = self.shared_tensor(dtype=float32, shape=[self.stages, 1, self.block_m])
            self.s_scale_cols = self.shared_tensor(dtype=float32, shape=[self.stages, 32, 1, 1])

    load_operands = HopperMatmulV11.load_piece  # a Script method cannot call super()

    def load_piece(self, tile_m: int32, tile_n: int32, k_begin: int32, k_end: int32):
        """Each slot also brings its K blocks' scales, so a consumer reads them from shared memory, not
        from global memory in its K loop. swap_ab tiles: v10's loads, acquire_slot (below) adding the scales.

        Plain tiles, one K block a slot: the column scale is loaded a K block ahead and stored, by the
        thread that then arrives, before the arrival that completes the slot's phase (producer_acquire's,
        split in two): the arrival's release covers the store. (A TMA box of four column scales faults on
        the H100: one thread stores the one float.)
        """
        if self.swap_ab:
            self.load_operands(tile_m, tile_n, k_begin, k_end)
        else:  # one K block a slot (block_k 128)
            col_block = self.block_n * tile_n // 128
            cols = self.load_global(self.g_scale_cols, offsets=[col_block, k_begin], shape=[1, 1])
            for k_block in self.range(k_begin, k_end, 1):
                self.pipe.producer_wait()
                with self.single_thread():
                    self.store_shared(self.s_scale_cols[self.pipe.producer_stage, 0], cols)
                    self.mbarrier.arrive_and_expect_tx(
                        self.pipe.producer_barrier(), self.s_a[0].nbytes + self.s_b[0].nbytes + self.s_scale_rows[0].nbytes
                    )
                self.load_slot(tile_m, tile_n, k_block * self.block_k)
                self.tma.global_to_shared(src=self.g_scale_rows, dst=self.s_scale_rows[self.pipe.producer_stage],
                                          offsets=[k_block, self.block_m * tile_m], mbarrier=self.pipe.producer_barrier())
                cols = self.load_global(self.g_scale_cols, offsets=[col_block, k_block + 1], shape=[1, 1])
                self.pipe.producer_advance()

    def acquire_slot(self, tile_m: int32, tile_n: int32, k_block: int32):
        """swap_ab tiles: the slot's scales with its A and B. The weights' (one a box) are stored, as the
        plain tiles' column scale, by the thread that then arrives; the activations' come by TMA."""
        self.pipe.producer_wait()
        for box in range(self.k_boxes):
            rows = self.load_global(self.g_scale_rows, offsets=[self.block_m * tile_m // 128, k_block * self.k_boxes + box],
                                    shape=[1, 1])
            with self.single_thread():
                self.store_shared(self.s_scale_rows[self.pipe.producer_stage, box, 0], rows)
        with self.single_thread():
            self.mbarrier.arrive_and_expect_tx(
                self.pipe.producer_barrier(), self.s_a[0].nbytes + self.s_b[0].nbytes + self.s_scale_cols[0].nbytes
            )
        self.tma.global_to_shared(src=self.g_scale_cols, dst=self.s_scale_cols[self.pipe.producer_stage],
                                  offsets=[k_block * self.k_boxes, self.block_n * tile_n], mbarrier=self.pipe.producer_barrier())

    def block_scales(self, warpgroup: int, box: int32):
        """The scales of the slot's K block ``box`` for this warpgroup's rows and the tile's columns, from the slot
        (one of them a 1 x 1)."""
        if self.swap_ab:
            rows = self.load_shared(self.s_scale_rows[self.pipe.consumer_stage, box, 0])
            cols = self.load_shared(self.reshape_shared(self.s_scale_cols[self.pipe.consumer_stage, box], [1, self.block_n]))
            # each thread its own columns of the wgmma accumulator, in every row: a 1 x block_n load in tilus's
            # own layout leaves threads idle, a divergent path beside the wgmma that ptxas serialises (C7520)
            self.annotate_layout(cols, register_layout(shape=[1, self.block_n], mode_shape=[self.block_n // 8, 4, 2],
                                                       spatial_modes=[-4, -8, 1], local_modes=[0, 2]))
        else:  # in the slot
            s_rows = self.reshape_shared(self.s_scale_rows[self.pipe.consumer_stage], [self.parts, self.consumer_m, 1])
            rows = self.load_shared(s_rows[warpgroup])
            cols = self.load_shared(self.s_scale_cols[self.pipe.consumer_stage, 0])
        return rows, cols

    def mma(self, warpgroup: int, tile_m: int32, tile_n: int32, k_begin: int32, k_end: int32):
        """Each 128-column K block into a fresh partial, scaled and added to the running fp32 sum (the promotion)."""
        acc = self.register_tensor(dtype=float32, shape=[self.consumer_m, self.block_n], init=0.0)
        for k_block in self.range(k_begin, k_end, 1):
            self.pipe.consumer_acquire()
            for box in range(self.k_boxes):
                partial = self.register_tensor(dtype=float32, shape=[self.consumer_m, self.block_n])
                self.wgmma.fence()
                self.mma_box(warpgroup, box, partial)
                rows, cols = self.block_scales(warpgroup, box)  # during the wgmma
                self.wgmma.wait_group(0)  # the partial is final: meanwhile the other warpgroups' wgmmas run
                # one FFMA an element, the row and column scales multiplied first (partial * rows * cols is two multiplies)
                self.add(acc, partial * (rows * cols), out=acc)
            self.pipe.consumer_advance()
            self.pipe.consumer_release_previous_in_cluster(self.cluster_m, self.rank)  # the slot just read
        return acc

    def promote(self, part: int, acc: RegisterTensor, partial: RegisterTensor):
        """The slot's K block for 64-row part ``part`` into ``partial`` (overwritten), scaled and added to ``acc``."""
        self.wgmma.fence()
        self.mma_box(part, 0, partial)
        rows, cols = self.block_scales(part, 0)  # during the wgmma
        self.wgmma.wait_group(0)  # the partial is final: meanwhile the other warpgroup's wgmmas run
        self.add(acc, partial * (rows * cols), out=acc)

    def consumer_two_parts(self, warpgroup: int):
        """256-row tiles: two consumers, each two 64-row parts (a sum each), promoted part after part, so that the
        other consumer's wgmmas run while one promotes; the parts go out in turn through the shared s_c."""
        with self.thread_group(thread_begin=128 * warpgroup, num_threads=128):
            setmaxnreg(self.consumer_registers, "inc")
            self.pipe.consumer_start()
            c_phase: uint32 = 1 if warpgroup == 0 else 0
            for item in self.scheduler.items():
                tile_m, tile_n, k_begin, k_end = self.scheduler.work(item)
                acc = self.register_tensor(dtype=float32, shape=[self.consumer_m, self.block_n], init=0.0)
                acc_2 = self.register_tensor(dtype=float32, shape=[self.consumer_m, self.block_n], init=0.0)
                # one partial for both parts: 3 x 64 registers a thread of the 232
                partial = self.register_tensor(dtype=float32, shape=[self.consumer_m, self.block_n])
                for k_block in self.range(k_begin, k_end, 1):
                    self.pipe.consumer_acquire()
                    self.promote(2 * warpgroup, acc, partial)
                    self.promote(2 * warpgroup + 1, acc_2, partial)
                    self.pipe.consumer_advance()
                    self.pipe.consumer_release_previous_in_cluster(self.cluster_m, self.rank)
                self.mbarrier.wait(self.s_c_free[warpgroup], phase=c_phase)
                c_phase ^= 1
                self.store_part(2 * warpgroup, acc, tile_m, tile_n)
                with self.single_warp():
                    self.tma.wait_group(n=0, read=True)  # the first part has left s_c
                self.sync()
                self.store_part(2 * warpgroup + 1, acc_2, tile_m, tile_n)
                self.pass_turn(warpgroup)
            with self.single_warp():
                self.tma.wait_group(n=0)

    def mma_box(self, warpgroup: int, box: int32, partial: RegisterTensor):
        """The slot's K block ``box`` into ``partial``, one commit group: mma_fresh's first K step overwrites the
        partial (no zeroing: wgmma_fresh.py)."""
        s_b_box = self.reshape_shared(self.s_b[self.pipe.consumer_stage, box], [self.block_n, BOX_K])
        mma_fresh(self.s_a[self.pipe.consumer_stage, box, warpgroup], s_b_box.transpose(), partial)
        self.wgmma.commit_group()

    def mma_slot_in_flight(self, warpgroup: int, tile_m: int32, tile_n: int32, k_begin: int32, k_end: int32):
        """swap_ab tiles (decode): a slot's two K blocks (block_k 256) into a partial each, both in flight, each
        promoted once its own wgmmas have finished. A 16- or 64-wide tile has registers to spare, and its one
        warpgroup would otherwise wait on each K block in turn."""
        acc = self.register_tensor(dtype=float32, shape=[self.consumer_m, self.block_n], init=0.0)
        for k_block in self.range(k_begin, k_end, 1):
            self.pipe.consumer_acquire()
            first = self.register_tensor(dtype=float32, shape=[self.consumer_m, self.block_n])
            second = self.register_tensor(dtype=float32, shape=[self.consumer_m, self.block_n])
            self.wgmma.fence()
            self.mma_box(warpgroup, 0, first)
            self.mma_box(warpgroup, 1, second)
            rows, cols = self.block_scales(warpgroup, 0)
            rows_2, cols_2 = self.block_scales(warpgroup, 1)
            self.wgmma.wait_group(1)  # the first K block's wgmmas have finished, the second's may run on
            self.add(acc, first * (rows * cols), out=acc)
            self.wgmma.wait_group(0)
            self.add(acc, second * (rows_2 * cols_2), out=acc)
            self.pipe.consumer_advance()
            self.pipe.consumer_release_previous_in_cluster(self.cluster_m, self.rank)
        return acc

    def scaled(self, warpgroup: int, acc: RegisterTensor, tile_m: int32, tile_n: int32) -> RegisterTensor:
        return acc  # scaled K block by K block already


# Per-tensor and row-wise scales with the promotion (matmul's accumulate="promoted"), as precise as
# torch._scaled_mm's default: the block-wise K loop with every K block's scale 1, and v10's scales
# on the finished sum. The block-wise kernel's tiles.
@tilus.autotune("block_m, block_n, block_k, stages, cluster_m, swap_ab, stream_k", BLOCKWISE_TILES)
@tilus.autotune("group_m", [8])
class HopperMatmulV11Promoted(HopperMatmulV11Blockwise):
    _autotune_space = {}
    scale_views = HopperMatmulV11.scale_views  # a scale per row and per column, as v10's
    load_piece = HopperMatmulV11.load_piece  # the slots bring no scales
    acquire_slot = HopperMatmulV11.acquire_slot

    def block_scales(self, warpgroup: int, box: int32):
        """Every K block's partial is added as it is: the promotion alone."""
        return 1.0, 1.0

    def scaled(self, warpgroup: int, acc: RegisterTensor, tile_m: int32, tile_n: int32) -> RegisterTensor:
        """The promoted sum times its rows' and columns' scales, both loaded from global memory: the promotion,
        not the epilogue, bounds this kernel."""
        rows = self.load_global(self.g_scale_rows, offsets=[self.block_m * tile_m + warpgroup * self.consumer_m, 0],
                                shape=[self.consumer_m, 1])
        cols = self.load_global(self.g_scale_cols, offsets=[0, self.block_n * tile_n], shape=[1, self.block_n])
        return acc * rows * cols


KERNELS = support.kernels("v11", hopper=HopperMatmulV11)
BLOCKWISE_KERNELS = support.kernels("v11", hopper=HopperMatmulV11Blockwise, table="BLOCKWISE_KERNELS")
# Hopper only: blackwell/matmul_v11.py has no promoted kernel for per-tensor and row-wise scales
PROMOTED_KERNELS = support.kernels("v11", hopper=HopperMatmulV11Promoted, table="PROMOTED_KERNELS")


def matmul(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
           out: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16,
           accumulate: str | None = None) -> torch.Tensor:
    """C = (A * scale_a) @ (B * scale_b).T for fp8 e4m3 A (M x K) and B (N x K), fp32 accumulation, C bf16 or fp16.

    The scaling is read from the float32 scales' shapes: one value each (per-tensor);
    scale_a M x 1 and scale_b N x 1 (row-wise); scale_a M x ceil(K / 128) and scale_b
    ceil(N / 128) x ceil(K / 128) (block-wise, 1 x 128 and 128 x 128). ``quantize`` makes
    them; block-wise scale_a is read M-major, as ``quantize`` returns it (other layouts are copied
    each call). Per-tensor and row-wise scales run v10's kernel unless ``accumulate`` is
    "promoted": then each K block's sum is added into fp32, as torch._scaled_mm's default
    does (more precise; its cost: docs/v11.md#precision); "fast" or None keeps v10's. C is
    ``out_dtype``, or the dtype of ``out`` where one is given. Raises TypeError/ValueError
    naming the rule for input the kernels cannot take.
    """
    return scaled.launch(KERNELS, BLOCKWISE_KERNELS, a, b, scale_a, scale_b, out, out_dtype, accumulate,
                         PROMOTED_KERNELS)


quantize = scaled.quantize


if __name__ == "__main__":
    # a first run: block-wise at a square and at decode; --full: every scaling, promoted and (v10's) fast, and v9 in bf16
    sys.exit(scaled.main("v11", KERNELS, BLOCKWISE_KERNELS, matmul, promoted_kernels=PROMOTED_KERNELS,
                         beside="matmul_v10", bf16="matmul_v9",
                         default=[((4096, 4096, 4096), ("block",)), ((64, 14336, 4096), ("block",))]))
