"""Tile schedulers: which tiles of C a block computes, and in what order.

A kernel's main loop only needs to know where its tile starts; which tile that is, and
in what order the blocks visit tiles, is the scheduler's business. CUTLASS keeps the two
apart the same way (a tile scheduler beside the main loop, persistent or stream-K), and
so do the versions from v4 on, which import what they need from here:

- ``GroupedTileOrder`` (v4 on): tiles visited group_m tile rows at a time, so that the
  blocks in flight share their A and B tiles in L2.
- ``persistent_blocks`` and ``PersistentTileScheduler`` (v5 to v7): one block per SM, and the walk
  each block (each cluster) takes over the units of work, in grouped order.
- ``launch_blocks``, ``MAX_SHARERS`` and ``StreamKTileScheduler`` (v8 on): all but the last
  whole wave data-parallel, the rest cut along K into equal ranges, one per worker, and
  the pieces of tiles each worker computes.
"""

import tilus
from tilus import int32
from tilus.hidet.ir.expr import if_then_else
from tilus.utils import cdiv


class GroupedTileOrder:
    """The tile a block computes when blocks visit tiles group_m tile rows at a time."""

    def grouped_tile(self, index: int32, num_m: int32, num_n: int32):
        """(row, column) of the index-th tile visited in a grid of num_m x num_n tiles.

        Group g holds tile rows g * group_m onward and every column; inside it, tile i
        is row i % group_m of column i // group_m, so consecutive blocks walk down a
        column and share its B tile while the group's A tiles stay in L2. The last group
        may have fewer rows. fast_divmod needs divisors fixed for the launch (tilus
        computes its magic numbers on the host), so the last group divides by its own row
        count, never by a variable reassigned in a branch.
        """
        group, in_group = self.fast_divmod(index, self.group_m * num_n)
        first_m = group * self.group_m
        tile_m: int32 = 0
        tile_n: int32 = 0
        if first_m + self.group_m <= num_m:
            tile_n, row = self.fast_divmod(in_group, self.group_m)
            tile_m = first_m + row
        else:
            tile_n, row = self.fast_divmod(in_group, (num_m - 1) % self.group_m + 1)
            tile_m = first_m + row
        return tile_m, tile_n


def persistent_blocks(units: int32, num_sms: int32, cluster: int):
    """Blocks to launch: one per SM (whole clusters only), fewer when there are fewer units of work."""
    clusters = num_sms // cluster
    return if_then_else(units < clusters, units, clusters) * cluster


def launch_blocks(units: int32, num_sms: int32, cluster: int, stream_k: bool):
    """Blocks to launch: with stream-K one per SM (whole clusters only), however few the units, so
    that every SM takes a share of the K blocks; without it ``persistent_blocks``."""
    return num_sms // cluster * cluster if stream_k else persistent_blocks(units, num_sms, cluster)


class PersistentTileScheduler(GroupedTileOrder, tilus.Class):
    """The units of work of one cluster of a persistent kernel, and this CTA's tile of each.

    A unit is cluster_m tiles stacked in M, one per CTA of the cluster, which share their
    B tiles. The launch has unit_step clusters; cluster c takes units c, c + unit_step,
    c + 2 unit_step, ... of the grouped order. Every role walks the same units, each with
    its own copy of the loop:

        for unit in scheduler.units():
            tile_m, tile_n = scheduler.tile(unit)
    """

    def __init__(self, num_units_m: int32, num_n: int32, num_units: int32, group_m: int, cluster_m: int = 1,
                 rank: int32 = 0):
        self.group_m: int = group_m
        self.cluster_m: int = cluster_m
        self.num_units_m = num_units_m
        self.num_n = num_n
        self.num_units = num_units
        self.rank = rank  # this CTA's rank in its cluster
        self.first_unit = self.blockIdx.x // cluster_m
        self.unit_step = self.gridDim.x // cluster_m

    def units(self):
        """This cluster's units: every unit_step-th, from first_unit on."""
        return self.range(self.first_unit, self.num_units, self.unit_step)

    def tile(self, unit: int32):
        """(row, column) of this CTA's tile of the unit: the rank-th of its cluster_m tiles in M."""
        unit_m, tile_n = self.grouped_tile(unit, self.num_units_m, self.num_n)
        return unit_m * self.cluster_m + self.rank, tile_n


MAX_SHARERS = 2  # sharers of a stream-K unit whose sums its owner adds (the owner is not one of them)


class StreamKTileScheduler(GroupedTileOrder, tilus.Class):
    """v8's work of one cluster: whole units data-parallel, then a stream-K share of the rest.

    The units (cluster_m tiles stacked in M) are split in two. The first ``dp_units`` are
    whole waves, dealt out as in ``PersistentTileScheduler``: worker w (cluster w) takes
    units w, w + workers, ... The rest, the last partial wave plus one whole wave, is seen as
    one run of K blocks, ``k_blocks`` per unit, cut into ``sk_workers`` equal ranges (one
    per worker, unless the cap below binds): worker w computes K blocks
    [w * I // sk_workers, (w + 1) * I // sk_workers) of it, I = ``sk_blocks``. With
    fewer units than workers every unit is stream-K: a split-K whose pieces are as even as
    the K blocks allow. Without ``stream_k`` every unit is data-parallel.

    A unit's owner adds the sums of at most ``max_sharers`` sharers, so stream-K uses only as
    many workers as give each a range of at least k_blocks / max_sharers K blocks: with
    ``MAX_SHARERS = 2``, half a unit (decode, 64 x 4096 x 14336 in v9's 128 x 64 tiles with
    128-column K blocks: 32 tiles of 112 K blocks go to 64 workers of 56, not 132 of 27 or
    28), so each weight row is read at two places at once, not more (docs/v9.md).
    ``max_sharers = 1`` (ranges of at least a unit) is for a kernel whose owner starts from
    its one sharer's sum (v8's 128 x 256).
    A range crosses units, so a worker's stream-K work is a run of pieces, each
    (unit, k_begin, k_end) in K blocks:

    - a whole unit (0, k_blocks): stored as in v7;
    - a piece that ends before the unit's last K block: its sum goes to the workspace (the
      entry of this CTA and warpgroup) and the entry's flag is set;
    - a piece that ends at the last K block but starts later (the *owner*'s): the owner
      waits for the flags of the lower workers holding the unit's earlier K blocks, adds
      their sums in the order of the workers, lowest first, and stores the tile.

    The order of the sum is fixed, so the result is the same bits on every run. An owner
    waits only on lower workers (CUDA promises no start order, but the grid is at most one
    CTA per SM, all resident unless another kernel holds SMs), and a worker that leaves a
    sum never waits. A range holds at most two pieces that are not whole units, one at each
    end; a worker takes its pieces last unit first, so the sum a higher worker waits for is
    computed before anything else and the owner's piece comes last.

        for item in scheduler.items():
            tile_m, tile_n, k_begin, k_end = scheduler.work(item)
    """

    def __init__(self, num_units_m: int32, num_n: int32, num_units: int32, k_blocks: int32, group_m: int,
                 cluster_m: int, rank: int32, stream_k: bool, max_sharers: int = MAX_SHARERS):
        self.group_m: int = group_m
        self.cluster_m: int = cluster_m
        self.num_units_m = num_units_m
        self.num_n = num_n
        self.k_blocks = k_blocks
        self.rank = rank
        self.worker = self.blockIdx.x // cluster_m
        self.workers = self.gridDim.x // cluster_m
        dp_units: int32 = num_units
        if stream_k:
            if num_units % self.workers != 0:
                # all but the last whole wave and the partial one: every worker gets at least a unit's K blocks
                dp_units = if_then_else(num_units >= self.workers, (num_units // self.workers - 1) * self.workers, 0)
        self.dp_units = dp_units
        self.sk_blocks = (num_units - dp_units) * k_blocks
        # ranges of at least k_blocks / max_sharers K blocks: a unit then has its owner and at most max_sharers sharers
        most = self.sk_blocks // cdiv(k_blocks, max_sharers)
        self.sk_workers = if_then_else(most < self.workers, if_then_else(most > 0, most, 1), self.workers)
        self.sk_begin = if_then_else(self.worker < self.sk_workers, self.worker * self.sk_blocks // self.sk_workers,
                                     self.sk_blocks)
        self.sk_end = if_then_else(self.worker < self.sk_workers, (self.worker + 1) * self.sk_blocks // self.sk_workers,
                                   self.sk_blocks)
        # data-parallel units w, w + workers, ... below dp_units; then the units the range touches
        self.num_dp = (dp_units - self.worker + self.workers - 1) // self.workers
        self.last_sk_unit = (self.sk_end - 1) // k_blocks
        num_sk: int32 = 0
        if self.sk_end > self.sk_begin:
            num_sk = self.last_sk_unit - self.sk_begin // k_blocks + 1
        self.num_items = self.num_dp + num_sk

    def items(self):
        return self.range(0, self.num_items, 1)

    def work(self, item: int32):
        """(tile_m, tile_n, k_begin, k_end) of this CTA's item-th piece: its tile and K blocks."""
        unit: int32 = 0
        k_begin: int32 = 0
        k_end: int32 = self.k_blocks
        if item < self.num_dp:
            unit = self.worker + item * self.workers
        else:
            sk_unit = self.last_sk_unit - (item - self.num_dp)  # the range's last unit first
            first_block = sk_unit * self.k_blocks
            unit = self.dp_units + sk_unit
            k_begin = if_then_else(self.sk_begin > first_block, self.sk_begin - first_block, 0)
            k_end = if_then_else(self.sk_end < first_block + self.k_blocks, self.sk_end - first_block, self.k_blocks)
        unit_m, tile_n = self.grouped_tile(unit, self.num_units_m, self.num_n)
        return unit_m * self.cluster_m + self.rank, tile_n, k_begin, k_end

    def first_sharer(self):
        """The lowest worker holding K blocks of this worker's owner piece: the one holding the unit's first block.

        The owner piece is the unit where this worker's range begins. Worker v's range
        starts at v * I // sk_workers, so the worker holding K block i is the largest v with
        v * I < (i + 1) * sk_workers.
        """
        first_block = self.sk_begin // self.k_blocks * self.k_blocks
        return ((first_block + 1) * self.sk_workers - 1) // self.sk_blocks
