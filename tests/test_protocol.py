"""CPU (CI): the protocol check (support/protocol.py) of every generated kernel, and a planted fault for each rule.

Every Blackwell kernel is built for sm_100a and never run here: support/protocol.py reads
from its generated CUDA what a B200 would fault on first (TMEM, barrier counts, ordering,
the MMA's descriptor). The rules that apply on Hopper run on every Hopper schedule too,
kernels that do run and pass the GPU tests. Each rule is shown to catch its fault: a test
plants the fault in a copy of a built kernel's source text and the check names the rule,
the kernel and the schedule. The two faults it found when it was written (no
tcgen05.fence::after_thread_sync before the epilogue's tcgen05.ld in any Blackwell
kernel; v1's small blocks oversubscribing TMEM) are fixed (tcgen05_fences.py, v1's
reserved shared memory), so every schedule must pass.
"""

import re

import pytest
from conftest import ARCHS, BLACKWELL_VERSIONS, KERNEL_MODULES, VERSIONS

from support import protocol

def violations(r, arch):
    assert r.ok, r.error
    return protocol.check_build(r, arch)


@pytest.mark.parametrize("version, arch", KERNEL_MODULES)
def test_every_schedule_follows_the_protocol(built, version, arch):
    found = [str(v) for r in built(version, arch) for v in violations(r, arch)]
    assert not found, "\n".join(found)


# ---------------------------------------------------------------------------------------------
# planted faults: one built kernel's text, one fault, the rule that must name it


def blackwell_kernel(built):
    """The newest version's first Blackwell schedule (persistent from v5 on)."""
    return built(BLACKWELL_VERSIONS[-1], "blackwell")[0]


def hopper_cluster_kernel(built):
    """A Hopper schedule with a 2-CTA cluster (remote arrivals), the newest version that has one."""
    for version in reversed(VERSIONS):
        for r in built(version, "hopper"):
            if r.schedule.get("cluster_m") == 2:
                return r
    pytest.fail("no Hopper schedule with cluster_m=2")


def texts(r):
    return (r.module_dir / "source.cu").read_text(), (r.module_dir / "source.ptx").read_text()


def plant(text: str, old: str, new: str) -> str:
    assert old in text, f"the fixture no longer has {old!r}: update the planted fault"
    return text.replace(old, new)


def cut_call(text: str, fragment: str, which=slice(None)) -> str:
    """The text without the calls (and their ';') of the helpers whose inline PTX has fragment."""
    kernel = protocol.Kernel(text, "")
    calls = kernel.calls_of(fragment)[which]
    assert calls, f"no call of {fragment}"
    for call in sorted(calls, key=lambda c: c.start, reverse=True):
        end = text.index(";", call.end) + 1
        text = text[:call.start] + text[end:]
    return text


def fires(rule, r, arch, source, ptx=None):
    """The planted fault is named: rule, kernel, schedule. The unplanted text does not name it."""
    source_cu, source_ptx = texts(r)
    before = [v for v in protocol.check(source_cu, source_ptx, r.schedule, arch, r.registers) if v.rule == rule]
    assert not before, [str(v) for v in before]
    after = [v for v in protocol.check(source, ptx or source_ptx, r.schedule, arch, r.registers) if v.rule == rule]
    assert after, f"{rule} did not fire"
    kernel = protocol.Kernel(source_cu, "").name
    for v in after:
        assert str(v).startswith(f"[{rule}] {kernel} ({protocol.format_schedule(r.schedule)}): "), str(v)
    return [v.message for v in after]


def test_planted_dropped_dealloc(built):
    r = blackwell_kernel(built)
    source, _ = texts(r)
    messages = fires("tmem-dealloc", r, "blackwell", cut_call(source, "tcgen05.dealloc"))
    assert any("1 tcgen05.alloc sites" in m and "0 tcgen05.dealloc" in m for m in messages), messages


def test_planted_dealloc_of_other_columns(built):
    r = blackwell_kernel(built)
    source, _ = texts(r)
    columns = r.schedule["block_n"]
    dealloc = re.search(r"tilus_cuda_tcgen05_dealloc\w*\(tmem, uint32_t\(\d+u\)\);", source).group(0)
    fires("tmem-dealloc", r, "blackwell", plant(source, dealloc, dealloc.replace(f"({columns}u)", f"({columns // 2}u)")))


def test_planted_return_before_dealloc(built):
    r = blackwell_kernel(built)
    source, _ = texts(r)
    first_sync_after_alloc = "int32_t tmem = ((int32_t*)(shared_workspace))[0];"
    messages = fires("tmem-dealloc", r, "blackwell",
                     plant(source, first_sync_after_alloc, first_sync_after_alloc + " if (k_size == 0) { return; }"))
    assert any("'return'" in m for m in messages), messages


def test_planted_dealloc_under_a_branch(built):
    # the dealloc under a data-dependent branch: a path to the end without it
    r = blackwell_kernel(built)
    source, _ = texts(r)
    dealloc = re.search(r"if \(\(\(int\)threadIdx\.x / 32\) == 0\) \{\s*tilus_cuda_tcgen05_dealloc\w*\([^;]*;\s*\}", source).group(0)
    messages = fires("tmem-dealloc", r, "blackwell", plant(source, dealloc, "if (m_size > 4096) { " + dealloc + " }"))
    assert any("not at the kernel body's top level" in m for m in messages), messages


def test_planted_alloc_after_relinquish(built):
    r = blackwell_kernel(built)
    source, _ = texts(r)
    helper = ("static __device__ __forceinline__ void tilus_cuda_tcgen05_relinquish() {\n"
              "  asm volatile (\"tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;\");\n}\n\n")
    planted = plant(source, "static __global__", helper + "static __global__")
    planted = plant(planted, "uint32_t smem_addr = ", "tilus_cuda_tcgen05_relinquish(); uint32_t smem_addr = ")
    messages = fires("tmem-dealloc", r, "blackwell", planted)
    assert any("relinquish" in m for m in messages), messages


def test_planted_alloc_not_a_power_of_two(built):
    r = blackwell_kernel(built)
    source, _ = texts(r)
    alloc = re.search(r"tilus_cuda_tcgen05_alloc\w*\(smem_addr, uint32_t\(\d+u\)\);", source).group(0)
    messages = fires("tmem-columns", r, "blackwell", plant(source, alloc, re.sub(r"\(\d+u\)", "(96u)", alloc)))
    assert any("not a power of two" in m for m in messages), messages


def test_planted_tmem_oversubscribed(built):
    # the same columns with a tenth of the shared memory: more blocks resident than TMEM holds
    r = next(r for r in built(BLACKWELL_VERSIONS[-1], "blackwell") if r.schedule["block_n"] == 256)
    source, _ = texts(r)
    launch = f", {r.dynamic_smem}, (cudaStream_t)"
    messages = fires("tmem-columns", r, "blackwell", plant(source, launch, f", {r.dynamic_smem // 10}, (cudaStream_t)"))
    assert any("> 512" in m for m in messages), messages


def test_planted_barrier_count(built):
    r = blackwell_kernel(built)
    source, _ = texts(r)
    # the empty barriers follow the full ones: the first barrier of the second array
    init = re.findall(r"tilus_cuda_mbarrier_init_shared\(\(barriers \+ uint32_t\((\d+)u\)\), uint32_t\(1u\)\);", source)
    stages = r.schedule["stages"]
    empty = f"tilus_cuda_mbarrier_init_shared((barriers + uint32_t({8 * stages}u)), uint32_t(1u));"
    assert str(8 * stages) in init
    messages = fires("mbarrier-count", r, "blackwell", plant(source, empty, empty.replace("uint32_t(1u))", "uint32_t(2u))")))
    assert any(f"+{8 * stages} initialised with count 2 receives 1 arrivals" in m for m in messages), messages


def test_planted_commit_from_every_warp(built):
    # a copy of the flush commit outside the MMA warp's thread group: one more arrival per warp of the block
    r = blackwell_kernel(built)
    source, _ = texts(r)
    kernel = protocol.Kernel(source, "")
    commit = kernel.calls_of("tcgen05.commit")[-1]
    text = source[commit.start:source.index(";", commit.end) + 1]
    after_alloc = "int32_t tmem = ((int32_t*)(shared_workspace))[0];"
    messages = fires("mbarrier-count", r, "blackwell", plant(source, after_alloc, after_alloc + " " + text))
    assert any("count 1 receives 5 arrivals" in m for m in messages), messages


def test_planted_missing_remote_arrival(built):
    r = hopper_cluster_kernel(built)
    source, _ = texts(r)
    messages = fires("mbarrier-count", r, "hopper", cut_call(source, "shared::cluster.b64 _"))
    assert any("initialised with count 4 receives 2 arrivals" in m for m in messages), messages


def test_planted_4cta_cluster_peer_twice(built):
    # a cluster of 4: each consumer arrives on the three peers' empty barriers (count 2 x 4 = 8); the first consumer
    # naming peer 2 twice loses its arrival on peer 3
    r = next((r for version in reversed(VERSIONS) for r in built(version, "hopper")
              if r.schedule.get("cluster_m") == 4), None)
    assert r is not None, "no Hopper schedule with cluster_m=4"
    source, _ = texts(r)
    third = re.search(r"int32_t (loop_invariant_\d+) = \(clusterBlockRank \^ 3\);", source)
    messages = fires("mbarrier-count", r, "hopper", plant(source, third.group(0),
                                                        f"int32_t {third.group(1)} = (clusterBlockRank ^ 2);"))
    assert any("count 8 receives 7 arrivals" in m for m in messages), messages


def test_planted_arrive_count(built):
    r = hopper_cluster_kernel(built)
    source, _ = texts(r)
    arrive = re.search(r"tilus_cuda_mbarrier_arrive_release_cta_cta\((val_\d+), 1\);", source)
    fires("mbarrier-count", r, "hopper", plant(source, arrive.group(0), f"tilus_cuda_mbarrier_arrive_release_cta_cta({arrive.group(1)}, 2);"))


def test_unrecognised_thread_guard_is_reported(built):
    # an arrival under a thread-dependent branch that is not a tilus ThreadGroup: reported, not guessed
    r = hopper_cluster_kernel(built)
    source, _ = texts(r)
    arrive = re.search(r"tilus_cuda_mbarrier_arrive_release_cta_cta\((val_\d+), 1\);", source).group(0)
    messages = fires("mbarrier-count", r, "hopper", plant(source, arrive, "if ((int)threadIdx.x % 2 == 0) { " + arrive + " }"))
    assert any("unrecognised" in m and "not a tilus ThreadGroup" in m for m in messages), messages


def test_planted_missing_flush_wait(built):
    r = blackwell_kernel(built)
    source, _ = texts(r)
    kernel = protocol.Kernel(source, "")
    first_load = kernel.calls_of("tcgen05.ld")[0]
    last_commit = [c for c in kernel.calls_of("tcgen05.commit") if c.start < first_load.start][-1]
    wait = [w for w in kernel.calls_of("mbarrier.try_wait") if last_commit.start < w.start < first_load.start][-1]
    planted = source[:wait.start] + source[source.index(";", wait.end) + 1:]
    messages = fires("flush-before-ld", r, "blackwell", planted)
    assert any("which nobody waits on" in m for m in messages), messages


def test_planted_missing_tcgen05_fence(built):
    r = blackwell_kernel(built)
    source, _ = texts(r)
    fires("tcgen05-fence-after-sync", r, "blackwell", cut_call(source, "tcgen05.fence::after_thread_sync"))


def test_planted_tcgen05_fence_before_the_sync(built):
    # the fence must follow the wait and the block sync behind it: one placed before the sync does not count
    r = blackwell_kernel(built)
    source, _ = texts(r)
    without = cut_call(source, "tcgen05.fence::after_thread_sync")
    kernel = protocol.Kernel(without, "")
    wait = [w for w in kernel.calls_of("mbarrier.try_wait") if w.start < kernel.calls_of("tcgen05.ld")[0].start][-1]
    end = without.index(";", wait.end) + 1
    planted = without[:end] + " tilus_tutorial_tcgen05_fence_after_thread_sync();" + without[end:]
    fires("tcgen05-fence-after-sync", r, "blackwell", planted)


def test_planted_missing_wait_ld(built):
    r = blackwell_kernel(built)
    source, _ = texts(r)
    fires("tcgen05-wait-ld", r, "blackwell", cut_call(source, "tcgen05.wait::ld"))


@pytest.mark.parametrize("arch", ARCHS)
def test_planted_missing_proxy_fence(built, arch):
    r = blackwell_kernel(built) if arch == "blackwell" else hopper_cluster_kernel(built)
    source, _ = texts(r)
    messages = fires("proxy-fence", r, arch, cut_call(source, "fence.proxy.async", slice(0, 1)))
    assert any("no fence.proxy.async between" in m for m in messages), messages


@pytest.mark.parametrize("arch", ARCHS)
def test_planted_proxy_fence_after_the_sync(built, arch):
    # the fence moved past the thread sync: the storing thread may read before the writers fenced
    r = blackwell_kernel(built) if arch == "blackwell" else hopper_cluster_kernel(built)
    source, _ = texts(r)
    kernel = protocol.Kernel(source, "")
    fence = kernel.calls_of("fence.proxy.async")[0]
    sync = next(s for s in kernel.syncs() if s.start > fence.start)
    fence_text = source[fence.start:source.index(";", fence.end) + 1]
    sync_end = source.index(";", sync.end) + 1
    planted = source[:fence.start] + source[fence.start + len(fence_text):sync_end] + " " + fence_text + source[sync_end:]
    messages = fires("proxy-fence", r, arch, planted)
    assert any("not followed by a thread sync" in m for m in messages), messages


def test_planted_tma_store_hidden_from_the_source(built):
    # a kernel with no TMA store passes (v6's Blackwell swap_ab), but only when its PTX has none:
    # a store the source scan does not see is reported, not passed
    r = blackwell_kernel(built)
    source, _ = texts(r)
    hidden = cut_call(source, "global.shared::cta").replace("CopyAsyncTensorSharedToGlobal(", "Hidden(")
    messages = fires("proxy-fence", r, "blackwell", hidden)
    assert any("unrecognised" in m and "in the PTX" in m for m in messages), messages


@pytest.mark.parametrize("field", ["N", "M"])
def test_planted_descriptor_shape(built, field):
    r = blackwell_kernel(built)
    source, _ = texts(r)
    descriptors = set(re.findall(r"kind_f16_a_shared\([^,]+, \w+, \w+, (\d+),", source))
    assert len(descriptors) == 1, descriptors
    d = int(descriptors.pop())
    # kind::f16 instruction descriptor: N >> 3 in bits 17-22, M >> 4 in bits 24-28 (PTX ISA Table 42)
    planted_d = d ^ ((1 << 17) if field == "N" else (1 << 24))
    planted = re.sub(rf"(kind_f16_a_shared\([^,]+, \w+, \w+, ){d},", rf"\g<1>{planted_d},", source)
    messages = fires("mma-descriptor", r, "blackwell", planted)
    assert any("says M=" in m for m in messages), messages


def test_planted_kind_for_other_operands(built):
    # the same kernel text said to have e4m3 operands: its kind::f16 MMA is the wrong kind for them
    r = blackwell_kernel(built)
    source, ptx = texts(r)
    violations = protocol.check(source, ptx, r.schedule, "blackwell", r.registers, operands="float8_e4m3")
    messages = [v.message for v in violations if v.rule == "mma-descriptor"]
    assert any("kind::f16 for float8_e4m3 operands" in m for m in messages), messages


def test_planted_cluster_for_a_one_cta_mma(built):
    r = blackwell_kernel(built)
    source, _ptx = texts(r)
    messages = fires("cta-group", r, "blackwell", plant(source, "__cluster_dims__(1, 1, 1)", "__cluster_dims__(2, 1, 1)"))
    assert any("cta_group::1 in a cluster of 2" in m for m in messages), messages
