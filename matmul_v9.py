"""v9: decode. Swapped operands put a few tokens on wgmma's N, and K blocks of two boxes.

At decode, M is 1 to 64 tokens and the weights (N x K) are the bytes to stream. A 128-row
tile would be mostly zeros: with swap_ab the kernel computes C^T = B A^T, so the weights
fill wgmma's M and the tokens its N (16 or 64), and the epilogue stores the tile transposed.
A slot holds a K block of 128 columns, two TMA boxes, so each weight row is read 256 bytes
at a time; 64-row tiles have one consumer warpgroup, which doubles the tiles for stream-K to
spread. Fewer tiles than SMs make stream-K a split-K: every SM takes a range of K blocks.

Constraints as in v1. Run: python matmul_v9.py [--sizes ...] [--check-only] [--compile-only]
Walkthrough: docs/v9.md
"""

import sys

import tilus
import torch
from tilus import DataType, RegisterTensor, boolean, float16, float32, int32, uint32, void_p
from tilus.hidet.ir.expr import if_then_else
from tilus.hidet.ir.primitives.cuda.setmaxnreg import setmaxnreg
from tilus.ir.layout.shared_layout import Swizzle, shared_layout
from tilus.utils import cdiv

import support
from pipeline import Pipeline
from schedulers import MAX_SHARERS, StreamKTileScheduler, launch_blocks

# columns of an operand's TMA box: 128 B of fp16 or bf16, the widest the 128-byte swizzle takes;
# a K block of block_k columns is block_k // BOX_K boxes side by side
BOX_K = 64

# v8's tiles, and four for decode (swap_ab): 128 or 64 weight rows by 16 or 64 tokens, K
# blocks of 128 columns (two TMA boxes), and deep rings: 128 x 16 in 6 x (32 + 4) = 216 KiB,
# 128 x 64 in 4 x (32 + 16) = 192 KiB, 64 x 16 in 10 x (16 + 4) = 200 KiB (an eleventh would
# fit; not tried), 64 x 64 in 6 x (16 + 16) = 192 KiB. 64-row tiles have one consumer warpgroup: at
# N = 4096 they make 64 tiles where 128 rows make 32, so stream-K spreads the weights over 128
# SMs, not 64. Last, cuBLAS's tile at M = 128: 64 x 128 in clusters of two sharing B's tile, 8 stages of
# 24 KiB. At 128 x 8192 x 8192, L2 then serves B's 128 MiB once plus 1 MiB of A to each of 128 CTAs
# (256 MiB); 128 x 64 tiles take B once plus all 2 MiB of A to each of 128 CTAs (384 MiB). And
# 128 x 256 in clusters of four sharing B: L2 serves (4 x 128 + 256) / (4 x 128 x 256) = 0.0059
# operand elements an output each K step, a quarter less than pairs' (2 x 128 + 256) / (2 x 128 x 256) = 0.0078.
@tilus.autotune("block_m, block_n, block_k, stages, cluster_m, swap_ab, stream_k", [
    [128, 256, 64, 4, 1, False, False], [128, 256, 64, 4, 2, False, False],
    [128, 256, 64, 4, 2, False, True],
    [128, 224, 64, 4, 1, False, False], [128, 224, 64, 4, 2, False, False],
    [128, 128, 64, 6, 1, False, False], [128, 128, 64, 6, 2, False, False],
    [128, 128, 64, 6, 1, False, True], [128, 128, 64, 6, 2, False, True],
    [128, 64, 64, 8, 1, False, False], [128, 64, 64, 8, 1, False, True],
    [128, 16, 128, 6, 1, True, False], [128, 16, 128, 6, 1, True, True],
    [128, 64, 128, 4, 1, True, False], [128, 64, 128, 4, 1, True, True],
    [64, 16, 128, 10, 1, True, False], [64, 16, 128, 10, 1, True, True],
    [64, 64, 128, 6, 1, True, False], [64, 64, 128, 6, 1, True, True],
    [64, 128, 64, 8, 2, False, False],
    [128, 256, 64, 4, 4, False, False],
])
@tilus.autotune("group_m", [8])
class HopperMatmulV9(tilus.Script):
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
        dtype: DataType = float16,
    ):
        super().__init__()
        self.dtype = dtype  # float16 or bfloat16: A, B and C
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
        self.register_split = self.owner_starts_from_partial
        # the output tile's TMA boxes: 64 columns (128 bytes) where they divide the tile, else 32
        self.box_n = 64 if block_n % 64 == 0 else 32
        self.k_boxes = block_k // BOX_K  # TMA boxes per operand per slot
        # a CTA's loads of B go to every CTA of its cluster
        self.multicast_mask = (1 << cluster_m) - 1 if cluster_m > 1 else None
        if swap_ab:
            self.output_tile = self.output_tile_transposed
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
        cluster4_sms: int32,
    ):
        # 2. operands. With swap_ab the kernel computes C^T = B A^T: its A is the caller's B and
        # its M the caller's N; only the epilogue, which stores the tile transposed, knows
        self.g_c = self.global_view(c_ptr, dtype=self.dtype, shape=[m_size, n_size])
        swapped, plain = (b_ptr, a_ptr, n_size, m_size), (a_ptr, b_ptr, m_size, n_size)
        ptr_a, ptr_b, rows_a, rows_b = swapped if self.swap_ab else plain
        self.g_a = self.global_view(ptr_a, dtype=self.dtype, shape=[rows_a, k_size])
        self.g_b = self.global_view(ptr_b, dtype=self.dtype, shape=[rows_b, k_size])
        num_m = cdiv(rows_a, self.block_m)
        num_n = cdiv(rows_b, self.block_n)
        # a unit of work: cluster_m tiles stacked in M, one per CTA of a cluster, sharing B
        num_units_m = cdiv(num_m, self.cluster_m)
        num_units = num_units_m * num_n
        # a cluster runs on one GPC, and GPCs differ in size: clusters of four may not fill every SM
        # (support.gpu.cluster_sms asks the driver), and a launch of more runs the extra ones last
        sms = cluster4_sms if self.cluster_m == 4 else num_sms
        self.attrs.blocks = launch_blocks(num_units, sms, self.cluster_m, self.stream_k)
        self.attrs.cluster_blocks = self.cluster_m
        # one or two consumer warpgroups, then the producer warp (a warpgroup with the register split)
        self.attrs.warps = 4 * self.consumers + (4 if self.register_split else 1)
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
        # one output tile for both consumers, in turn, as in v4
        self.s_c = self.output_tile()

        # 3. barriers: a slot is free once both consumer warpgroups of every CTA that reads it let go
        self.pipe = Pipeline(self.stages, consumer_arrivals=self.consumers * self.cluster_m)
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

        # 4. the K loop of every piece, one per role: the producer, each consumer
        self.producer()
        self.consumer(0)
        if self.consumers == 2:
            self.consumer(1)

        if self.cluster_m > 1:
            self.cluster.sync()  # stay until the peer has stopped writing into our slots and barriers

    def output_tile(self):
        """s_c in 64-column boxes, each with TMA's 128-byte swizzle: no bank conflicts, a TMA store per box."""
        # row r's 16-byte chunk c sits at chunk c ^ (r % 8), so the 8 rows an stmatrix writes
        # hit 8 different bank groups; a 32-column box (64-byte rows, two to a bank line)
        # takes TMA's 64-byte swizzle, chunk c ^ (r // 2 % 4), conflict free as well
        return self.swizzled_boxes(self.block_n // self.box_n, self.consumer_m, self.box_n)

    def output_tile_transposed(self):
        """swap_ab: a warpgroup's tile is block_n rows of C (the caller's M) by its 64 columns: one box."""
        return self.swizzled_boxes(1, self.block_n, 64)

    def swizzled_boxes(self, boxes: int, rows: int, box_n: int):
        swizzle = Swizzle(base=3, bits=3, shift=3) if box_n == 64 else Swizzle(base=3, bits=2, shift=3)
        s_c = self.shared_tensor(dtype=self.dtype, shape=[boxes, rows, box_n])
        self.annotate_layout(s_c, shared_layout(
            shape=[boxes, rows, box_n], mode_shape=[boxes, rows, box_n], mode_strides=[rows * box_n, box_n, 1],
            optional_swizzle=swizzle,
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
            c_phase: uint32 = 1 - warpgroup  # warpgroup 0 writes s_c first
            for item in self.scheduler.items():
                tile_m, tile_n, k_begin, k_end = self.scheduler.work(item)
                acc = self.mma(warpgroup, k_begin, k_end)

                # 5. the piece's end: the consumers take turns with s_c
                self.mbarrier.wait(self.s_c_free[warpgroup], phase=c_phase)
                c_phase ^= 1
                if self.stream_k:
                    self.end_piece(warpgroup, acc, tile_m, tile_n, k_begin, k_end)
                else:
                    self.epilogue(warpgroup, acc, tile_m, tile_n)

    def mma(self, warpgroup: int, k_begin: int32, k_end: int32):
        """This warpgroup's rows of one piece, K blocks k_begin to k_end, into a fresh accumulator."""
        if self.owner_starts_from_partial:
            acc = self.start_from_partial(warpgroup, k_begin, k_end)
        else:
            acc = self.register_tensor(dtype=float32, shape=[self.consumer_m, self.block_n], init=0.0)
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
        # Hopper's flush: the accumulator is final only now, and the piece's last slot is free
        self.wgmma.wait_group(0)
        self.pipe.consumer_release_previous_in_cluster(self.cluster_m, self.rank)
        return acc

    def end_piece(self, warpgroup: int, acc: RegisterTensor, tile_m: int32, tile_n: int32, k_begin: int32,
                  k_end: int32):
        """A stream-K piece's end: its sum to the workspace, or the tile, with its sharers' sums added, to C."""
        if k_end < self.scheduler.k_blocks:
            self.save_partial(warpgroup, acc)  # the tile's owner adds it
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

    def epilogue(self, warpgroup: int, acc: RegisterTensor, tile_m: int32, tile_n: int32):
        """Registers -> the swizzled s_c -> global, one TMA store per box; then s_c is the next one's."""
        offset_m = self.block_m * tile_m + warpgroup * self.consumer_m
        offset_n = self.block_n * tile_n
        # the boxes seen as one consumer_m x block_n tile: the store is v5's
        s_c_rows = self.reshape_shared(self.s_c.permute([1, 0, 2]), [self.consumer_m, self.block_n])
        self.store_shared(s_c_rows, acc.to(self.dtype))
        self.store_output(warpgroup, offset_m, offset_n)

    def epilogue_transposed(self, warpgroup: int, acc: RegisterTensor, tile_m: int32, tile_n: int32):
        """swap_ab: the tile is C^T's, so it goes to s_c transposed (stmatrix .trans), then to C as one box."""
        self.store_shared(self.s_c[0], self.transpose(acc.to(self.dtype)))
        self.store_output(warpgroup, self.block_n * tile_n, self.block_m * tile_m + warpgroup * self.consumer_m)

    def store_output(self, warpgroup: int, offset_m: int32, offset_n: int32):
        """s_c's boxes to C from (offset_m, offset_n) on, by TMA; once read, s_c is the next warpgroup's."""
        # generic-proxy stores must be made visible to the async proxy (TMA) before it reads s_c
        self.fence.proxy_async(space="shared")
        self.sync()  # this warpgroup only (a named barrier)
        with self.single_warp():
            for box in range(self.s_c.shape[0]):
                self.tma.shared_to_global(
                    self.s_c[box], self.g_c, offsets=[offset_m, offset_n + box * self.s_c.shape[2]], dims=[0, 1]
                )
            self.tma.commit_group()
            self.tma.wait_group(n=0, read=True)  # the TMA engine has read s_c: the next writer may go
            with self.single_thread():
                self.release_s_c(warpgroup)

    def release_s_c(self, warpgroup: int):
        """Hand s_c to the next warpgroup (the other of two, or itself); this one goes on to its next tile."""
        self.mbarrier.arrive(self.s_c_free[self.next_consumer(warpgroup)])


KERNELS = support.kernels("v9", hopper=HopperMatmulV9)


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """C = A @ B.T for A (M x K) and B (N x K) on a Hopper GPU, fp32 accumulation.

    A, B and C are all fp16 or all bf16. The stream-K schedules use one workspace per GPU:
    calls on two streams of one GPU must not run at the same time.

    Raises TypeError/ValueError naming the rule for input the kernels cannot take.
    """
    return support.launch(KERNELS, a, b, out)


if __name__ == "__main__":
    sys.exit(support.main("v9", KERNELS, matmul))
