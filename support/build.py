"""Building every schedule of a kernel for sm_90a or sm_100a without a GPU (CI, and the CLI's fallback).

tilus 0.2.0 has no compile-only entry point, and its build refuses to run without a GPU
and links against libcuda.so, which a CPU machine lacks. ``build_schedules`` selects the
target, swaps tilus' compile step for tilus' own nvcc command with the host code left
out (the kernel compiled to a cubin, keeping the PTX), and reads registers, spills,
shared memory, ptxas warnings and the count of tensor-core instructions from the output.
"""

import dataclasses
import re
import traceback
from contextlib import contextmanager
from pathlib import Path

import tilus
import tilus.drivers
import tilus.target
from tilus.hidet.backend.build import NVCC
from tilus.utils.multiprocess import parallel_imap

from support.cache import CUBIN, use_cache
from support.dispatch import format_schedule, kernel_args
from support.gpu import ARCHS, Arch


@dataclasses.dataclass
class BuildResult:
    schedule: dict
    error: str = ""
    module_dir: Path | None = None
    registers: int = 0
    spill_bytes: int = 0
    stack_bytes: int = 0
    dynamic_smem: int = 0
    threads: int = 0
    mma_count: int = 0
    # e.g. C7515 (wgmma serialised) or C7508 (setmaxnreg ignored): a silent slowdown
    ptxas_warnings: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.error

    def describe(self, arch: Arch) -> str:
        if not self.ok:
            return "FAILED: " + self.error.strip().splitlines()[-1]
        return (
            f"ok, {self.registers} registers, {self.spill_bytes} B spilled, {self.stack_bytes} B stack, "
            f"{self.dynamic_smem} B shared, {self.mma_count} x {arch.mma_instruction}"
            + "".join(f"; {warning}" for warning in self.ptxas_warnings)
        )


class _CompileOnlyNVCC(NVCC):
    """tilus' own nvcc command for the kernel alone, to a cubin, keeping the PTX.

    ``-cubin`` in place of ``--compile`` leaves out the host code (the launch function,
    the same for every schedule but its constants; the GPU machine compiles it on the first
    call): every flag that reaches cicc and ptxas is tilus' own, and a build takes less
    than half the time, which is most of CI's.
    """

    LOG = "_compileonlynvcc_output.txt"

    def run_compile_command(self, command, src_path, out_lib_path, keep_files):
        command = command.replace(" --compile ", " -cubin ") + " --keep"
        super().run_compile_command(command, src_path, out_lib_path, [*keep_files, "source.ptx"])


def _compile_cubin(source_file, output_library_file, target, **_):
    # The GPU-less stand-in for tilus' compile_source: that one refuses to run without a
    # GPU and links against libcuda.so, which a CPU machine lacks. A cubin is enough to
    # prove that nvcc and ptxas accept the kernel.
    _CompileOnlyNVCC().compile(source_file, str(Path(output_library_file).with_name(CUBIN)), target)


@contextmanager
def _building_for(target: tilus.target.Target):
    previous_target, previous_compile = tilus.target._target, tilus.drivers.compile_source
    tilus.target.set_current_target(target)
    tilus.drivers.compile_source = _compile_cubin
    try:
        yield
    finally:
        tilus.target._target, tilus.drivers.compile_source = previous_target, previous_compile


def _build_program(job) -> tuple[str, str]:
    program, options = job
    module_dir = tilus.drivers.get_cache_dir(program, options) / "module"
    if (module_dir / CUBIN).exists():
        return str(module_dir), ""
    try:
        tilus.drivers.build_program(program, options)
    except Exception:
        return str(module_dir), traceback.format_exc()
    return str(module_dir), ""


def _inspect_build(result: BuildResult, arch: Arch) -> None:
    log = (result.module_dir / _CompileOnlyNVCC.LOG).read_text()
    result.registers = int(re.search(r"Used (\d+) registers", log).group(1))
    result.spill_bytes = sum(int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", log))
    result.stack_bytes = int(re.search(r"(\d+) bytes stack frame", log).group(1))
    # warnings, and the performance notes ptxas prints as "info" (C7508: setmaxnreg ignored)
    result.ptxas_warnings = re.findall(r"ptxas.*(?:warning|Performance Loss).*", log, re.IGNORECASE)
    launch_config = re.search(r"dim3\((\d+), 1, 1\), (\d+), \(cudaStream_t\)", (result.module_dir / "source.cu").read_text())
    result.threads, result.dynamic_smem = int(launch_config.group(1)), int(launch_config.group(2))
    result.mma_count = (result.module_dir / "source.ptx").read_text().count(arch.mma_instruction)


def build_schedules(
    script_cls, arch_name: str, progress=print, script_kwargs: dict | None = None, call_args: tuple | None = None,
    limit: int | None = None,
    select=None,
) -> list[BuildResult]:
    """Build every schedule of the autotune space for the architecture, without a GPU.

    tilus' autotuner silently drops schedules that fail to build, so this returns one
    result per schedule of the space and the caller decides what a failure means.
    ``script_kwargs`` are passed to the script's constructor (``dtype=bfloat16`` for a
    version's kernel); ``call_args`` are for kernels other than the GEMMs (whose arguments
    are M, N, K and three pointers) and stand for its call's arguments, pointers as 0.
    ``limit`` builds only the first schedules of the space and ``select(schedule)`` only
    those it accepts; either way only the results of what was built are returned.
    """
    arch = ARCHS[arch_name]
    with _building_for(arch.target):
        use_cache(script_cls, f"compile-{arch.sm}")
        jit = script_cls(**(script_kwargs or {}))._jit_instance_for(
            *(call_args or kernel_args(script_cls, 4096, 4096, 4096, 0, 0, 0, num_sms=132))
        )
        results = [BuildResult(schedule) for schedule in jit.schedules]
        transpiled = set(jit.transpiled_schedules)
        failed_transpile = [i for i in range(len(results)) if i not in transpiled]
        for i, message in zip(failed_transpile, jit.failed_scheduling):
            results[i].error = message
        chosen = [i for i, r in enumerate(results)
                  if (limit is None or i < limit) and (select is None or select(r.schedule))]
        wanted = [(index, program) for index, program in zip(jit.transpiled_schedules, jit.transpiled_programs)
                  if index in chosen]
        jobs = [(program, jit.build_options) for _, program in wanted]
        name = script_cls.__name__
        for done, (index, (module_dir, error)) in enumerate(
            zip([index for index, _ in wanted], parallel_imap(_build_program, jobs)), start=1
        ):
            result = results[index]
            result.module_dir, result.error = Path(module_dir), error
            if result.ok:
                _inspect_build(result, arch)
            progress(f"  [{done}/{len(jobs)}] {name} {arch.sm} {format_schedule(result.schedule)}: {result.describe(arch)}")
    return [results[i] for i in chosen]
