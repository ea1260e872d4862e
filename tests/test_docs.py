"""The walkthrough and README say what the code and the measurements say."""

import importlib.util
import re
import textwrap

import pytest
from conftest import ARCHS, STAGES

import plot
from support import cache

DOCS = sorted((cache.REPO / "docs").glob("*.md"))
_spec = importlib.util.spec_from_file_location("evidence", cache.REPO / "docs" / "evidence.py")
evidence = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(evidence)
EXCERPT = re.compile(r"<!-- source: (\S+) -->\n```python\n(.*?)```", re.DOTALL)


def excerpts():
    for doc in DOCS:
        for number, (source, code) in enumerate(EXCERPT.findall(doc.read_text())):
            yield pytest.param(doc, source, code, id=f"{doc.name}-{number}")


@pytest.mark.parametrize("doc, source, code", list(excerpts()))
def test_excerpt_is_verbatim_from_its_source(doc, source, code):
    excerpt = textwrap.dedent(code).splitlines()
    lines = (cache.REPO / source).read_text().splitlines()
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
    assert (cache.REPO / "docs" / f"{version}.md").exists()
    assert f"| `{stage}.py` |" in (cache.REPO / "README.md").read_text()
    assert f"({version}.md)" in (cache.REPO / "docs" / "index.md").read_text()
    assert f'"{stage}"' in (cache.REPO / "pyproject.toml").read_text()


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


def test_evidence_tables_match_the_builds(built, tmp_path):
    # docs/evidence.py writes each page's table from the builds; CI rebuilds every schedule
    tables = {stage.removeprefix("matmul_"): evidence.evidence_table({arch: built(stage, arch) for arch in ARCHS})
              for stage in STAGES}
    copies = []
    for version in tables:
        page = cache.REPO / "docs" / f"{version}.md"
        assert f"<!-- evidence {version} -->" in page.read_text(), f"{page.name} has no evidence table"
        copy = tmp_path / page.name
        copy.write_text(page.read_text())
        copies.append(copy)
    assert evidence.update_pages(tables, copies) == [], "run python docs/evidence.py"


PAGES = [cache.REPO / "README.md", *DOCS]
FILE_MENTION = re.compile(r"`((?:[\w.-]+/)*[\w.-]+\.(?:py|md|toml|csv|svg|png))`")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
REPO_FILES = {path.relative_to(cache.REPO).as_posix() for path in cache.REPO.rglob("*")
              if not any(part.startswith(".") for part in path.relative_to(cache.REPO).parts)}


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_file_a_page_mentions_exists(page):
    text = page.read_text()
    for target in LINK.findall(text):
        if not target.startswith(("http://", "https://")):
            assert (page.parent / target).exists(), f"{page.name} links to {target}, which does not exist"
    for name in FILE_MENTION.findall(text):
        # a path from the repository root or the page, or a file name that exists somewhere in the repository
        found = (cache.REPO / name).exists() or (page.parent / name).exists() or any(
            f == name or f.endswith("/" + name) for f in REPO_FILES
        )
        assert found, f"{page.name} mentions `{name}`, which does not exist"


def test_every_page_is_linked_from_the_index():
    index = (cache.REPO / "docs" / "index.md").read_text()
    for page in DOCS:
        if page.name != "index.md":
            assert f"]({page.name})" in index, f"docs/index.md does not link {page.name}"
