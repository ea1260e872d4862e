"""The command line every version shares (cli.main)."""

import subprocess
import sys

import pytest
import importlib

from conftest import KERNEL_MODULES, no_gpu_reason

from support import cache, cli, dispatch, gpu


def run_version(version: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, f"{version}.py", *args], cwd=cache.REPO, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize("text, size", [("4096", (4096, 4096, 4096)), ("1000x1016x1024", (1000, 1016, 1024))])
def test_parse_size(text, size):
    assert cli.parse_size(text) == size


def run_in_process(version: str, capsys, *args: str) -> tuple[int, str, str]:
    """cli.main as ``python {version}.py args`` runs it, in this process (no second import of torch and tilus);
    ``version`` a module name, 'matmul_v5' or 'blackwell.matmul_v5'."""
    module = importlib.import_module(version)
    try:
        status = cli.main(module.KERNELS.version, module.KERNELS, module.matmul, list(args))
    except SystemExit as exit_:  # argparse's usage errors
        status = exit_.code
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.parametrize("text, rule", [
    ("0", "expected N (for N x N x N) or MxNxK"), ("12x4", "expected N (for N x N x N) or MxNxK"),
    ("axbxc", "expected N (for N x N x N) or MxNxK"), ("8x8x-8", "expected N (for N x N x N) or MxNxK"),
    ("16x4100x4096", "N and K must be multiples of 8"), ("16x4096x4100", "N and K must be multiples of 8"),
    ("65536x65536x64", "32-bit integers"),
])
def test_bad_size_is_a_usage_error(text, rule, capsys):
    """Caught when the arguments are read, not by a kernel launched on a shape it cannot take."""
    status, _, err = run_in_process("matmul_v1", capsys, "--sizes", text, "--check-only")
    assert status == 2
    assert rule in err
    assert "Traceback" not in err


def test_unknown_dtype_is_a_usage_error():
    proc = run_version("matmul_v1", "--dtype", "fp32", "--check-only")
    assert proc.returncode == 2
    assert "argument --dtype: invalid choice: 'fp32'" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("version, arch", KERNEL_MODULES)
def test_compile_only(version, arch, built, capsys):
    built(version, arch)  # reuse the session's builds: the CLI finds them in the same cache
    status, out, err = run_in_process(version, capsys, "--compile-only", "--arch", arch)
    assert status == 0, out + err
    count = dispatch.space_size(importlib.import_module(version).KERNELS[arch])
    assert f"{count}/{count} schedules built with {gpu.ARCHS[arch].mma_instruction}" in out


@pytest.mark.parametrize("version, arch, script", [
    ("matmul_v6", "blackwell", "blackwell/matmul_v5.py"), ("matmul_v7", "blackwell", "blackwell/matmul_v5.py"),
    ("blackwell.matmul_v8", "hopper", "matmul_v8.py"),
])
def test_compile_only_names_the_script_where_an_idea_has_no_kernel_for_the_architecture(version, arch, script, capsys):
    # v6's and v7's ideas (the swizzled store, clusters) have no Blackwell kernel; blackwell/ has no Hopper one
    status, out, err = run_in_process(version, capsys, "--compile-only", "--arch", arch)
    assert status == 1 and script in out and "Traceback" not in out + err, out + err


@pytest.mark.skipif(no_gpu_reason() is None, reason="this machine has a Hopper or Blackwell GPU: the version runs instead")
def test_without_a_gpu_the_version_says_so_and_builds(built):
    for arch in gpu.ARCHS:
        built("matmul_v1", arch)
    proc = run_version("matmul_v1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first_line = proc.stdout.splitlines()[0]
    assert first_line.startswith("No Hopper or Blackwell GPU here (")
    assert "building v1 for sm_90a and sm_100a instead (compile-only)" in first_line
    assert "schedules built with wgmma.mma_async" in proc.stdout
    assert "schedules built with tcgen05.mma" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
