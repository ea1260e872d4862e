"""v2: a ring of `stages` shared-memory slots, so loads run ahead of the tensor cores.

v1 waits for every load before it multiplies, and for every multiply before it loads. v2
keeps `stages` slots of A and B tiles, each with its own mbarrier. While the tensor cores
work on step i, the TMA engine fetches the next steps into the other slots. The warpgroup
keeps one wgmma in flight: once wait_group(1) proves step i - 1 done, it refills that slot.
Each barrier completes once per trip round the ring, so `phase` flips whenever `stage`
wraps to 0.

Constraints as in v1. Run: python matmul_v2.py [--sizes ...] [--check-only] [--compile-only]
Walkthrough: docs/v2.md
"""

import sys

import tilus
import torch
from tilus import DataType, RegisterTensor, float16, float32, int32, uint32, void_p
from tilus.ir.layout.ops.shared_ops import shared_row_major
from tilus.utils import cdiv

import support


# The accumulator takes block_m * block_n / 128 fp32 registers per thread: at most 128, so
# at most 3 blocks per SM. block_k = 64 as in v1. Shared memory per block is the
# ring, stages * (block_m + block_n) * 64 * 2 B (the output tile reuses it), and blocks per
# SM = 228 KiB / that: 128 x 128 with 2 slots -> 3 blocks, 3 -> 2, 4-6 -> 1 with 3-5
# loads in flight; 64 x 256 (40 KiB slots) with 2 -> 2 blocks, 4 -> 1.
@tilus.autotune(
    "block_m, block_n, stages",
    [[128, 128, 2], [128, 128, 3], [128, 128, 4], [128, 128, 6], [64, 256, 2], [64, 256, 4]],
)
@tilus.autotune("block_k", [64])
class HopperMatmulV2(tilus.Script):
    def __init__(self, block_m: int, block_n: int, block_k: int, stages: int, dtype: DataType = float16):
        super().__init__()
        self.dtype = dtype  # float16 or bfloat16: A, B and C
        self.block_m = block_m
        self.block_n = block_n
        self.block_k = block_k
        self.stages = stages

    def __call__(
        self,
        m_size: int32,
        n_size: int32,
        k_size: int32,
        a_ptr: void_p,
        b_ptr: void_p,
        c_ptr: void_p,
    ):
        self.attrs.blocks = [cdiv(m_size, self.block_m), cdiv(n_size, self.block_n)]
        self.attrs.warps = 4  # one warpgroup: wgmma is issued by 4 warps together

        # 1. the tile of C this block computes
        offset_m: int32 = self.block_m * self.blockIdx.x
        offset_n: int32 = self.block_n * self.blockIdx.y

        # 2. operands: global views, shared tiles, the accumulator
        self.g_a = self.global_view(a_ptr, dtype=self.dtype, shape=[m_size, k_size])
        self.g_b = self.global_view(b_ptr, dtype=self.dtype, shape=[n_size, k_size])
        self.s_a = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.block_m, self.block_k])
        self.s_b = self.shared_tensor(dtype=self.dtype, shape=[self.stages, self.block_n, self.block_k])
        acc = self.register_tensor(dtype=float32, shape=[self.block_m, self.block_n], init=0.0)

        # 3. barriers
        self.full_barriers = self.mbarrier.alloc(counts=[1] * self.stages)

        # 4. the K loop: a prologue fills all slots but one; each step refills the slot the
        # step before used (that one is still in the ring at step 0)
        with self.single_warp():
            for s in range(self.stages - 1):
                if s * self.block_k < k_size:
                    self.load_step(s, offset_m, offset_n, s * self.block_k)

        stage: int32 = 0
        phase: uint32 = 0  # flips each time stage wraps: the barriers alternate phases per trip
        refill_stage: int32 = self.stages - 1
        for offset_k in self.range(0, k_size, self.block_k, unroll=self.stages):
            self.mbarrier.wait(self.full_barriers[stage], phase=phase)
            self.wgmma.fence()
            self.wgmma.mma(self.s_a[stage], self.s_b[stage].transpose(), acc)
            self.wgmma.commit_group()
            # this step may still run; the previous one has finished, for the whole warpgroup (a wgmma
            # is one operation of all four warps), so its slot (refill_stage) is free
            self.wgmma.wait_group(1)

            refill_k = offset_k + (self.stages - 1) * self.block_k
            if refill_k < k_size:
                with self.single_warp():
                    self.load_step(refill_stage, offset_m, offset_n, refill_k)
            refill_stage = stage
            stage = (stage + 1) % self.stages
            phase ^= stage == 0
        self.wgmma.wait_group(0)
        self.sync()  # every warp's last wgmma is done before its slots are reused below

        # 5. epilogue: the output tile reuses the operand tiles' shared memory, which nothing reads now
        self.free_shared(self.s_a)
        self.free_shared(self.s_b)
        self.g_c = self.global_view(c_ptr, dtype=self.dtype, shape=[m_size, n_size])
        self.epilogue(acc, offset_m, offset_n)

    def load_step(self, stage: int32, offset_m: int32, offset_n: int32, offset_k: int32):
        """Issue the TMA loads of the K step at offset_k into slot `stage`, completing on its full barrier."""
        with self.single_thread():
            self.mbarrier.arrive_and_expect_tx(
                self.full_barriers[stage], transaction_bytes=self.s_a[stage].nbytes + self.s_b[stage].nbytes
            )
        self.tma.global_to_shared(
            src=self.g_a, dst=self.s_a[stage], offsets=[offset_m, offset_k], mbarrier=self.full_barriers[stage]
        )
        self.tma.global_to_shared(
            src=self.g_b, dst=self.s_b[stage], offsets=[offset_n, offset_k], mbarrier=self.full_barriers[stage]
        )

    def epilogue(self, acc: RegisterTensor, offset_m: int32, offset_n: int32):
        """Registers -> shared -> global (TMA), the whole tile at once."""
        s_c = self.shared_tensor(dtype=self.dtype, shape=[self.block_m, self.block_n])
        # row-major, unswizzled: one TMA box for the whole tile (a 128-byte swizzle caps a box at 64 columns)
        self.annotate_layout(s_c, shared_row_major(self.block_m, self.block_n))
        self.store_shared(s_c, acc.to(self.dtype))
        # generic-proxy stores must be made visible to the async proxy (TMA) before it reads s_c
        self.fence.proxy_async(space="shared")
        self.sync()
        with self.single_warp():
            self.tma.shared_to_global(s_c, self.g_c, offsets=[offset_m, offset_n], dims=[0, 1])
            self.tma.commit_group()
            self.tma.wait_group(n=0, read=True)  # s_c must outlive the TMA engine's read of it


KERNELS = support.kernels("v2", hopper=HopperMatmulV2)


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """C = A @ B.T for A (M x K) and B (N x K) on a Hopper GPU, fp32 accumulation.

    A, B and C are all fp16 or all bf16.

    Raises TypeError/ValueError naming the rule for input the kernels cannot take.
    """
    return support.launch(KERNELS, a, b, out)


if __name__ == "__main__":
    sys.exit(support.main("v2", KERNELS, matmul))
