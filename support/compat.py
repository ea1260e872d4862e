"""Workarounds for defects of the pinned tilus release, applied in one place.

Each workaround replaces one attribute of a tilus module or class, names the defect and how it
shows, and has a test in ``tests/test_compat.py`` that builds a kernel with the
workaround off and expects the defect: once a tilus release fixes it, that test fails and
the workaround can be deleted. They apply only to the release below; importing
:mod:`support` applies them.

Besides these, support/ reaches into tilus internals where 0.2.0 has no public API.
All of them, in one place, so an upgrade knows what to check:

- ``InstantiatedScript._jit_instance_for``: the JIT instance of a script for some
  arguments, without running it (dispatch.jit_instance, build.build_schedules).
- ``InstantiatedScript.jit_instances`` and ``.dispatch_table``, ``JitInstance.schedules``,
  ``.valid_schedules``, ``.compiled_programs``, ``.transpiled_programs``,
  ``.transpiled_schedules``, ``.failed_scheduling``, ``.build_options``, ``.dispatch_table``,
  ``.load_dispatch_table``, ``.dump_dispatch_table``, ``.cache_dir``, ``.cache_dir_lock``:
  reading and writing the autotuner's pick (dispatch), building every schedule (build).
- ``tilus.lang.instantiated_script.extract_keys``: the size bucket of a call (dispatch).
- ``Script._autotune_space``: the size of the autotune space (dispatch.space_size).
- ``tilus.target._target`` and ``tilus.drivers.compile_source``: swapped while building
  for another GPU without one (build._building_for).
- ``tilus.hidet.backend.build.NVCC``: its compile command, for the kernel alone, to a cubin (build).
"""

import contextlib
import functools
import inspect

import tilus
import tilus.backends.codegen as _codegen
import tilus.backends.emitters.cuda.cp_async_tensor as _tma_emitter
import tilus.hidet.ir.primitives.cuda.smem as _smem_primitives
import tilus.hidet.transforms.check_launch_configuration as _launch_checks
import tilus.hidet.transforms.hoist_loop_invariants as _hoist_pass
import tilus.hidet.transforms.lower_fast_div as _fast_div_pass
import tilus.ir.layout.inference.inference_rules.wgmma as _wgmma_layouts
from tilus.backends.contexts.mbarrier_alloc_ctx import BarrierAllocContext
from tilus.ir.instructions.cuda.wgmma import WgmmaMmaSSInst
from tilus.hidet.ir.builders.stmt_builder import StmtScope
from tilus.hidet.ir.dtypes import uint32, uint64
from tilus.hidet.ir.primitives.func import call_primitive_func, register_primitive_function
from tilus.hidet.lang import attrs, script

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


def _register_fastdiv_magic():
    """Host functions that compute a correct (multiplier, shift) pair for fast_divmod.

    The kernel computes a // b as mulhi(a, multiplier) >> shift (a >> shift when the
    multiplier is 0, for powers of two), with a >= 0 an int32, so a < 2**31. For such
    dividends the round-up method of Granlund and Montgomery is exact: with
    l = ceil(log2(b)), multiplier = floor(2**(31 + l) / b) + 1 fits in 32 bits, and
    a // b = (a * multiplier) >> (31 + l) = mulhi(a, multiplier) >> (l - 1).
    """

    @script
    def tutorial_fastdiv_multiplier(b: uint32) -> uint32:
        attrs.func_kind = "cpu_internal"
        if (b & (b - uint32(1))) == uint32(0):
            return uint32(0)
        log2_ceil: uint32 = 0
        while (uint64(1) << uint64(log2_ceil)) < uint64(b):
            log2_ceil = log2_ceil + uint32(1)
        return uint32((uint64(1) << uint64(31 + log2_ceil)) / uint64(b) + uint64(1))

    @script
    def tutorial_fastdiv_shift(b: uint32) -> uint32:
        attrs.func_kind = "cpu_internal"
        log2_ceil: uint32 = 0
        while (uint64(1) << uint64(log2_ceil)) < uint64(b):
            log2_ceil = log2_ceil + uint32(1)
        if (b & (b - uint32(1))) == uint32(0):
            return log2_ceil
        return log2_ceil - uint32(1)

    for func in (tutorial_fastdiv_multiplier, tutorial_fastdiv_shift):
        register_primitive_function(name=func.name, func_or_type=func)


_register_fastdiv_magic()


def _fastdiv_magic(precompute):
    """Defect 4: ``fast_divmod`` divides wrongly by about a third of all divisors (7, 14, 19, 21, ...).

    The host computes the magic multiplier for 32-bit unsigned dividends, which for those
    divisors needs 33 bits; the top bit is dropped, and the kernel's quotient is wrong from
    a = b on (7 // 7 gives 0). A grouped tile order divides by the number of column tiles:
    N = 14336 with 256-column tiles is 56 of them, and whole tiles of C went unwritten on an
    H100. Dividends are int32 and never negative, so a multiplier for 31-bit dividends
    always fits (``_register_fastdiv_magic``); this swaps it in for both host functions.
    """
    name = {"fastdiv_precompute_m": "tutorial_fastdiv_multiplier", "fastdiv_precompute_s": "tutorial_fastdiv_shift"}[
        precompute.__name__
    ]

    @functools.wraps(precompute)
    def correct_precompute(b):
        return call_primitive_func(name, args=[b])

    return correct_precompute


def _kernels_with_min_blocks(function_builder_cls):
    """Defect 5: kernels carry no minimum-blocks hint, so ptxas may drop ``setmaxnreg``.

    tilus writes ``__launch_bounds__(threads)`` without a minimum number of blocks per SM.
    ptxas may then be unable to tell how many registers a thread has at entry and ignore
    ``setmaxnreg`` ("(C7508) Potential Performance Loss: 'setmaxnreg' ignored; unable to
    determine register count at entry"): an early draft of v5's register split built so.
    ``min_blocks=1`` is the weakest hint that is true of every kernel here: a floor, at
    least one block per SM, not a count (v1 and v2 run several blocks per SM, which it does
    not deny), and no further limit on registers than ``__launch_bounds__(threads)`` already
    sets. What it adds is what lets ptxas know a thread's register count at entry.
    """

    class FunctionBuilder(function_builder_cls):
        def __init__(self, *args, kind: str, min_blocks=None, **kwargs):
            if kind == "cuda_kernel" and min_blocks is None:
                min_blocks = 1
            super().__init__(*args, kind=kind, min_blocks=min_blocks, **kwargs)

    return FunctionBuilder


# Set the limit when this device has not had it yet (tilus' kernels ask for one constant size).
_SMEM_LIMIT_ONCE = """{{ static int tilus_smem_limit_set[64]; int tilus_device = 0; cudaGetDevice(&tilus_device);
  if (tilus_device >= 64 || tilus_smem_limit_set[tilus_device] < (int)({})) {{
    if (cudaFuncSetAttribute({}, cudaFuncAttributeMaxDynamicSharedMemorySize, {}) == cudaSuccess && tilus_device < 64)
      tilus_smem_limit_set[tilus_device] = (int)({});
  }}
}}"""


def _smem_limit_once(black_box_stmt):
    """Defect 6: the launch function asks the driver for the kernel's shared memory twice on every call.

    A kernel that uses more than 48 KiB of dynamic shared memory must be allowed it once per
    device with ``cudaFuncSetAttribute``; tilus emits that call twice in the launch function
    (once when it writes the function, once when it checks the launch configuration), so
    every ``matmul()`` pays two driver calls, about 1 µs of its ~20 µs on the H100's host.
    This makes both calls remember, per device, the size already allowed.
    """

    def statement(template, *exprs):
        if template.startswith("cudaFuncSetAttribute(") and "MaxDynamicSharedMemorySize" in template:
            func, size = exprs
            return black_box_stmt(_SMEM_LIMIT_ONCE, size, func, size, size)
        return black_box_stmt(template, *exprs)

    return statement


def _wgmma_whole_n(get_inst_mnk):
    """Defect 7: a wgmma tile N that is not a power of two is issued as many narrow instructions.

    tilus picks the instruction's N as gcd(N, 256), so a 224-column tile (the one that
    covers N = 14336 in 64 tiles) becomes seven m64n32k16 per K step instead of one
    m64n224k16. Each of the seven reads the whole A slice again from shared memory: per
    16-deep step 7 x 2 KiB of A and 7 KiB of B for 64 x 224 x 16 multiply-adds, more bytes
    than shared memory delivers in the tensor cores' time for them. wgmma takes any N that
    is a multiple of 8 up to 256 (PTX ISA, wgmma.mma_async shapes), and tilus registers
    every one of them; this issues the tile's own N wherever it is one.
    """

    @functools.wraps(get_inst_mnk)
    def whole_n(m, n, k, a_dtype, b_dtype, d_dtype):
        inst_m, inst_n, inst_k = get_inst_mnk(m, n, k, a_dtype, b_dtype, d_dtype)
        return inst_m, (n if n % 8 == 0 and n <= 256 else inst_n), inst_k

    return staticmethod(whole_n)


def _wgmma_accumulator_two_columns(generate_layout):
    """Defect 8: an fp8 wgmma's fp32 accumulator gets the wrong register layout.

    tilus derives the accumulator's layout from the instruction's K: T = inst_k / 8
    adjacent columns a thread, which is 2 for 16-bit inputs (k16) but 4 for fp8 (k32).
    The PTX fragment of an fp32 accumulator is the same for every input type (PTX ISA,
    wgmma register fragments: a thread holds two adjacent columns, then the columns 8
    further on), so with fp8 half of every thread's values land in the wrong row and column
    when the tile is stored: a relative error of about 1.3, whatever the inputs. This builds
    the accumulator as for 16-bit inputs.
    """

    @functools.wraps(generate_layout)
    def two_columns(m, n, inst_m, inst_n, inst_k):
        return generate_layout(m, n, inst_m, inst_n, 16)

    return two_columns


class _OrderedSet(dict):
    """A set that iterates in insertion order (the keys of a dict)."""

    def add(self, item):
        self[item] = None


def _hoist_in_walk_order(init):
    """Defect 9: the generated CUDA differs build to build, and ptxas's register count with it.

    The hoisting pass collects a loop's invariants in a ``set`` of IR nodes, which hash by
    address, and declares the hoisted variables in that set's order. Two builds of one
    source then order them differently, and ptxas allocates differently: one v11 schedule
    came out at 166 registers in one build and 168 in the next. Collected in the order of
    the IR walk, the build is reproducible.
    """

    @functools.wraps(init)
    def ordered(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.invariants = _OrderedSet()

    return ordered


def _warp_uniform_groups(visit):
    """Defect 10: in a block of 160 or 384 threads, a warpgroup's code is not known to be warp-uniform.

    tilus guards a thread group such as "threads 128-255" with the warp-uniform predicate
    ``shfl_sync(threadIdx.x / 128, lane 0) == 1`` only when the block's thread count is a
    power of two; otherwise it writes ``128 <= threadIdx.x && threadIdx.x < 256``. ptxas cannot
    prove that uniform, so nothing computed inside the group goes to uniform registers: each
    thread of a consumer computes the wgmma descriptors itself (LEA, SHF, LOP3, then R2UR
    before each wgmma), where v11's 512-thread blocks do it once a warp (ULEA, USHF, ULOP3).
    The predicate is exact for any group whose size is a multiple of 32 and whose first
    thread is a multiple of its size, whatever the parent's count; this reads such a parent's
    count as the next power of two while tilus chooses the predicate.
    """

    @functools.wraps(visit)
    def uniform(self, stmt):
        counts = self.thread_group_stack.num_threads
        parent = counts[-1]
        aligned = (
            stmt.thread_begin >= 0
            and 32 <= stmt.num_threads < parent
            and stmt.num_threads & (stmt.num_threads - 1) == 0
            and stmt.thread_begin % stmt.num_threads == 0
            and self.thread_group_stack.thread_begin[-1] % 32 == 0
        )
        if not aligned or parent & (parent - 1) == 0:
            return visit(self, stmt)
        counts[-1] = 1 << (parent - 1).bit_length()
        try:
            return visit(self, stmt)
        finally:
            counts[-1] = parent

    return uniform


# name -> (owner, attribute, replacement factory)
_WORKAROUNDS = {
    "hopper_tma_cta_group": (_tma_emitter, "cp_async_tensor_global_to_shared", _without_cta_group_before_blackwell),
    "hopper_tma_multicast_cta_group": (
        _tma_emitter, "cp_async_tensor_global_to_cluster_shared", _without_cta_group_before_blackwell
    ),
    "hoisting_empty_let": (_hoist_pass, "StmtBuilder", _let_without_bindings),
    "hoisting_order": (_hoist_pass.LoopInvariantsAnalyzer, "__init__", _hoist_in_walk_order),
    "barriers_above_peak": (BarrierAllocContext, "finalize", _barriers_above_peak),
    "fastdiv_multiplier": (_fast_div_pass, "fastdiv_precompute_m", _fastdiv_magic),
    "fastdiv_shift": (_fast_div_pass, "fastdiv_precompute_s", _fastdiv_magic),
    "kernel_min_blocks": (_codegen, "FunctionBuilder", _kernels_with_min_blocks),
    "smem_limit_once": (_smem_primitives, "BlackBoxStmt", _smem_limit_once),
    "smem_limit_once_at_launch": (_launch_checks, "BlackBoxStmt", _smem_limit_once),
    "wgmma_whole_n": (WgmmaMmaSSInst, "get_inst_mnk", _wgmma_whole_n),
    "wgmma_fp8_accumulator": (_wgmma_layouts, "generate_wgmma_register_layout", _wgmma_accumulator_two_columns),
    "warp_uniform_groups": (_codegen.FunctionCodegen, "visit_ThreadGroupStmt", _warp_uniform_groups),
}
# attributes as stored (getattr_static: a static method stays one when it is put back)
_originals = {name: inspect.getattr_static(owner, attr) for name, (owner, attr, _) in _WORKAROUNDS.items()}
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
    return inspect.getattr_static(owner, attr) is _replacements[name]


@contextlib.contextmanager
def disabled(*names: str):
    """Run a block with the named workarounds (default: all) off, tilus as released.

    For the tests that show a defect is still there.
    """
    names = names or tuple(_WORKAROUNDS)
    current = {name: inspect.getattr_static(*_WORKAROUNDS[name][:2]) for name in names}
    for name in names:
        owner, attr, _ = _WORKAROUNDS[name]
        setattr(owner, attr, _originals[name])
    try:
        yield
    finally:
        for name, value in current.items():
            owner, attr, _ = _WORKAROUNDS[name]
            setattr(owner, attr, value)
