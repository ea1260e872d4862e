"""The walkthrough and README say what the code and the measurements say."""

import re
import textwrap

import pytest
from conftest import STAGES

import harness
import plot

DOCS = sorted((harness.REPO / "docs").glob("*.md"))
EXCERPT = re.compile(r"<!-- source: (\S+) -->\n```python\n(.*?)```", re.S)


def excerpts():
    for doc in DOCS:
        for number, (source, code) in enumerate(EXCERPT.findall(doc.read_text())):
            yield pytest.param(doc, source, code, id=f"{doc.name}-{number}")


@pytest.mark.parametrize("doc, source, code", list(excerpts()))
def test_excerpt_is_verbatim_from_its_source(doc, source, code):
    excerpt = textwrap.dedent(code).splitlines()
    lines = (harness.REPO / source).read_text().splitlines()
    width = len(excerpt)
    windows = (textwrap.dedent("\n".join(lines[i : i + width])).splitlines() for i in range(len(lines) - width + 1))
    assert excerpt in windows, f"{doc.name}: this excerpt is not a contiguous part of {source}:\n{code}"


def test_every_excerpt_names_its_source():
    for doc in DOCS:
        text = doc.read_text()
        assert text.count("```python") == len(EXCERPT.findall(text)), f"{doc.name} has a python block without a source"


@pytest.mark.parametrize("stage", STAGES)
def test_every_stage_is_registered(stage):
    # a new stage needs its walkthrough, its README row and its place in the packaging
    version = stage.removeprefix("matmul_")
    assert (harness.REPO / "docs" / f"{version}.md").exists()
    assert f"| `{stage}.py` |" in (harness.REPO / "README.md").read_text()
    assert f"({version}.md)" in (harness.REPO / "docs" / "index.md").read_text()
    assert f'"{stage}"' in (harness.REPO / "pyproject.toml").read_text()


def test_results_tables_match_the_measurements(tmp_path):
    # plot.py writes the tables from results/<gpu>.csv; copies must come out unchanged
    copies = []
    for document in plot.DOCUMENTS:
        copy = tmp_path / document.name
        copy.write_text(document.read_text())
        copies.append(copy)
    assert any(plot.BLOCK.search(copy.read_text()) for copy in copies)
    assert plot.update_documents(documents=copies) == [], "run python plot.py --from results/<gpu>.csv"


def test_figures_referenced_exist():
    for document in plot.DOCUMENTS:
        for target in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", document.read_text()):
            assert (document.parent / target).exists(), f"{document.name}: {target}"
