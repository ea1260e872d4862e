"""Per-schedule build evidence for each version: registers, shared memory, blocks per SM, spills.

Read from the builds themselves (support/build.py: ptxas' report and the launch in the
generated source.cu), never typed. Blocks per SM is what the resources allow, computed
as the CUDA occupancy calculator does for compute capability 9.0 and 10.0: 64 K
registers per SM, allocated per warp in units of 256; 228 KiB of shared memory per SM
with 1 KiB reserved per block; at most 2048 threads and 32 blocks; on Blackwell also 512
TMEM columns per SM, of which the accumulator takes block_n.

    python docs/evidence.py     builds every schedule (cached) and rewrites the tables in docs/results.md
"""

import importlib
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent
TABLE = re.compile(r"(<!-- evidence (v\d+) -->\n)(.*?)(<!-- /evidence -->)", re.DOTALL)

REGISTERS_PER_SM = 65536
REGISTER_UNIT = 256  # registers are allocated per warp in units of this many
SHARED_PER_SM = 228 * 1024
SHARED_RESERVED_PER_BLOCK = 1024
THREADS_PER_SM = 2048
BLOCKS_PER_SM = 32
TMEM_COLUMNS = 512


def blocks_per_sm(registers: int, threads: int, shared: int, tmem_columns: int = 0) -> int:
    warps = -(-threads // 32)
    registers_per_warp = -(-registers * 32 // REGISTER_UNIT) * REGISTER_UNIT
    limits = [
        REGISTERS_PER_SM // (registers_per_warp * warps),
        SHARED_PER_SM // (shared + SHARED_RESERVED_PER_BLOCK),
        THREADS_PER_SM // threads,
        BLOCKS_PER_SM,
    ]
    if tmem_columns:
        limits.append(TMEM_COLUMNS // tmem_columns)
    return min(limits)


def evidence_table(results: dict) -> str:
    """Markdown table from {arch name: [BuildResult, ...]} of one version."""
    from support import dispatch

    lines = [
        "| GPU | schedule | threads | registers | shared memory | blocks per SM | spills |",
        "|---|---|---|---|---|---|---|",
    ]
    for arch in sorted(results, reverse=True):  # hopper first
        for r in results[arch]:
            schedule = dispatch.format_schedule(r.schedule)
            tmem = r.schedule.get("block_n", 0) if arch == "blackwell" else 0
            spills = f"{r.spill_bytes} B" if r.ok else "build failed"
            lines.append(
                f"| {arch} | `{schedule}` | {r.threads} | {r.registers} | {r.dynamic_smem / 1024:.1f} KiB | "
                f"{blocks_per_sm(r.registers, r.threads, r.dynamic_smem, tmem)} | {spills} |"
            )
    lines.append("")
    lines.append(
        "From the builds (`python docs/evidence.py`): registers per thread and spills from ptxas, "
        "dynamic shared memory and threads from the launch; blocks per SM is what registers, "
        "shared memory, threads (and TMEM on Blackwell) allow."
    )
    return "\n".join(lines) + "\n"


def update_pages(tables: dict, pages: list[Path]) -> list[Path]:
    """Rewrite each page's evidence block from {version: table}; return the pages that changed."""
    changed = []
    for page in pages:
        text = page.read_text()
        updated = TABLE.sub(lambda m: m.group(1) + tables[m.group(2)] + m.group(4), text)
        if updated != text:
            page.write_text(updated)
            changed.append(page)
    return changed


def builds(module_name: str, progress=print) -> dict:
    """{arch: [BuildResult, ...]} of one lesson version: its Hopper kernels and the Blackwell ones of its idea (every
    kernel table it has: KERNELS, and v11's BLOCKWISE_KERNELS and PROMOTED_KERNELS)."""
    from support import build, scaled, versions

    module = importlib.import_module(module_name)
    call_args = scaled.BUILD_ARGS if versions.is_fp8(module_name) else None
    results = {}
    for table in (module.KERNELS, getattr(module, "BLOCKWISE_KERNELS", {}), getattr(module, "PROMOTED_KERNELS", {})):
        for arch, kernel in table.items():
            results.setdefault(arch, []).extend(build.build_schedules(kernel, arch, progress=progress,
                                                                      call_args=call_args))
    return results


def update_all(progress=print) -> list[Path]:
    """Build every schedule of every version (cached) and rewrite the tables; return the pages that changed."""
    sys.path.insert(0, str(REPO))
    from support import versions

    tables = {name.removeprefix("matmul_"): evidence_table(builds(name, progress)) for name in versions.lesson()}
    return update_pages(tables, [DOCS / "results.md"])


if __name__ == "__main__":
    for changed in update_all():
        print(f"updated the evidence table in {changed.relative_to(REPO)}")
