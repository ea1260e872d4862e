"""A wgmma into a fresh accumulator: D = A B, its first K step ignoring what D held (v11's block-wise promotion).

tilus 0.2.0's ``self.wgmma.mma(a, b, d)`` always adds into d (``wgmma.mma_async`` with
scale-d 1), so a partial sum that starts from zero must first be zeroed: one instruction
per accumulator register, between the promotion of one K block and the wgmma of the next.
The wgmma instruction itself can ignore d: its scale-d operand 0 gives D = A B. This module
adds that form as one more tilus instruction, ``mma_fresh(a, b, d)``: the same layout rule
and the same emitter as tilus's shared-memory wgmma, with scale-d 0 on the instruction of
the first K step and 1 on the rest, so the promotion's K loop holds nothing but wgmmas and
the promotion itself (docs/v11.md).
"""

from dataclasses import dataclass

from tilus import RegisterTensor, SharedTensor
from tilus.backends.emitter import register_emitter
from tilus.backends.emitters.cuda import wgmma as wgmma_emitters
from tilus.ir.inst import Instruction
from tilus.ir.instructions.cuda.wgmma import WgmmaMmaSSInst
from tilus.ir.layout.inference.inference_rules.wgmma import WgmmaMmaSSRule
from tilus.ir.layout.inference.rule import register_rule
from tilus.ir.layout.inference.validation_rules.always_ok import AlwaysOkayRule
from tilus.lang.instructions.base import InstructionGroup
from tilus.target import nvgpu_sm90a


@dataclass(frozen=True, eq=False)
class WgmmaFreshSSInst(Instruction):
    """wgmma with A and B in shared memory whose first K step overwrites D (its own class: the emitter
    registry matches an instruction's class or a base of it, and tilus's wgmma would match first)."""

    get_inst_mnk = staticmethod(WgmmaMmaSSInst.get_inst_mnk)

    @staticmethod
    def create(a: SharedTensor, b: SharedTensor, d: RegisterTensor) -> "WgmmaFreshSSInst":
        return WgmmaFreshSSInst(output=None, inputs=(a, b, d))


register_rule(WgmmaFreshSSInst)(WgmmaMmaSSRule)  # D's layout: the wgmma accumulator's
register_rule(WgmmaFreshSSInst)(AlwaysOkayRule)


@register_emitter(WgmmaFreshSSInst, target=nvgpu_sm90a)
class WgmmaFreshEmitter(wgmma_emitters.WgmmaMmaSSEmitter):
    """tilus's emitter, K step by K step, with scale-d 0 on the first instruction it emits (K step 0: D is one
    wgmma wide, 64 x N with N <= 256, so each K step is one instruction)."""

    def emit_wgmma(self, inst):
        wgmma_async = wgmma_emitters.wgmma_async
        emitted = []

        def first_overwrites(*args, **kwargs):
            emitted.append(True)
            return wgmma_async(*args, scale_d=0 if len(emitted) == 1 else 1, **kwargs)

        wgmma_emitters.wgmma_async = first_overwrites
        try:
            super().emit_wgmma(inst)
        finally:
            wgmma_emitters.wgmma_async = wgmma_async


def mma_fresh(a: SharedTensor, b: SharedTensor, d: RegisterTensor) -> None:
    """d = a @ b, whatever d held (a fresh d needs no init); otherwise as ``self.wgmma.mma``: fence before, commit after."""
    assert d.shape[0] == 64 and d.shape[1] <= 256, "one wgmma a K step: D is 64 x N, N <= 256"
    InstructionGroup()._builder.append(WgmmaFreshSSInst.create(a, b, d))

