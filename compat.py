"""Workarounds for defects of the pinned tilus release, applied in one place.

Each workaround replaces one attribute of a tilus module or class, names the defect and how it
shows, and has a test in ``tests/test_compat.py`` that builds a kernel with the
workaround off and expects the defect: once a tilus release fixes it, that test fails and
the workaround can be deleted. They apply only to the release below; importing
:mod:`harness` applies them. The only other place that reaches into tilus is harness's
build without a GPU, which swaps tilus' compile step for an object-only nvcc call because
0.2.0 has no compile-only API.
"""

import contextlib
import functools

import tilus
import tilus.backends.emitters.cuda.cp_async_tensor as _tma_emitter
import tilus.hidet.transforms.hoist_loop_invariants as _hoist_pass
from tilus.backends.contexts.mbarrier_alloc_ctx import BarrierAllocContext
from tilus.hidet.ir.builders.stmt_builder import StmtScope

# The release whose defects are worked around here (pyproject.toml pins it).
AFFECTED_TILUS = "0.2.0"


def _without_cta_group_before_blackwell(primitive):
    """Defect 1: every TMA load is emitted as ``cp.async.bulk.tensor...cta_group::1``.

    The ``.cta_group`` qualifier exists only on sm_100 and later, so ptxas rejects every
    Hopper kernel that loads with TMA ("Feature '.cta_group::1' not supported on .target
    'sm_90a'"). The tilus IR insists on a group of 1 or 2; the PTX primitive underneath
    accepts ``None``, which drops the qualifier. Upstream fixed this after 0.2.0.
    """

    @functools.wraps(primitive)
    def emit(*args, cta_group=None, **kwargs):
        if tilus.get_current_target().properties.compute_capability < (10, 0):
            cta_group = None
        return primitive(*args, cta_group=cta_group, **kwargs)

    return emit


def _let_without_bindings(builder_cls):
    """Defect 2: the loop-invariant hoisting pass asserts on a loop it hoists nothing from.

    When it rewrites a loop body without finding an invariant worth hoisting, it still
    opens a ``LetStmt`` with no variables and fails with a bare ``AssertionError`` (seen
    building the Blackwell v2 kernel: a single warp running the whole K loop). An empty
    binding list should simply mean no ``let``; this builder makes it so.
    """

    class StmtBuilder(builder_cls):
        def lets(self, bind_vars, values):
            if not bind_vars:
                return StmtScope(self, stmts=[], ret=[])
            return super().lets(bind_vars, values)

    return StmtBuilder


def _barriers_above_peak(finalize):
    """Defect 3: mbarriers are placed in shared memory that ``free_shared`` released.

    The barrier allocator runs after the whole kernel has been emitted and asks the
    shared-memory allocator, in its final state, for the first free slot: after a
    ``free_shared`` that is a slot that was live during the main loop, so TMA writes land
    on barrier state (NaNs, or a hang, on an H100). Placing the barriers above the peak of
    everything ever allocated keeps them clear of every tile. Upstream fixed this after 0.2.0.
    """

    @functools.wraps(finalize)
    def place_barriers(self):
        allocator = self.contexts.smem_alloc_ctx.smem_allocator
        allocator.free_slots = [(allocator.maximum_allocated, (1 << 32) - 1)]
        finalize(self)

    return place_barriers


# name -> (owner, attribute, replacement factory)
_WORKAROUNDS = {
    "hopper_tma_cta_group": (_tma_emitter, "cp_async_tensor_global_to_shared", _without_cta_group_before_blackwell),
    "hoisting_empty_let": (_hoist_pass, "StmtBuilder", _let_without_bindings),
    "barriers_above_peak": (BarrierAllocContext, "finalize", _barriers_above_peak),
}
_originals = {name: getattr(owner, attr) for name, (owner, attr, _) in _WORKAROUNDS.items()}
_replacements = {name: make(_originals[name]) for name, (_, _, make) in _WORKAROUNDS.items()}


def needed() -> bool:
    return tilus.__version__ == AFFECTED_TILUS


def apply() -> None:
    """Install the workarounds (idempotent; a no-op on a tilus release without these defects)."""
    if needed():
        for name, replacement in _replacements.items():
            owner, attr, _ = _WORKAROUNDS[name]
            setattr(owner, attr, replacement)


def installed(name: str) -> bool:
    owner, attr, _ = _WORKAROUNDS[name]
    return getattr(owner, attr) is _replacements[name]


@contextlib.contextmanager
def disabled(*names: str):
    """Run a block with the named workarounds (default: all) off, tilus as released.

    For the tests that show a defect is still there.
    """
    names = names or tuple(_WORKAROUNDS)
    current = {name: getattr(*_WORKAROUNDS[name][:2]) for name in names}
    for name in names:
        owner, attr, _ = _WORKAROUNDS[name]
        setattr(owner, attr, _originals[name])
    try:
        yield
    finally:
        for name, value in current.items():
            owner, attr, _ = _WORKAROUNDS[name]
            setattr(owner, attr, value)
