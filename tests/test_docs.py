"""The walkthrough and README say what the code and the measurements say."""

import importlib.util
import re

import pytest

import plot
from support import cache, versions

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
    # line for line, indentation included: an excerpt shows the code as it stands in its file
    excerpt = code.splitlines()
    lines = (cache.REPO / source).read_text().splitlines()
    width = len(excerpt)
    windows = (lines[i : i + width] for i in range(len(lines) - width + 1))
    assert excerpt in windows, f"{doc.name}: this excerpt is not a contiguous part of {source}, indented as there:\n{code}"


def test_every_excerpt_names_its_source():
    for doc in DOCS:
        text = doc.read_text()
        assert text.count("```python") == len(EXCERPT.findall(text)), f"{doc.name} has a python block without a source"


@pytest.mark.parametrize("version", versions.lesson())
def test_every_version_is_registered(version):
    # a new version needs its walkthrough, its README row and its place in the packaging
    page = version.removeprefix("matmul_")
    assert (cache.REPO / "docs" / f"{page}.md").exists()
    assert f"| `{version}.py` |" in (cache.REPO / "README.md").read_text()
    assert f"({page}.md)" in (cache.REPO / "docs" / "index.md").read_text()
    assert f'"{version}"' in (cache.REPO / "pyproject.toml").read_text()


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


def test_evidence_tables_match_the_builds(tmp_path):
    # docs/evidence.py writes every version's table into docs/results.md from the builds (cached on disk: the
    # build tests have built them in this run)
    tables = {name.removeprefix("matmul_"): evidence.evidence_table(evidence.builds(name, progress=lambda line: None))
              for name in versions.lesson()}
    page = cache.REPO / "docs" / "results.md"
    for version in tables:
        assert f"<!-- evidence {version} -->" in page.read_text(), f"results.md has no evidence table for {version}"
    copy = tmp_path / page.name
    copy.write_text(page.read_text())
    assert evidence.update_pages(tables, [copy]) == [], "run python docs/evidence.py"


def test_lesson_pages_carry_no_results_dumps():
    # the measurements live in docs/results.md; a lesson page has its one small before/after table
    lesson = [page for page in DOCS if page.name not in ("results.md", "reference.md")]
    for page in lesson:
        text = page.read_text()
        for kind in ("results", "trails", "evidence", "dtypes", "launch", "counters h100", "repeat"):
            assert f"<!-- {kind} " not in text, f"{page.name} carries a <!-- {kind} --> block: it belongs in results.md"
        assert text.count("<!-- compare ") <= 1, f"{page.name} has more than one before/after table"


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


_spec = importlib.util.spec_from_file_location("diagrams", cache.REPO / "docs" / "diagrams.py")
diagrams = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(diagrams)
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+\.svg)\)")


def _images(page):
    return {(page.parent / target).resolve() for target in IMAGE.findall(page.read_text())}


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, cache.REPO / "docs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_figure_is_what_its_script_writes(tmp_path):
    # each committed figure, redrawn by the script that writes it (from results/ where it plots measurements),
    # byte for byte: matplotlib is pinned in the test extra, so the bytes are comparable
    timeline, raster, streamk = _script("timeline"), _script("raster"), _script("streamk")
    drawn = [*diagrams.main(tmp_path / "diagrams"), *timeline.main(tmp_path / "timeline"),
             raster.draw(tmp_path / "raster" / "raster.svg"), streamk.draw_4096(tmp_path / "streamk" / "streamk_4096.svg"),
             streamk.draw_decode(path=tmp_path / "streamk" / "decode_roofline.svg")]
    for source in sorted(plot.cli.RESULTS_DIR.glob("*.csv")):
        if "_" not in source.stem:  # results/<gpu>.csv: the measured figures
            drawn += plot.plot(plot.read_rows(source), source.stem, tmp_path / "plot")
    assert sorted(p.name for p in drawn) == sorted(p.name for p in diagrams.FIGURES.iterdir()), \
        "a figure in docs/figures/ that no script writes, or one a script writes that is not committed"
    stale = [p.name for p in drawn if (diagrams.FIGURES / p.name).read_bytes() != p.read_bytes()]
    assert not stale, f"stale figures {stale}: run python plot.py --from results/h100.csv (and python docs/diagrams.py)"


def test_every_figure_is_linked_from_a_page():
    linked_from_docs = set().union(*(_images(page) for page in DOCS))
    for name in diagrams.DRAWINGS:
        assert (diagrams.FIGURES / f"{name}.svg").resolve() in linked_from_docs, f"no page of docs/ shows {name}.svg"
    linked = linked_from_docs | _images(cache.REPO / "README.md")
    for figure in sorted(diagrams.FIGURES.glob("*.svg")):
        assert figure.resolve() in linked, f"docs/figures/{figure.name} is shown by no page"


def test_diagram_facts_match_the_kernels():
    from tilus.lang.instructions.mbarrier import BarrierInstructionGroup

    import matmul_v3
    import matmul_v7

    assert (diagrams.PRODUCER_INITIAL_PHASE, diagrams.CONSUMER_INITIAL_PHASE) == (
        BarrierInstructionGroup.producer_initial_phase, BarrierInstructionGroup.consumer_initial_phase)
    tile = [diagrams.BLOCK_M, diagrams.BLOCK_N]
    assert [*tile, diagrams.V3_STAGES] in matmul_v3.HopperMatmulV3._autotune_space["block_m, block_n, stages"]
    assert [*tile, diagrams.V7_STAGES] in matmul_v7.HopperMatmulV7._autotune_space["block_m, block_n, stages"]
    assert diagrams.V7_CLUSTER in matmul_v7.HopperMatmulV7._autotune_space["cluster_m"]

    def source(module):
        return re.sub(r"\s+", " ", (cache.REPO / f"{module}.py").read_text())

    v3, v5, v6, v7 = source("matmul_v3"), source("matmul_v5"), source("matmul_v6"), source("matmul_v7")
    assert f"self.attrs.warps = {diagrams.V3_WARPS} " in v3
    assert f"with self.thread_group(thread_begin={diagrams.V3_PRODUCER_THREAD}, num_threads=32): # producer" in v3
    assert "full_barriers = self.mbarrier.alloc(counts=[1] * self.stages)" in v3
    assert f"empty_barriers = self.mbarrier.alloc(counts=[{diagrams.V3_EMPTY_COUNT}] * self.stages)" in v3
    assert f"self.attrs.warps = {diagrams.V7_WARPS} #" in v7
    assert diagrams.V7_EMPTY_COUNT == 2 * diagrams.V7_CLUSTER
    assert "Pipeline(self.stages, consumer_arrivals=2 * self.cluster_m)" in v7
    assert "s_c_free = self.mbarrier.alloc(counts=[1, 1])" in v7
    assert "c_phase: uint32 = 1 - warpgroup" in v7  # warpgroup 0 takes the output tile first
    # the diagram's row-major tile is v5's, its box v6's: 64 columns with the 128-byte swizzle (the
    # 224-column tile alone takes 32)
    assert "shared_row_major(self.consumer_m, self.block_n)" in v5
    assert "swizzle = Swizzle(base={base}, bits={bits}, shift={shift}) if box_n == {box} else".format(
        **diagrams.SWIZZLE, box=diagrams.BOX_COLUMNS) in v6
    assert f"self.box_n = {diagrams.BOX_COLUMNS} if block_n % {diagrams.BOX_COLUMNS} == 0 else 32" in v6


def test_the_swizzle_diagram_is_the_stated_rule():
    # v5: chunk c of row r at chunk c ^ (r % 8), so one stmatrix matrix (chunk c of 8 rows) hits 8 bank groups
    swizzled = diagrams.swizzled_chunks(rows=16)
    assert all(p == c ^ (r % 8) for (r, c), p in swizzled.items())
    assert all(len({swizzled[r, c] for r in range(r0, r0 + 8)}) == 8 for r0 in (0, 8) for c in range(8))
    # v4: a 512-byte row puts chunk c of every row in the same 4 banks: an 8-way conflict
    row_major = diagrams.row_major_chunks()
    assert all(group == c for (r, c), group in row_major.items())


def test_the_ring_diagram_follows_the_pipeline_contract():
    steps = diagrams.ring_steps()
    stages = diagrams.V7_STAGES
    assert len(steps) > 2 * stages  # two trips round the ring and a bit
    for step in steps:
        trip = step["step"] // stages
        assert step["stage"] == step["step"] % stages
        assert step["producer_phase"] == diagrams.PRODUCER_INITIAL_PHASE ^ (trip % 2)
        assert step["consumer_phase"] == diagrams.CONSUMER_INITIAL_PHASE ^ (trip % 2)
        assert step["full"] > step["issue"] and step["work"] >= step["full"] and step["free"] > step["work"]
        if trip == 0:
            assert step["issue"] == step["ask"]  # the first trip's waits pass at once
        else:
            # a slot is refilled only once the consumer freed it, a trip earlier
            assert step["issue"] >= steps[step["step"] - stages]["free"]
    assert any(s["issue"] > s["ask"] for s in steps)  # the producer waits for an empty slot ...
    assert steps[0]["work"] > steps[0]["take"]  # ... and the consumer's first wait blocks


RANGE = re.compile(r"`(\w+)`\s+\((\d+)-(\d+)[),]")


def method_ranges(source: str) -> dict[str, list[tuple[int, int]]]:
    """name -> [(first, last)] of each method in a file: from its def to the line before the class's next statement
    (a def, a decorator, an attribute) or, at the class's end, its last line, 1-based."""
    lines = source.splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(r"    def \w+\(", line)]
    ends = [i for i, line in enumerate(lines) if re.match(r"    [^\s)]|\S", line)]  # the class's next statement
    found: dict[str, list[tuple[int, int]]] = {}
    for start in starts:
        end = next(i for i in [*ends, len(lines)] if i > start)
        if end < len(lines) and re.match(r"\S", lines[end]):  # the class ends: leave out its trailing blank lines
            while not lines[end - 1].strip():
                end -= 1
        found.setdefault(re.match(r"    def (\w+)", lines[start]).group(1), []).append((start + 1, end))
    return found


@pytest.mark.parametrize("version", [name.removeprefix("matmul_") for name in versions.lesson()])
def test_reading_the_whole_kernel_gives_each_method_its_lines(version):
    # `method` (first-last): the lines of matmul_vN.py that hold the method, as they are now
    page = (cache.REPO / "docs" / f"{version}.md").read_text()
    section = page.split("## Reading the whole kernel", 1)[1].split("\n## ", 1)[0]
    ranges = method_ranges((cache.REPO / f"matmul_{version}.py").read_text())
    cited = RANGE.findall(section)
    assert cited, f"{version}.md's 'Reading the whole kernel' names no method with its lines"
    wrong = [f"{name} ({a}-{b})" for name, a, b in cited if (int(a), int(b)) not in ranges.get(name, [])]
    assert not wrong, f"{version}.md: {wrong}; the file has {[(n, ranges.get(n)) for n, _, _ in cited]}"


def anchors(page) -> set[str]:
    """The anchors GitHub gives a page's headings: lowercased, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_anchor_a_page_links_exists(page):
    text = page.read_text()
    broken = []
    for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", text):
        linked = (page.parent / target) if target else page
        if linked.suffix == ".md" and linked.exists() and anchor not in anchors(linked):
            broken.append(f"{target}#{anchor}")
    assert not broken, f"{page.name} links headings that do not exist: {broken}"
