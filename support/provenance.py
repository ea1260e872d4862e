"""Which code measured a version's rows: each schedule's tilus program, hashed, in results/provenance.json.

A results row names a version; the kernel that ran is the tilus program (the IR that tilus
transpiles a schedule to, before any CUDA is generated) of one of the version's schedules.
Its text names nothing but the kernel (after the class name, which a renamed version
changes): hashed with that name taken out, it says whether two files hold the same kernel.
The program, not the CUDA, is compared: the rows in results/ were measured before
support/compat.py made tilus' generated CUDA reproducible (defect 9), so their CUDA differs
build to build.

- ``plot.py`` and the fp8 versions' benchmark record the hashes of every version they time
  (``record``), for the Hopper kernel, fp16 (fp8 kernels: bf16 output).
- ``python plot.py --relabel v5=v7 --measured-at <commit>`` keeps the rows of a renamed
  version: it hashes the old version's programs at the commit that measured them (a git
  worktree) and the new version's on disk, renames the rows only if every schedule's hash
  is the same, and records them.
- tests/test_provenance.py checks that every version's recorded hashes are those of the code
  on disk: a kernel changed since its rows were measured fails until it is measured again.
  Each record also names the results files measured on those programs (``files``: a digest
  of the programs per file). A kernel changed and measured again into some files leaves the
  others with the old digest, and the test names them: their rows are the old kernels'.
"""

import csv
import hashlib
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from support.versions import REPO, lesson

RESULTS_DIR = REPO / "results"
PATH = RESULTS_DIR / "provenance.json"
# the constructor arguments that are not the schedule's: the element types
NOT_SCHEDULE = ("dtype", "out_dtype")


def program_hash(program) -> str:
    """A transpiled tilus program's text, its function's name taken out, hashed."""
    text = re.sub(r"^def \w+\(", "def kernel(", str(program), count=1)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def schedule_key(schedule: dict) -> str:
    return " ".join(f"{key}={value}" for key, value in schedule.items() if key not in NOT_SCHEDULE)


def hashes(module_name: str) -> dict[str, str]:
    """{schedule: program hash} of a version's Hopper kernels, transpiled for sm_90a (nothing is compiled); v11's
    block-wise and promoted kernels' schedules are prefixed 'block-wise' and 'promoted'."""
    import importlib

    import tilus.target

    from support import cache, dispatch, scaled, versions

    module = importlib.import_module(module_name)
    found = {}
    previous = tilus.target._target
    tilus.target.set_current_target(tilus.target.nvgpu_sm90a)
    try:
        for prefix, table in (("", module.KERNELS), ("block-wise ", getattr(module, "BLOCKWISE_KERNELS", {})),
                              ("promoted ", getattr(module, "PROMOTED_KERNELS", {}))):
            if "hopper" not in table:
                continue
            kernel = table["hopper"]
            cache.use_cache(kernel, "compile-sm_90a")
            # scaled.BUILD_ARGS spelled out: hashes_at runs this module in trees older than it
            call = scaled.kernel_args(4096, 4096, 4096, 0, 0, 0, 0, 0, (1, 1, 1, 1), 132) if versions.is_fp8(
                module_name) else dispatch.kernel_args(kernel, 4096, 4096, 4096, 0, 0, 0, 132)
            jit = kernel()._jit_instance_for(*call)
            for index, program in zip(jit.transpiled_schedules, jit.transpiled_programs):
                found[prefix + schedule_key(jit.schedules[index])] = program_hash(program)
    finally:
        tilus.target._target = previous
    return found


def read() -> dict:
    return json.loads(PATH.read_text()) if PATH.exists() else {}


def digest(programs: dict[str, str]) -> str:
    """One hash of a version's programs, every schedule's: what a results file's rows of it were measured on."""
    return hashlib.sha256(json.dumps(dict(sorted(programs.items()))).encode()).hexdigest()[:16]


def versions_in(path: Path) -> set[str]:
    """The lesson versions with rows in a results CSV (fp8 rows as 'v10 tensor', model rows by backend)."""
    names = {name.removeprefix("matmul_") for name in lesson()}
    with path.open() as f:
        return {name for row in csv.DictReader(f)
                if (name := (row.get("version") or row.get("backend") or "").split(" ")[0]) in names}


def record(version: str, found: dict[str, str], measured_as: str | None = None, commit: str | None = None,
           files=()) -> None:
    """Write a version's hashes; for relabelled rows, also the name and the commit(s) they were measured under,
    kept while the programs stay the same. ``files``: the CSVs whose rows of the version these programs just
    measured (those outside results/ are not recorded); other files keep the digest they were measured on."""
    entries = read()
    earlier = entries.get(version, {})
    programs = dict(sorted(found.items()))
    same = earlier.get("programs") == programs
    names = [*(earlier.get("measured_as", []) if same else []), measured_as or version]
    commits = [*(earlier.get("commits", []) if same else []), *([commit] if commit else [])]
    measured = {path.name: digest(programs) for path in map(Path, files) if path.resolve().parent == RESULTS_DIR}
    entries[version] = {"measured_as": sorted(set(names)), **({"commits": sorted(set(commits))} if commits else {}),
                        "programs": programs, "files": dict(sorted({**earlier.get("files", {}), **measured}.items()))}
    PATH.write_text(json.dumps(dict(sorted(entries.items(), key=lambda item: int(item[0][1:]))), indent=1) + "\n")


def record_measured(version: str, path: Path) -> None:
    """``record`` the version's programs on disk as those that just measured its rows in the CSV at ``path``."""
    record(version, hashes(f"matmul_{version}"), files=[path])


def hashes_at(commit: str, module_name: str) -> dict[str, str]:
    """``hashes`` of a version as it was at a git commit: computed in a throwaway worktree, in a fresh interpreter."""
    with tempfile.TemporaryDirectory() as folder:
        tree = Path(folder) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=REPO, check=True,
                       capture_output=True)
        try:
            code = ("import json, sys; sys.path.insert(0, '.'); "
                    f"from support import provenance; print(json.dumps(provenance.hashes({module_name!r})))")
            if not (tree / "support" / "provenance.py").exists():  # older than this module: bring it along
                (tree / "support" / "provenance.py").write_text(Path(__file__).read_text())
                (tree / "support" / "versions.py").write_text((REPO / "support" / "versions.py").read_text())
            proc = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True, check=True,
                                  env={"MATMUL_TUTORIAL_CACHE": str(Path(folder) / "cache"), "PATH": "/usr/bin:/bin",
                                       "HOME": folder})
            return json.loads(proc.stdout.strip().splitlines()[-1])
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, capture_output=True)
