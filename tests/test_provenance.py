"""CPU (CI): every version's rows in results/ were measured on the kernels on disk (support/provenance.py)."""

import csv

import pytest

from support import cli, provenance, versions

RECORDED = provenance.read()


def measured_versions() -> set[str]:
    """The lesson versions with rows in any results CSV (fp8 rows as 'v10 tensor', model rows by backend)."""
    lesson = {name.removeprefix("matmul_") for name in versions.lesson()}
    found = set()
    for path in cli.RESULTS_DIR.glob("*.csv"):
        with path.open() as f:
            for row in csv.DictReader(f):
                name = (row.get("version") or row.get("backend") or "").split(" ")[0]
                if name in lesson:
                    found.add(name)
    return found


def test_every_measured_version_has_its_programs_recorded():
    missing = measured_versions() - set(RECORDED)
    assert not missing, f"rows of {sorted(missing)} with no record of the code that measured them"


@pytest.mark.parametrize("version", sorted(RECORDED, key=versions.number))
def test_recorded_programs_are_the_kernels_on_disk(version):
    # a kernel changed since its rows were measured: measure it again (python plot.py, or the fp8 version's script)
    on_disk = provenance.hashes(f"matmul_{version}")
    recorded = RECORDED[version]["programs"]
    # a kernel table none of whose programs were recorded (v11's promoted one, before it was first measured)
    # measured no row: its schedules are left out
    measured = {table(key) for key in recorded}
    changed = sorted(key for key in set(on_disk) | set(recorded)
                     if table(key) in measured and on_disk.get(key) != recorded.get(key))
    assert not changed, f"{version}'s rows were measured on other kernels; these schedules differ: {changed[:4]}"


def table(key: str) -> str:
    """The kernel table a recorded schedule belongs to: its prefix ('block-wise', 'promoted'), or '' for KERNELS."""
    return "" if key.startswith("block_m=") else key.split(" ")[0]
