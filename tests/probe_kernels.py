"""Small kernels that test one piece of a version on its own: the Pipeline ring and the tile order."""

import tilus
from tilus import float16, int32

from pipeline import Pipeline
from schedulers import GroupedTileOrder, StreamKTileScheduler

TILE = 64  # rows and columns of one slot of PipelineCopy


class PipelineCopy(tilus.Script):
    """Copy `steps` 64 x 64 tiles through a Pipeline of `stages` slots, one TMA load per step.

    A producer warp loads tile i into slot producer_stage; a consumer warpgroup reads the
    slot, writes it to the destination and frees it (advance, then release the previous
    slot: the one just read). Every thread arrives after its own reads. With steps much larger than stages, every barrier goes
    through many phases: a wrong initial phase, arrival count or flip deadlocks the
    block, a slot freed too early gets overwritten before it is read.
    """

    def __init__(self, stages: int):
        super().__init__()
        self.stages = stages

    def __call__(self, steps: int32, src_ptr: ~float16, dst_ptr: ~float16):
        self.attrs.blocks = 1
        self.attrs.warps = 5  # consumer warpgroup (warps 0-3) + producer warp (warp 4)
        g_src = self.global_view(src_ptr, dtype=float16, shape=[steps * TILE, TILE])
        g_dst = self.global_view(dst_ptr, dtype=float16, shape=[steps * TILE, TILE])
        s_tiles = self.shared_tensor(dtype=float16, shape=[self.stages, TILE, TILE])
        pipe = Pipeline(self.stages, consumer_arrivals=128)

        with self.thread_group(thread_begin=128, num_threads=32):
            pipe.producer_start()
            for step in self.range(steps):
                pipe.producer_acquire(transaction_bytes=s_tiles[0].nbytes)
                self.tma.global_to_shared(
                    src=g_src, dst=s_tiles[pipe.producer_stage], offsets=[step * TILE, 0], mbarrier=pipe.producer_barrier()
                )
                pipe.producer_advance()

        with self.thread_group(thread_begin=0, num_threads=128):
            pipe.consumer_start()
            for step in self.range(steps):
                pipe.consumer_acquire()
                tile = self.load_shared(s_tiles[pipe.consumer_stage])
                self.store_global(g_dst, tile, offsets=[step * TILE, 0])
                pipe.consumer_advance()
                pipe.consumer_release_previous()


@tilus.autotune("group_m", [1, 8, 16, 32])
class TileOrderProbe(GroupedTileOrder, tilus.Script):
    """Each block writes its launch index into the cell of the tile grouped_tile gave it."""

    def __init__(self, group_m: int):
        super().__init__()
        self.group_m = group_m

    def __call__(self, num_m: int32, num_n: int32, order_ptr: ~int32):
        self.attrs.blocks = num_m * num_n
        self.attrs.warps = 1
        tile_m, tile_n = self.grouped_tile(self.blockIdx.x, num_m, num_n)
        g_order = self.global_view(order_ptr, dtype=int32, shape=[num_m, num_n])
        with self.single_thread():
            launched: int32 = self.blockIdx.x
            index = self.register_tensor(dtype=int32, shape=[1, 1], init=lambda i, j: launched)
            self.store_global(g_order, index, offsets=[tile_m, tile_n])



class StreamKProbe(tilus.Script):
    """One block per worker: for each K block of each piece it is given, write its worker number into the cell.

    An owner piece (the tile's last K block, not its first) also writes the first sharer it will wait for.
    """

    def __init__(self, group_m: int, max_sharers: int):
        super().__init__()
        self.group_m = group_m
        self.max_sharers = max_sharers

    def __call__(self, num_m: int32, num_n: int32, k_blocks: int32, workers: int32, cover_ptr: ~int32,
                 first_ptr: ~int32):
        self.attrs.blocks = workers
        self.attrs.warps = 1
        g_cover = self.global_view(cover_ptr, dtype=int32, shape=[num_m, num_n, k_blocks])
        g_first = self.global_view(first_ptr, dtype=int32, shape=[num_m, num_n])
        scheduler = StreamKTileScheduler(num_m, num_n, num_m * num_n, k_blocks, self.group_m, 1, 0, True,
                                         self.max_sharers)
        with self.single_thread():
            worker: int32 = scheduler.worker
            for item in scheduler.items():
                tile_m, tile_n, k_begin, k_end = scheduler.work(item)
                for k_block in self.range(k_begin, k_end, 1):
                    mark = self.register_tensor(dtype=int32, shape=[1, 1, 1], init=lambda i, j, k: worker)
                    self.store_global(g_cover, mark, offsets=[tile_m, tile_n, k_block])
                if k_begin > 0:
                    if k_end == k_blocks:
                        first: int32 = scheduler.first_sharer()
                        held = self.register_tensor(dtype=int32, shape=[1, 1], init=lambda i, j: first)
                        self.store_global(g_first, held, offsets=[tile_m, tile_n])
