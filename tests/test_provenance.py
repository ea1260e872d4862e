"""CPU (CI): every version's rows in results/ were measured on the kernels on disk (support/provenance.py)."""

import pytest

from support import cli, provenance, versions

RECORDED = provenance.read()


RESULTS = sorted(cli.RESULTS_DIR.glob("*.csv"))


def test_every_measured_version_has_its_programs_recorded():
    missing = set().union(*map(provenance.versions_in, RESULTS)) - set(RECORDED)
    assert not missing, f"rows of {sorted(missing)} with no record of the code that measured them"


@pytest.mark.parametrize("path", RESULTS, ids=lambda path: path.name)
def test_each_file_was_measured_on_the_recorded_programs(path):
    # a kernel changed and measured again into some files, not this one: its rows of it are the old kernel's
    stale = sorted(version for version in provenance.versions_in(path)
                   if RECORDED.get(version, {}).get("files", {}).get(path.name)
                   != provenance.digest(RECORDED.get(version, {}).get("programs", {})))
    assert not stale, (f"results/{path.name}: the rows of {stale} were not measured on their recorded programs "
                       "(measure them again into this file)")


def test_a_file_not_measured_again_keeps_the_old_digest(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "PATH", tmp_path / "provenance.json")
    provenance.PATH.write_text("{}")
    one, two = cli.RESULTS_DIR / "one.csv", cli.RESULTS_DIR / "two.csv"
    provenance.record("v9", {"a": "1"}, files=[one, two, tmp_path / "elsewhere.csv"])
    provenance.record("v9", {"a": "2"}, files=[one])
    files = provenance.read()["v9"]["files"]
    assert files == {"one.csv": provenance.digest({"a": "2"}), "two.csv": provenance.digest({"a": "1"})}


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
