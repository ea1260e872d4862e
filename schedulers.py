"""Tile schedulers: which tiles of C a block computes, and in what order.

A kernel's main loop only needs to know where its tile starts; which tile that is, and
in what order the blocks visit tiles, is the scheduler's business. CUTLASS keeps the two
apart the same way (a tile scheduler beside the main loop, persistent or stream-K), and
so do the versions from v4 on, which import what they need from here:

- ``GroupedTileOrder`` (v4 on): tiles visited group_m tile rows at a time, so that the
  blocks in flight share their A and B tiles in L2.
- ``persistent_blocks`` and ``PersistentTileScheduler`` (v5): one block per SM, and the walk
  each block (each cluster) takes over the units of work, in grouped order.
"""

import tilus
from tilus import int32
from tilus.hidet.ir.expr import if_then_else


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


class PersistentTileScheduler(GroupedTileOrder, tilus.Class):
    """The units of work of one cluster of a persistent kernel, and this CTA's tile of each.

    A unit is cluster_m tiles stacked in M, one per CTA of the cluster, which share their
    B tiles. The launch has unit_step clusters; cluster c takes units c, c + unit_step,
    c + 2 unit_step, ... of the grouped order. Every role walks the same units, each with
    its own copy of the loop:

        for unit in scheduler.units():
            tile_m, tile_n = scheduler.tile(unit)
    """

    def __init__(self, num_units_m: int32, num_n: int32, num_units: int32, group_m: int, cluster_m: int, rank: int32):
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
