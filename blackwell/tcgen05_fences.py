"""The tcgen05 thread-sync fences, which tilus 0.2.0 does not emit: two primitives a Blackwell kernel calls as statements.

tcgen05 operations (``tcgen05.mma``, ``tcgen05.ld``, ``tcgen05.dealloc``) are asynchronous,
and a barrier or an mbarrier wait between threads does not by itself order one thread's
tcgen05 operation before another's. The PTX ISA (9.7.16.6.4, "Memory consistency model
for 5th generation of TensorCore operations") pairs the thread synchronisation with two
fences: ``tcgen05.fence::before_thread_sync`` after the tcgen05 operations that must
happen first, and ``tcgen05.fence::after_thread_sync`` before those that must come after.
Every Blackwell version uses them the same way:

- after the wait for the flush barrier and the block sync behind it, and before the
  epilogue's first ``tcgen05.ld``: ``after_thread_sync`` (the MMAs, committed by the MMA
  warp, before any warp reads the accumulator);
- after each ``tcgen05.wait::ld``: ``before_thread_sync``, and before ``tcgen05.dealloc``
  (and, in the persistent versions, before the next tile's first ``tcgen05.mma``):
  ``after_thread_sync`` (every warp's reads of the accumulator before it is freed or
  overwritten).

``support/protocol.py`` checks the first of these in every Blackwell kernel.
"""

from tilus.hidet.ir.func import Function
from tilus.hidet.ir.primitives.func import call_primitive_func, register_primitive_function
from tilus.hidet.ir.stmt import asm
from tilus.hidet.lang import attrs, script


def _register(kind: str) -> str:
    name = f"tutorial_tcgen05_fence_{kind}_thread_sync"
    template = f"tcgen05.fence::{kind}_thread_sync;"

    @script
    def fence():
        attrs.func_name = name
        attrs.func_kind = "cuda_internal"
        asm(template=template, inputs=[], is_volatile=True, memory_fence=True)

    assert isinstance(fence, Function)
    register_primitive_function(name=fence.name, func_or_type=fence)
    return name


_BEFORE = _register("before")
_AFTER = _register("after")


def before_thread_sync():
    """tcgen05.fence::before_thread_sync: this thread's tcgen05 operations so far happen before the next thread sync."""
    return call_primitive_func(_BEFORE, [])


def after_thread_sync():
    """tcgen05.fence::after_thread_sync: this thread's later tcgen05 operations happen after the last thread sync."""
    return call_primitive_func(_AFTER, [])
