"""A protocol check of a generated kernel: what a Blackwell GPU would fault on first, read from the code.

Every Blackwell kernel here is built for sm_100a and never run. The faults that would hit a
reader first on a B200 are protocol faults: tensor memory (TMEM) left allocated, a barrier
whose count its arrivals never reach (a hang), an accumulator read before the tensor core
has finished, a TMA store that reads shared memory the generic proxy wrote without a
proxy fence, an MMA whose instruction descriptor says another shape than the tile. All of
them show in the generated CUDA (``source.cu``; the PTX where the CUDA does not say it),
so this module reads them from there. The same rules that apply on Hopper (barrier
counts, proxy fences) run on the Hopper kernels too, which do run and pass the GPU tests:
that proves the rules on kernels known to be right.

``check(source_cu, ptx, schedule, arch, registers=None)`` returns a list of ``Violation``
(rule, kernel, schedule, message with source.cu line numbers); empty when the kernel
follows every rule. A structure the checker does not recognise is a violation too (its
rule name, "unrecognised ..."), never a silent pass.

The rules
---------
``tmem-columns`` (Blackwell)
    Each ``tcgen05.alloc`` asks for a power of two of columns in [32, 512] (PTX ISA 9.1,
    9.7.16.7.1, tcgen05.alloc: "The number of columns must be a power of 2. The operand
    nCols must be within the range [32, 512]"), and the columns times the blocks that can be
    resident on one SM (from shared memory, threads and registers: docs/evidence.py's
    ``blocks_per_sm``, without its TMEM limit) is at most the SM's 512 columns; more, and a
    resident block waits in ``tcgen05.alloc`` until another one frees its columns.
``tmem-dealloc`` (Blackwell)
    "All of the Tensor Memory that was allocated in a kernel, must be explicitly
    deallocated before the kernel exits" (PTX ISA 9.1, 9.7.16.1.2, Tensor Memory
    Allocation). As many dealloc sites as alloc sites, the same columns and cta_group, the
    address the alloc wrote; the dealloc at the top level of the kernel body under the
    same warp guard as the alloc (so that every path to the end passes it), after it, and
    no ``return``, ``exit`` or ``trap`` in the body.

    Relinquishing the allocation permit: not required, and not done. The ISA
    (9.7.16.7.1) says only that ``tcgen05.relinquish_alloc_permit`` "specifies that the CTA
    of the executing thread is relinquishing the right to allocate Tensor Memory. So, it is
    illegal for a CTA to perform tcgen05.alloc after any of its constituent threads execute
    tcgen05.relinquish_alloc_permit"; nothing obliges a kernel to issue it, and the
    deallocation rule above does not depend on it (tilus' own documentation of
    ``tcgen05.relinquish_alloc_permit`` presents it as letting a peer CTA group allocate,
    a scheduling aid). Each kernel here allocates once, so the rule checked is the ISA's:
    where a kernel relinquishes, no ``tcgen05.alloc`` follows it.
``mbarrier-count`` (both)
    Each barrier's initial count equals the arrivals one phase receives. Arrivals are read
    from the call sites: an ``mbarrier.arrive`` counts its count operand per thread that
    reaches it, an ``arrive.expect_tx`` one per thread, a ``tcgen05.commit`` one per warp
    (tilus predicates it on the warp's elected lane), a remote arrive (``mapa`` to a peer:
    in a cluster of 2 ``1 - clusterBlockRank``, of 4 ``clusterBlockRank ^ k``) one per
    thread from each peer. The threads that reach a site are the innermost tilus
    ``ThreadGroup`` around it (its IR comment names the group; elect_any is one thread). A
    role (the group, local or remote) arrives once per phase on each barrier it touches, so
    a phase's arrivals are the sum over the roles; the copies of a site that an unrolled
    loop makes are one role. A thread-dependent ``if`` that is not a tilus ThreadGroup
    around an arrival is reported as unrecognised. Pipeline's contract (pipeline.py): full
    count 1, empty count ``consumer_arrivals``, the flush barrier 1.
``flush-before-ld`` (Blackwell)
    The last ``tcgen05.commit`` before the accumulator's first ``tcgen05.ld`` targets a
    barrier that is waited on between the two.
``tcgen05-fence-after-sync`` (Blackwell)
    Between that wait (and the thread synchronisation after it) and the first
    ``tcgen05.ld``, a ``tcgen05.fence::after_thread_sync``. PTX ISA 9.1, 9.7.16.6.4.2
    (canonical pattern "Non-pipelined instructions, same thread", example 2: ``tcgen05.mma``,
    ``tcgen05.commit``, ``mbarrier.try_wait``, ``tcgen05.fence::after_thread_sync``,
    ``tcgen05.ld``): "As tcgen05.ld is an asynchronous operation, the instruction
    tcgen05.fence::after_thread_sync is needed"; 9.7.16.6.4.4 shows the same for a wait in
    another thread. tilus 0.2.0 has no ``tcgen05.fence`` instruction, so no kernel here
    issued one until ``tcgen05_fences.py`` added it: a real fault of every Blackwell
    kernel, found by this rule and fixed.
``tcgen05-wait-ld`` (Blackwell)
    A ``tcgen05.wait::ld`` between each ``tcgen05.ld`` and the first use of the registers
    it loads.
``proxy-fence`` (both)
    Between the last generic-proxy store (``stmatrix``, ``st.shared``) to a shared tile and
    the TMA store (``cp.async.bulk.tensor`` global <- shared) that reads it, a
    ``fence.proxy.async.shared::cta`` followed by a thread synchronisation (the writers
    fence, then the storing thread may read). A kernel with no TMA store passes.
``mma-descriptor`` (Blackwell)
    The ``tcgen05.mma`` instruction descriptor (PTX ISA 9.1, 9.7.16.4.2, Table 42: D type
    in bits 4-5, A and B types in 7-9 and 10-12, N >> 3 in bits 17-22, M >> 4 in bits
    24-28) says the schedule's tile: M = block_m, N = block_n, an fp32 accumulator, A and B
    of the operands' dtype (the schedule's, or the fp8 versions' e4m3), and the instruction's kind is
    the one for that dtype (kind::f16 for fp16 and bf16, kind::f8f6f4 for e4m3).
``cta-group`` (Blackwell)
    The cta_group of every tcgen05 alloc, dealloc, mma and commit (CUDA and PTX) equals the
    cluster size the kernel is launched with (``__cluster_dims__``), which equals the
    schedule's ``cluster_m`` (1 where it has none).
"""

import dataclasses
import functools
import importlib.util
import math
import re
from pathlib import Path

RULES = (
    "tmem-columns",
    "tmem-dealloc",
    "mbarrier-count",
    "flush-before-ld",
    "tcgen05-fence-after-sync",
    "tcgen05-wait-ld",
    "proxy-fence",
    "mma-descriptor",
    "cta-group",
)
TMEM_COLUMNS = 512
_EVIDENCE = Path(__file__).resolve().parent.parent / "docs" / "evidence.py"
# the operands' dtype -> the tcgen05.mma kind and the instruction descriptor's A/B type field (PTX ISA
# Table 42: kind::f16 F16 0, BF16 1; kind::f8f6f4 E4M3 0, E5M2 1)
_AB_TYPES = {"float16": ("f16", 0), "bfloat16": ("f16", 1), "float8_e4m3": ("f8f6f4", 0)}


@dataclasses.dataclass(frozen=True)
class Violation:
    rule: str
    kernel: str
    schedule: str
    message: str

    def __str__(self) -> str:
        return f"[{self.rule}] {self.kernel} ({self.schedule}): {self.message}"


def format_schedule(schedule: dict) -> str:
    # as support.dispatch.format_schedule, without importing torch
    return " ".join(f"{key}={value}" for key, value in schedule.items() if key != "dtype")


@functools.cache
def _evidence():
    spec = importlib.util.spec_from_file_location("_docs_evidence", _EVIDENCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Unrecognised(Exception):
    """The kernel's code has a shape this checker does not know: reported under the rule being checked."""


# ---------------------------------------------------------------------------------------------
# reading a generated kernel


@dataclasses.dataclass
class Helper:
    name: str
    params: list[str]
    asm: str


@dataclasses.dataclass
class Block:
    header: str
    start: int  # position of "{"
    end: int  # position of the matching "}"
    thread_group: tuple | None  # (begin, num_threads) of a tilus ThreadGroup, begin None for elect_any


@dataclasses.dataclass
class Call:
    name: str
    start: int
    end: int
    args: list[str]


def _split_args(text: str) -> list[str]:
    args, depth, current = [], 0, ""
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            args.append(current.strip())
            current = ""
        else:
            current += ch
    if current.strip():
        args.append(current.strip())
    return args


def _matching(text: str, open_at: int, opening: str = "(", closing: str = ")") -> int:
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == opening:
            depth += 1
        elif text[i] == closing:
            depth -= 1
            if depth == 0:
                return i
    raise Unrecognised(f"no matching {closing!r}")


_THREAD_GROUP = re.compile(r"ThreadGroup\(thread_begin=(\w+), (?:thread_end=\d+, )?num_threads=(\d+)\)")


class Kernel:
    """The kernel of one generated source.cu: helpers, body, blocks, calls and IR comments."""

    def __init__(self, source: str, ptx: str):
        self.source = source
        self.ptx = ptx
        self.helpers: dict[str, Helper] = {}
        for m in re.finditer(r"static __device__ __forceinline__ [\w\s\*]*?\b(\w+)\(([^)]*)\) \{\n(.*?)\n\}\n",
                             source, re.DOTALL):
            params = [p.split()[-1].lstrip("*") for p in _split_args(m.group(2))]
            asm = " ".join(re.findall(r'asm(?: volatile)? \("((?:[^"\\]|\\.)*)"', m.group(3)))
            self.helpers[m.group(1)] = Helper(m.group(1), params, asm)
        kernel = re.search(r"__global__ void (?:__cluster_dims__\((\d+), (\d+), (\d+)\) )?"
                           r"(?:__launch_bounds__\((\d+)(?:, \d+)?\) )?(\w+)\(", source)
        if kernel is None:
            raise Unrecognised("no __global__ kernel")
        self.name = kernel.group(5)
        self.cluster = math.prod(int(x) for x in kernel.groups()[:3]) if kernel.group(1) else 1
        launch = re.search(r"dim3\((\d+), 1, 1\), (\d+), \(cudaStream_t\)", source)
        self.threads = int(launch.group(1)) if launch else int(kernel.group(4))
        self.dynamic_smem = int(launch.group(2)) if launch else 0
        open_at = source.index("{", source.index(")", kernel.end()))
        self.body_start, self.body_end = open_at, _matching(source, open_at, "{", "}")
        self._scan()

    def line(self, position: int) -> int:
        return self.source.count("\n", 0, position) + 1

    def lines(self, *positions: int) -> str:
        return "source.cu:" + ",".join(str(self.line(p)) for p in positions)

    def _scan(self):
        """Blocks, calls and IR comments of the kernel body, by position in source."""
        src, i, end = self.source, self.body_start + 1, self.body_end
        self.blocks: list[Block] = []
        self.comments: list[tuple[int, str]] = []
        self.calls: list[Call] = []
        stack, pending_group, last_delimiter, parens = [], None, i, 0
        closed: dict[int, Block] = {}  # the last block closed at each depth: the `if` an `else` belongs to
        while i < end:
            if src.startswith("/*", i):
                close = src.index("*/", i)
                text = re.sub(r"\n\s*\* ?", " ", src[i + 2:close])
                self.comments.append((i, text))
                group = _THREAD_GROUP.search(text)
                if group:
                    begin = None if group.group(1) == "elect_any" else int(group.group(1))
                    pending_group = (begin, int(group.group(2)))
                i = last_delimiter = close + 2
                continue
            if src.startswith("//", i):
                i = last_delimiter = src.index("\n", i)
                continue
            ch = src[i]
            if ch == "{":
                header = " ".join(src[last_delimiter:i].split())
                group = None
                if header.startswith("if") and pending_group is not None:
                    group, pending_group = pending_group, None
                if header.startswith("else") and len(stack) in closed:
                    header = f"{header} [of: {closed[len(stack)].header}]"
                stack.append(Block(header, i, -1, group))
                last_delimiter = i + 1
            elif ch == "}":
                block = stack.pop()
                block.end = i
                self.blocks.append(block)
                closed[len(stack)] = block
                last_delimiter = i + 1
            elif ch == ";" and parens == 0:
                last_delimiter = i + 1
            elif ch == ")":
                parens -= 1
            elif ch == "(":
                parens += 1
                if re.match(r"\w", src[i - 1]):
                    name = re.search(r"(\w+)$", src[i - 100:i]).group(1)
                    close = _matching(src, i)
                    self.calls.append(Call(name, i - len(name), close + 1, _split_args(src[i + 1:close])))
            i += 1
        if stack:
            raise Unrecognised("unbalanced braces in the kernel body")
        self.calls.sort(key=lambda c: c.start)

    # what the helpers do, read from their inline PTX
    def calls_of(self, *fragments: str, exclude: tuple = ()) -> list[Call]:
        return [c for c in self.calls if c.name in self.helpers
                and any(f in self.helpers[c.name].asm for f in fragments)
                and not any(x in self.helpers[c.name].asm for x in exclude)]

    def syncs(self) -> list[Call]:
        bar = self.calls_of("bar.sync", "bar.cta.sync", "barrier.sync", "barrier.cta.sync")
        return sorted(bar + [c for c in self.calls if c.name in ("__syncthreads", "sync")], key=lambda c: c.start)

    def enclosing(self, position: int) -> list[Block]:
        """Blocks around a position, outermost first."""
        return sorted((b for b in self.blocks if b.start < position < b.end), key=lambda b: b.start)

    # values of the kernel's variables, for barrier addresses
    def definition(self, name: str) -> str | None:
        body = self.source[self.body_start:self.body_end]
        found = set(re.findall(r"(?<![\w\]])(?:(?:u?int\d+_t|float|half)\s+)?" + re.escape(name) + r"\s*=(?!=)\s*([^;]+);", body))
        if len(found) > 1:
            raise Unrecognised(f"{name} is assigned more than one value: {sorted(found)}")
        return found.pop() if found else None

    def thread_dependent_names(self) -> set[str]:
        body = self.source[self.body_start:self.body_end]
        names = {"is_leader_lane"}
        for _ in range(3):
            for name, value in re.findall(r"\b(?:u?int\d+_t)\s+(\w+)\s*=\s*([^;]+);", body):
                if re.search(r"threadIdx|elect_sync|" + "|".join(rf"\b{n}\b" for n in names), value):
                    names.add(name)
        return names


def _strip_casts(expr: str) -> str:
    expr = re.sub(r"\((?:u?int\d+_t|void\s*\*)\)", "", expr)
    expr = re.sub(r"\bu?int\d+_t\((\d+)(?:u|ll|ull)?\)", r"(\1)", expr)
    return expr


def _peer(kernel: Kernel, rank: str) -> int:
    """Which peer a remote arrival's rank names, as k in clusterBlockRank ^ k (1 - clusterBlockRank: 1)."""
    text = _strip_casts(rank).replace(" ", "").strip("()")
    if re.fullmatch(r"[A-Za-z_]\w*", text) and text != "clusterBlockRank":
        value = kernel.definition(text)  # a hoisted loop invariant
        text = _strip_casts(value).replace(" ", "").strip("()") if value else text
    if text == "1-clusterBlockRank":
        return 1
    m = re.fullmatch(r"clusterBlockRank\^(\d+)", text)
    if not m or int(m.group(1)) == 0:
        raise Unrecognised(f"remote arrival to rank {rank!r}, not a peer (clusterBlockRank ^ k, 1 - clusterBlockRank)")
    return int(m.group(1))


def _address(kernel: Kernel, expr: str, depth: int = 0) -> tuple[int, bool, int]:
    """(offset from `barriers`, dynamic?, the peer k of a remote arrival or 0) of a barrier address expression."""
    if depth > 8:
        raise Unrecognised(f"barrier address {expr!r} resolves too deep")
    expr = _strip_casts(expr).strip()
    remote = 0
    m = re.fullmatch(r"\(*\s*(tilus_\w*mapa\w*)\((.*)\)\s*\)*", expr)
    if m:
        args = _split_args(m.group(2))
        peer = _peer(kernel, args[1])
        offset, dynamic, _ = _address(kernel, args[0], depth + 1)
        return offset, dynamic, peer
    dynamic = False
    pieces = []
    for token in re.split(r"(\b[A-Za-z_]\w*(?:\[\d+\])?)", expr):
        if not token or not re.fullmatch(r"[A-Za-z_]\w*(?:\[\d+\])?", token):
            pieces.append(token)
            continue
        if token == "barriers":
            pieces.append("0")
            continue
        if re.fullmatch(r"val(?:_\d+)?|\w*regs(?:_\d+)?\[\d+\]", token):
            value = kernel.definition(token)
            if value is None:
                raise Unrecognised(f"barrier address {token} has no definition")
            offset, inner_dynamic, inner_remote = _address(kernel, value, depth + 1)
            if inner_remote:
                raise Unrecognised(f"remote address {token} used again")
            dynamic |= inner_dynamic
            pieces.append(f"({offset})")
        else:
            dynamic = True  # a run-time value (a stage index): any element of the barrier's array
            pieces.append("0")
    python = "".join(pieces).replace("/", "//")
    try:
        return int(eval(python, {"__builtins__": {}})), dynamic, remote
    except (SyntaxError, NameError, TypeError, ZeroDivisionError) as error:
        raise Unrecognised(f"barrier address {expr!r} does not evaluate ({error})") from None


@dataclasses.dataclass
class BarrierArray:
    offsets: list[int]
    counts: list[int]


def _barriers(kernel: Kernel) -> tuple[dict[int, int], list[BarrierArray]]:
    """{offset: initial count} from the init calls, and the arrays tilus allocated them as."""
    inits = {}
    for call in kernel.calls_of("mbarrier.init"):
        offset, dynamic, _ = _address(kernel, call.args[0])
        count = re.fullmatch(r"\(?(\d+)\)?", _strip_casts(call.args[1]).strip())
        if dynamic or not count:
            raise Unrecognised(f"mbarrier.init at {kernel.lines(call.start)} is not a constant barrier and count")
        inits[offset] = int(count.group(1))
    arrays = []
    body = kernel.source
    for m in re.finditer(r"AllocBarrier\(counts=\[([\d, ]+)\]\).*?\*/\s*uint32_t (\w+)\[(\d+)\];", body, re.DOTALL):
        counts = [int(x) for x in m.group(1).split(",")]
        offsets = [_address(kernel, kernel.definition(f"{m.group(2)}[{i}]") or "?")[0] for i in range(int(m.group(3)))]
        arrays.append(BarrierArray(offsets, counts))
    return inits, arrays


# ---------------------------------------------------------------------------------------------
# the rules


def _blocks_per_sm(kernel: Kernel, registers: int | None) -> int:
    evidence = _evidence()
    if registers:
        return evidence.blocks_per_sm(registers, kernel.threads, kernel.dynamic_smem)
    # without ptxas' register count: the other limits alone (an upper bound, so a stricter check)
    return min(evidence.SHARED_PER_SM // (kernel.dynamic_smem + evidence.SHARED_RESERVED_PER_BLOCK),
               evidence.THREADS_PER_SM // kernel.threads, evidence.BLOCKS_PER_SM)


def _columns(call: Call) -> int:
    m = re.fullmatch(r"\(?(\d+)\)?", _strip_casts(call.args[1]).strip())
    if not m:
        raise Unrecognised(f"a tcgen05 alloc/dealloc with a run-time column count {call.args[1]!r}")
    return int(m.group(1))


def check_tmem(kernel: Kernel, schedule: dict, registers: int | None = None) -> list[tuple[str, str]]:
    found = []
    allocs = kernel.calls_of("tcgen05.alloc")
    deallocs = kernel.calls_of("tcgen05.dealloc")
    if not allocs:
        return [("tmem-columns", "no tcgen05.alloc in a Blackwell kernel")]
    blocks = _blocks_per_sm(kernel, registers)
    for call in allocs:
        columns = _columns(call)
        if columns < 32 or columns > 512 or columns & (columns - 1):
            found.append(("tmem-columns", (f"tcgen05.alloc of {columns} columns, not a power of two in [32, 512] "
                                           f"({kernel.lines(call.start)})")))
        if columns * blocks > TMEM_COLUMNS:
            found.append(("tmem-columns", (f"{columns} columns x {blocks} blocks resident per SM "
                                           f"({kernel.dynamic_smem} B shared, {kernel.threads} threads, "
                                           f"{registers or 'unknown'} registers) = {columns * blocks} > {TMEM_COLUMNS} "
                                           f"({kernel.lines(call.start)})")))
    if len(allocs) != len(deallocs):
        found.append(("tmem-dealloc", f"{len(allocs)} tcgen05.alloc sites ({kernel.lines(*(c.start for c in allocs))}) "
                                      f"but {len(deallocs)} tcgen05.dealloc sites"
                                      + (f" ({kernel.lines(*(c.start for c in deallocs))})" if deallocs else "")))
    for alloc, dealloc in zip(allocs, deallocs):
        where = kernel.lines(alloc.start, dealloc.start)
        if _columns(alloc) != _columns(dealloc):
            found.append(("tmem-dealloc", f"alloc of {_columns(alloc)} columns, dealloc of {_columns(dealloc)} ({where})"))
        if dealloc.start < alloc.start:
            found.append(("tmem-dealloc", f"dealloc before the alloc ({where})"))
        alloc_blocks, dealloc_blocks = kernel.enclosing(alloc.start), kernel.enclosing(dealloc.start)
        if len(dealloc_blocks) != 1 or [b.header for b in alloc_blocks] != [b.header for b in dealloc_blocks]:
            found.append(("tmem-dealloc", ("the dealloc is not at the kernel body's top level under the alloc's warp "
                                           f"guard, so not every path to the end passes it: alloc in "
                                           f"{[b.header for b in alloc_blocks]}, dealloc in "
                                           f"{[b.header for b in dealloc_blocks]} ({where})")))
        # the address: what the alloc wrote to shared memory, read back
        slot = re.search(r"(\w+)\s*=\s*tilus_cuda_cvta_generic_to_shared\(\(\(void\*\)\((\w+)\)\)\)", kernel.source[
            alloc_blocks[-1].start if alloc_blocks else kernel.body_start:alloc.start])
        address = _strip_casts(dealloc.args[0]).strip("() ")
        if slot is None or not re.search(rf"\b{address}\s*=\s*\(\(int32_t\*\)\({slot.group(2)}\)\)\[0\]", kernel.source):
            found.append(("tmem-dealloc", f"the dealloc's address {address!r} is not the one the alloc wrote ({where})"))
    body = kernel.source[kernel.body_start:kernel.body_end]
    code = re.sub(r"/\*.*?\*/", "", body, flags=re.DOTALL)
    for exit_ in re.finditer(r"\breturn\b|\bexit;|\btrap;|__trap\(\)", code):
        found.append(("tmem-dealloc", f"{exit_.group(0)!r} in the kernel body: a path to the end that may skip the dealloc"))
    relinquish = kernel.calls_of("tcgen05.relinquish_alloc_permit")
    if relinquish and any(a.start > relinquish[0].start for a in allocs):
        found.append(("tmem-dealloc", (f"tcgen05.alloc after tcgen05.relinquish_alloc_permit "
                                       f"({kernel.lines(relinquish[0].start)}), illegal (PTX ISA 9.7.16.7.1)")))
    return found


def _site_threads(kernel: Kernel, call: Call, dependent: set[str]) -> tuple[tuple, int]:
    """(role, threads reaching the call) from the tilus ThreadGroups around it."""
    begin, threads, elect = 0, kernel.threads, False
    for block in kernel.enclosing(call.start):
        if block.thread_group is not None:
            group_begin, group_threads = block.thread_group
            if group_begin is None:
                elect, threads = True, 1
            else:
                begin, threads = begin + group_begin, group_threads
        elif re.search(r"threadIdx|" + "|".join(rf"\b{n}\b" for n in dependent), block.header):
            raise Unrecognised(f"an arrival at {kernel.lines(call.start)} under a thread-dependent branch that is "
                               f"not a tilus ThreadGroup: {block.header!r}")
    return (begin, begin + (1 if elect else threads), elect), threads


def check_mbarriers(kernel: Kernel, schedule: dict) -> list[tuple[str, str]]:
    found = []
    inits, arrays = _barriers(kernel)
    for array in arrays:
        for offset, count in zip(array.offsets, array.counts):
            if inits.get(offset) != count:
                found.append(("mbarrier-count", (f"barrier at +{offset} allocated with count {count}, "
                                                 f"initialised with {inits.get(offset)}")))
    covered = {o for a in arrays for o in a.offsets}
    if set(inits) - covered:
        raise Unrecognised(f"barriers {sorted(set(inits) - covered)} belong to no AllocBarrier")
    dependent = kernel.thread_dependent_names()
    # {offset: {role: (arrivals, [positions])}}
    received: dict[int, dict[tuple, tuple[int, list[int]]]] = {offset: {} for offset in inits}
    sites = kernel.calls_of("mbarrier.arrive", "tcgen05.commit")
    for call in sites:
        helper = kernel.helpers[call.name]
        offset, dynamic, remote = _address(kernel, call.args[0])
        role, threads = _site_threads(kernel, call, dependent)
        if "tcgen05.commit" in helper.asm:
            predicate = call.args[helper.params.index("predicate")] if "predicate" in helper.params else None
            if predicate not in (None, "is_leader_lane"):
                raise Unrecognised(f"tcgen05.commit at {kernel.lines(call.start)} predicated on {predicate!r}")
            per_thread, threads = 1, (threads if predicate is None or role[2] else -(-threads // 32))
        elif "expect_tx" in helper.asm:
            per_thread = 1
        else:
            count = re.fullmatch(r"\(?(\d+)\)?", _strip_casts(call.args[helper.params.index("count")]).strip()) \
                if "count" in helper.params else None
            if "count" in helper.params and not count:
                raise Unrecognised(f"mbarrier.arrive at {kernel.lines(call.start)} with a run-time count")
            per_thread = int(count.group(1)) if count else 1
        if remote >= max(kernel.cluster, 2) or (remote and kernel.cluster not in (2, 4)):
            raise Unrecognised(f"remote arrival to peer {remote} at {kernel.lines(call.start)} "
                               f"in a cluster of {kernel.cluster}")
        array = next((a for a in arrays if offset in a.offsets), None)
        if array is None:
            raise Unrecognised(f"arrival at {kernel.lines(call.start)} on +{offset}, no barrier")
        targets = array.offsets if dynamic else [offset]
        key = (*role, f"remote {remote}" if remote else "local")
        for target in targets:
            arrivals, positions = received[target].get(key, (None, []))
            if arrivals is not None and arrivals != threads * per_thread:
                raise Unrecognised(f"one role arrives {arrivals} and {threads * per_thread} times on +{target} "
                                   f"({kernel.lines(*positions, call.start)})")
            received[target][key] = (threads * per_thread, [*positions, call.start])
    for offset, count in sorted(inits.items()):
        roles = received[offset]
        total = sum(arrivals for arrivals, _ in roles.values())
        if total != count:
            detail = "; ".join(f"threads {r[0]}-{r[1]}{' (elected)' if r[2] else ''} {r[3]}: {a} "
                               f"({kernel.lines(*p)})" for r, (a, p) in roles.items()) or "none"
            found.append(("mbarrier-count", (f"barrier at +{offset} initialised with count {count} receives "
                                             f"{total} arrivals a phase: {detail}")))
    return found


def _target_offsets(kernel: Kernel, call: Call) -> set[int]:
    _inits, arrays = _barriers(kernel)
    offset, dynamic, _ = _address(kernel, call.args[0])
    array = next(a for a in arrays if offset in a.offsets)
    return set(array.offsets if dynamic else [offset])


def check_ordering(kernel: Kernel, schedule: dict) -> list[tuple[str, str]]:
    found = []
    loads = kernel.calls_of("tcgen05.ld")
    if not loads:
        return [("flush-before-ld", "no tcgen05.ld: the accumulator is never read")]
    first = loads[0]
    commits = [c for c in kernel.calls_of("tcgen05.commit") if c.start < first.start]
    if not commits:
        return [("flush-before-ld", f"no tcgen05.commit before the first tcgen05.ld ({kernel.lines(first.start)})")]
    last = commits[-1]
    flush = _target_offsets(kernel, last)
    waits = [w for w in kernel.calls_of("mbarrier.try_wait", "mbarrier.test_wait")
             if last.start < w.start < first.start and _target_offsets(kernel, w) & flush]
    if not waits:
        found.append(("flush-before-ld", (f"the last tcgen05.commit before the first tcgen05.ld arrives on barrier "
                                          f"+{sorted(flush)}, which nobody waits on before the load "
                                          f"({kernel.lines(last.start, first.start)})")))
        after = last.end
    else:
        after = waits[-1].end
    syncs = [s.end for s in kernel.syncs() if after < s.start < first.start]
    start = syncs[-1] if syncs else after
    fences = [f for f in kernel.calls_of("tcgen05.fence::after_thread_sync") if start < f.start < first.start]
    if not fences:
        found.append(("tcgen05-fence-after-sync", ("no tcgen05.fence::after_thread_sync between the wait for the "
                                                   "accumulator (and the thread sync after it) and the first tcgen05.ld "
                                                   f"({kernel.lines(after, start, first.start)})")))
    # each load's registers are used only after a tcgen05.wait::ld
    source = kernel.source
    wait_lds = kernel.calls_of("tcgen05.wait::ld")
    for load in loads:
        buffers = {re.search(r"&?\(?(\w+)\[", a).group(1) for a in load.args[1:] if re.search(r"&?\(?(\w+)\[", a)}
        for name in list(buffers):  # uint32_t *regs_buf = ((uint32_t*)((&regs_3[0])));
            alias = re.search(rf"\b{name}\s*=\s*\(\(uint32_t\*\)\(\(&(\w+)\[0\]\)\)\)", source)
            if alias:
                buffers.add(alias.group(1))
        if not buffers:
            raise Unrecognised(f"tcgen05.ld at {kernel.lines(load.start)} with no register array")
        other_loads = [(c.start, c.end) for c in loads]
        use = None
        for m in re.finditer(r"\b(" + "|".join(map(re.escape, buffers)) + r")\b", source[load.end:kernel.body_end]):
            position = load.end + m.start()
            if not any(s <= position < e for s, e in other_loads):
                use = position
                break
        if use is None:
            continue
        if not any(load.end <= w.start < use for w in wait_lds):
            found.append(("tcgen05-wait-ld", (f"registers of the tcgen05.ld at {kernel.lines(load.start)} used at "
                                              f"{kernel.lines(use)} with no tcgen05.wait::ld between")))
    return found


_IR_ROOT = re.compile(r"%s(\d+) = (?:SliceShared|ReshapeShared|PermuteShared)\(%s(\d+)")


def check_proxy_fence(kernel: Kernel, schedule: dict) -> list[tuple[str, str]]:
    found = []
    parent = {}
    for _, text in kernel.comments:
        for child, of in _IR_ROOT.findall(text):
            parent[child] = of

    def root(tensor: str) -> str:
        while tensor in parent:
            tensor = parent[tensor]
        return tensor

    writes = [(p, root(m.group(1))) for p, text in kernel.comments for m in [re.search(r"StoreShared\(%s(\d+)", text)] if m]
    reads = [(p, root(m.group(1))) for p, text in kernel.comments
             for m in [re.search(r"CopyAsyncTensorSharedToGlobal\(%g\d+, %s(\d+)", text)] if m]
    stores = kernel.calls_of("cp.async.bulk.tensor", exclude=("shared::cta.global", "shared::cluster.global"))
    generic = kernel.calls_of("stmatrix", "st.shared")
    fences = kernel.calls_of("fence.proxy.async")
    syncs = kernel.syncs()
    # none of either is a kernel that stores C without TMA (Blackwell v9's swap_ab), and then its
    # PTX must have no TMA store either: a store the source scan missed is never a silent pass
    in_ptx = len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared::", kernel.ptx))
    if len(reads) != len(stores) or (not stores and in_ptx):
        raise Unrecognised(f"{len(stores)} TMA stores, {len(reads)} CopyAsyncTensorSharedToGlobal IR comments, "
                           f"{in_ptx} in the PTX")
    for (comment, tile), store in zip(reads, stores):
        if not comment < store.start:
            raise Unrecognised(f"TMA store at {kernel.lines(store.start)} before its IR comment")
        earlier = [p for p, t in writes if t == tile and p < comment]
        if not earlier:
            found.append(("proxy-fence", (f"no StoreShared of tile %s{tile} before its TMA store "
                                          f"({kernel.lines(store.start)}): unrecognised")))
            continue
        written = max([c.end for c in generic if earlier[-1] < c.start < store.start], default=earlier[-1])
        fenced = [f for f in fences if written < f.start < store.start]
        if not fenced:
            found.append(("proxy-fence", (f"no fence.proxy.async between the generic-proxy stores to %s{tile} "
                                          f"and the TMA store that reads it ({kernel.lines(written, store.start)})")))
        elif not any(fenced[0].end < s.start < store.start for s in syncs):
            found.append(("proxy-fence", (f"the fence.proxy.async for %s{tile} is not followed by a thread sync "
                                          f"before the TMA store ({kernel.lines(fenced[0].start, store.start)})")))
    return found


def check_mma(kernel: Kernel, schedule: dict, operands: str | None = None) -> list[tuple[str, str]]:
    found = []
    mmas = kernel.calls_of("tcgen05.mma")
    if not mmas:
        return [("mma-descriptor", "no tcgen05.mma")]
    dtype = operands or str(schedule.get("dtype", "float16")).split(".")[-1]
    kind, type_code = _AB_TYPES.get(dtype, (None, None))
    for call in mmas:
        asm_kind = re.search(r"kind::(\w+)", kernel.helpers[call.name].asm)
        if kind is None or not asm_kind or asm_kind.group(1) != kind:
            found.append(("mma-descriptor", (f"tcgen05.mma kind::{asm_kind.group(1) if asm_kind else '?'} for "
                                             f"{dtype} operands ({kernel.lines(call.start)})")))
        idesc = kernel.helpers[call.name].params.index("i_desc")
        value = _strip_casts(call.args[idesc]).strip("() ")
        if not value.isdigit():
            raise Unrecognised(f"tcgen05.mma at {kernel.lines(call.start)} with a run-time descriptor {value!r}")
        d = int(value)
        m, n = ((d >> 24) & 0x1F) << 4, ((d >> 17) & 0x3F) << 3
        d_type, a_type, b_type = (d >> 4) & 3, (d >> 7) & 7, (d >> 10) & 7
        want = (schedule["block_m"], schedule["block_n"])
        if (m, n) != want:
            found.append(("mma-descriptor", (f"instruction descriptor {d} says M={m} N={n}, the tile is "
                                             f"{want[0]} x {want[1]} ({kernel.lines(call.start)})")))
        if d_type != 1 or a_type != type_code or b_type != type_code:
            found.append(("mma-descriptor", (f"instruction descriptor {d}: D type {d_type} (F32 = 1), A type {a_type}, "
                                             f"B type {b_type} ({dtype} = {type_code}) "
                                             f"({kernel.lines(call.start)})")))
    cluster = schedule.get("cluster_m", 1)
    if kernel.cluster != cluster:
        found.append(("cta-group", f"launched with __cluster_dims__ of {kernel.cluster} CTAs, the schedule's cluster is {cluster}"))
    groups = {}
    for fragment in ("tcgen05.alloc", "tcgen05.dealloc", "tcgen05.mma", "tcgen05.commit"):
        for call in kernel.calls_of(fragment):
            group = re.search(r"cta_group::(\d)", kernel.helpers[call.name].asm)
            groups.setdefault(int(group.group(1)) if group else 1, []).append(call.start)
    for group in re.findall(r"tcgen05\.(?:alloc|dealloc|mma|commit)\.cta_group::(\d)", kernel.ptx):
        groups.setdefault(int(group), [])
    for group, positions in groups.items():
        if group != kernel.cluster:
            found.append(("cta-group", (f"tcgen05 instructions with cta_group::{group} in a cluster of {kernel.cluster} "
                                        f"({kernel.lines(*positions) if positions else 'source.ptx'})")))
    return found


def check(source_cu: str, ptx: str, schedule: dict, arch: str, registers: int | None = None,
          operands: str | None = None) -> list[Violation]:
    """Every rule that applies to the architecture; [] when the kernel follows them all.

    ``operands``: A's and B's dtype where the schedule does not name it (the fp8 versions' 'float8_e4m3').
    """
    try:
        kernel = Kernel(source_cu, ptx)
    except Unrecognised as error:
        return [Violation("unrecognised", "?", format_schedule(schedule), str(error))]
    checks = [(check_mbarriers, "mbarrier-count"), (check_proxy_fence, "proxy-fence")]
    if arch == "blackwell":
        checks += [(lambda k, s: check_tmem(k, s, registers), "tmem-dealloc"), (check_ordering, "flush-before-ld"),
                   (lambda k, s: check_mma(k, s, operands), "mma-descriptor")]
    violations = []
    for function, rule in checks:
        try:
            found = function(kernel, schedule)
        except Unrecognised as error:
            found = [(rule, f"unrecognised: {error}")]
        violations += [Violation(r, kernel.name, format_schedule(schedule), message) for r, message in found]
    return violations


def check_build(result, arch: str, operands: str | None = None) -> list[Violation]:
    """check() on a support.build.BuildResult: its source.cu, source.ptx, schedule and registers."""
    module = Path(result.module_dir)
    return check((module / "source.cu").read_text(), (module / "source.ptx").read_text(), result.schedule, arch,
                 registers=result.registers or None, operands=operands)
