"""docs/counters.py without a GPU: ncu's CSV parsed, the traffic model, the table and its place in results.md."""

import csv
import importlib.util
import re
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "docs" / "counters.py"
spec = importlib.util.spec_from_file_location("counters", SCRIPT)
counters = importlib.util.module_from_spec(spec)
spec.loader.exec_module(counters)

MiB = 2**20

# What `ncu --csv --page raw --print-units base` prints for one profiled kernel, ncu's own
# lines around it; one value in auto units (Mbyte) and one with thousands separators.
NCU_OUTPUT = """\
==PROF== Connected to process 4242 (/usr/bin/python3.12)
==PROF== Profiling "tilus_hopper_matmul_v4_kernel" - 0: 0%....50%....100% - 9 passes
==PROF== Disconnected from process 4242
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC",\
"dram__bytes_read.sum","dram__bytes_write.sum","gpu__time_duration.sum",\
"l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum","launch__grid_size",\
"sm__cycles_elapsed.avg.per_second","sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"
"","","","","","","","","","","","Mbyte","byte","nsecond","","","hz","%"
"0","4242","python3.12","127.0.0.1","tilus_hopper_matmul_v4_kernel","1","7","(288, 1, 1)","(512, 1, 1)","0","9.0",\
"148.90","33,554,432","188,224","524,288","512","1,755,000,000","81.37"
"""


def test_parse_raw_csv():
    [kernel] = counters.parse_raw_csv(NCU_OUTPUT)
    assert kernel["Kernel Name"] == "tilus_hopper_matmul_v4_kernel"
    assert kernel["dram__bytes_read.sum"] == pytest.approx(148.90e6)  # Mbyte scaled to bytes
    assert kernel["dram__bytes_write.sum"] == 33554432  # 4096 x 4096 fp16: C written once
    assert kernel["gpu__time_duration.sum"] == 188224
    assert kernel["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"] == 524288
    assert kernel["launch__grid_size"] == 512
    assert kernel["sm__cycles_elapsed.avg.per_second"] == 1.755e9
    assert kernel["sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"] == pytest.approx(81.37)


def test_parse_raw_csv_without_a_kernel():
    """ncu that profiled nothing prints no CSV: no rows, which --run reports with ncu's output."""
    assert counters.parse_raw_csv("==PROF== Disconnected from process 4242\n") == []


def test_model_4096_v3_order_by_hand():
    """4096^3, 128 x 256 tiles: 32 tile rows x 16 tile columns, 132 blocks in flight, tile rows fastest.

    An A tile row is 128 x 4096 fp16 = 1 MiB, a B tile column 256 x 4096 = 2 MiB. Blocks
    0-131 cover columns 0-4 (132 = 4 x 32 + 4): all 32 A rows and 5 B columns, 42 MiB;
    so do blocks 132-263 (columns 4-8) and 264-395 (8-12); blocks 396-511 cover columns
    12-15: 32 + 4 x 2 = 40 MiB. 3 x 42 + 40 = 166 MiB, the v3 cell of v4.md's table.
    """
    schedule = {"block_m": 128, "block_n": 256}
    assert counters.model_read_bytes("v3", schedule, 4096, 4096, 4096, 132) == 166 * MiB


def test_model_skinny_reads_a_and_b_once():
    """128 x 8192 x 8192, 128 x 64 tiles: 128 blocks, one wave: A (2 MiB) and B (128 MiB) once."""
    schedule = {"block_m": 128, "block_n": 64, "group_m": 16}
    assert counters.model_read_bytes("v4", schedule, 128, 8192, 8192, 132) == 130 * MiB


def test_model_matches_raster_table():
    """v4's grouped order at 132 blocks of 128 x 256 gives docs/raster.py's numbers (v4.md's traffic table)."""
    for m, n, k in [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 1024, 4096)]:
        for group_m in counters.raster.GROUPS:
            order = counters.raster.grouped_order(-(-m // 128), -(-n // 256), group_m)
            _, total_mib = counters.raster.hbm_traffic(order, m, n, k)
            schedule = {"block_m": 128, "block_n": 256, "group_m": group_m}
            assert counters.model_read_bytes("v4", schedule, m, n, k, 132) == pytest.approx(total_mib * MiB)


def test_model_v5_clusters_walk_units_of_two_tile_rows():
    """A 2-CTA cluster's unit is two tile rows sharing one B tile: 66 units in flight on 132 SMs.

    The same as v4's order over 256-row tiles with 66 blocks in flight.
    """
    v5 = {"block_m": 128, "block_n": 256, "group_m": 8, "cluster_m": 2}
    v4 = {"block_m": 256, "block_n": 256, "group_m": 8}
    assert counters.model_read_bytes("v5", v5, 4096, 4096, 4096, 132) == \
        counters.model_read_bytes("v4", v4, 4096, 4096, 4096, 66)


def test_model_edge_tiles_read_only_what_exists():
    """M = 100 with 128-row tiles: the one tile row reads 100 rows of A, not 128."""
    schedule = {"block_m": 128, "block_n": 64, "group_m": 8}
    assert counters.model_read_bytes("v4", schedule, 100, 64, 64, 132) == (100 + 64) * 64 * 2


def _row(version: str, m: int, **changes) -> dict:
    row = {"gpu": "NVIDIA H100 80GB HBM3", "version": version, "dtype": "fp16", "m": m, "n": 4096, "k": 4096,
           "config": "block_m=128 block_n=256", "tensor_pipe_pct": "81.37", "dram_read_bytes": str(150 * MiB),
           "dram_write_bytes": str(32 * MiB), "smem_conflicts_st": "524288", "smem_conflicts_ld": "0",
           "occupancy_pct": "14.06", "kernel_ns": "188224", "sm_hz": "1.755e+09", "grid": "512",
           "blocks_per_sm": "1", "model_read_bytes": str(142 * MiB), "ms_min": "0.1801", "ms_median": "0.1823",
           "ms_max": "0.1911", "runs": "30", "tensor_metric": counters.TENSOR_METRICS[0], "tilus": "0.2.0",
           "torch": "2.11.0+cu130", "date": "2026-11-24"}
    return row | changes


def _write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=counters.FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def test_table_from_csv(tmp_path):
    csv_path = tmp_path / "h100_counters.csv"
    _write_csv(csv_path, [_row("v5", 4096, smem_conflicts_st="0"), _row("v4", 4096), _row("v4", 128)])
    page = tmp_path / "index.md"
    page.write_text("before\n<!-- counters h100 -->\nNot measured yet.\n<!-- /counters -->\nafter\n")
    assert counters.update_page(page, csv_path) == 0
    text = page.read_text()
    assert text.startswith("before\n<!-- counters h100 -->\n| version |")
    assert text.endswith("<!-- /counters -->\nafter\n")
    assert "Not measured yet" not in text
    rows = [line for line in text.splitlines() if re.match(r"\| v\d ", line)]
    assert rows == [
        "| v4 | 4096x4096x4096 | `block_m=128 block_n=256` | 81.4 | 150 (142) | 32 | 524288 / 0 | 14.1 "
        "| 0.1801 / 0.1823 / 0.1911 |",
        "| v5 | 4096x4096x4096 | `block_m=128 block_n=256` | 81.4 | 150 (142) | 32 | 0 / 0 | 14.1 "
        "| 0.1801 / 0.1823 / 0.1911 |",
        "| v4 | 128x4096x4096 | `block_m=128 block_n=256` | 81.4 | 150 (142) | 32 | 524288 / 0 | 14.1 "
        "| 0.1801 / 0.1823 / 0.1911 |",
    ]
    assert counters.update_page(page, csv_path) == 0 and page.read_text() == text  # rewriting changes nothing


def test_table_without_csv_fails_loudly(tmp_path, capsys):
    page = tmp_path / "index.md"
    original = "<!-- counters h100 -->\nNot measured yet.\n<!-- /counters -->\n"
    page.write_text(original)
    assert counters.update_page(page, tmp_path / "missing.csv") == 1
    assert "does not exist" in capsys.readouterr().err
    assert page.read_text() == original


def test_table_without_block_fails_loudly(tmp_path, capsys):
    page = tmp_path / "index.md"
    page.write_text("no block here\n")
    assert counters.update_page(page, tmp_path / "missing.csv") == 1
    assert "no <!-- counters" in capsys.readouterr().err


def test_results_page_has_the_counters_table_its_csv_writes():
    # the block in docs/results.md is what `python docs/counters.py --table` writes from results/h100_counters.csv
    blocks = counters.BLOCK.findall(counters.PAGE.read_text())
    assert [gpu for _, gpu, _, _ in blocks] == ["h100"]
    rows = counters.read_rows(counters.REPO / "results" / "h100_counters.csv")
    assert blocks[0][2] == counters.table(rows), "run python docs/counters.py --table"


# --- v9 beside cuBLAS -------------------------------------------------------------------------------

def _limit_rows() -> list[dict]:
    common = {"n": 5000, "k": 2056, "grid": "132", "sm_active_pct": "80", "tensor_pipe_pct": "75",
              "l2_bytes": str(700 * MiB)}
    return [_row("v9", 3000, config="block_m=128 block_n=256 block_k=64 stages=4 cluster_m=2 swap_ab=False",
                 **common),
            _row("cublas", 3000, config="nvjet_sm90_tst_152x256_64x4_1x2_h_bz_coopA_TNN", model_read_bytes="",
                 **common | {"sm_active_pct": "95"}),
            _row("v4", 4096)]


def test_limits_table_v9_beside_cublas(tmp_path):
    csv_path = tmp_path / "h100_counters.csv"
    _write_csv(csv_path, _limit_rows())
    page = tmp_path / "results.md"
    page.write_text("<!-- counters h100 -->\n<!-- /counters -->\n"
                    "<!-- counters-limits h100 -->\nNot measured yet.\n<!-- /counters-limits -->\n")
    assert counters.update_page(page, csv_path) == 0
    text = page.read_text()
    limits = text[text.index("<!-- counters-limits"):]
    rows = [line for line in limits.splitlines() if line.startswith("| 3000x")]
    # 24 x 20 = 480 tiles of 128 x 256 over 132 CTAs; the tensor pipe's share of the time is 80% x 75% = 60%
    assert rows == [
        "| 3000x5000x2056 | v9 | `block_m=128 block_n=256 block_k=64 stages=4 cluster_m=2 swap_ab=False` "
        "| 480 (3.64) | 188.2 | 80.0 | 75.0 | 60.0 | 700 | 150 |",
        "| 3000x5000x2056 | cublas | `nvjet_sm90_tst_152x256_64x4_1x2_h_bz_coopA_TNN` | - | 188.2 | 95.0 | 75.0 "
        "| 71.2 | 700 | 150 |",
    ]
    assert "Measured 2026-11-24 with tilus 0.2.0, torch 2.11.0+cu130" in limits
    counters_block = text[:text.index("<!-- counters-limits")]
    assert "| v4 |" in counters_block and "cublas" not in counters_block and "| v9 |" not in counters_block


def test_limits_table_swapped_tiles_count_the_callers_n_as_m():
    row = _row("v9", 16, n=4096, config="block_m=128 block_n=16 swap_ab=True", grid="132")
    assert counters.tiles(row) == "32 (0.24)"  # 4096 / 128 weight rows x 1 tile of 16 tokens


def test_limits_table_without_its_rows_fails_loudly(tmp_path, capsys):
    csv_path = tmp_path / "h100_counters.csv"
    _write_csv(csv_path, [_row("v4", 4096)])
    page = tmp_path / "results.md"
    original = ("<!-- counters h100 -->\n<!-- /counters -->\n"
                "<!-- counters-limits h100 -->\nNot measured yet.\n<!-- /counters-limits -->\n")
    page.write_text(original)
    assert counters.update_page(page, csv_path) == 1
    assert "--versions v9 cublas" in capsys.readouterr().err
    assert page.read_text() == original


def test_results_page_has_the_limits_table_its_csv_writes():
    blocks = counters.LIMITS.findall(counters.PAGE.read_text())
    assert [gpu for _, gpu, _, _ in blocks] == ["h100"]
    rows = counters.read_rows(counters.REPO / "results" / "h100_counters.csv")
    assert blocks[0][2] == counters.limits_table(rows), "run python docs/counters.py --table"


# --- the counters line on each version's page -------------------------------------------------------

def _versions_at_4096(**per_version) -> list[dict]:
    """A row per version at 4096^3, each changed by per_version[version], and one skinny row that must be ignored."""
    return [_row(version, 4096, **per_version.get(version, {})) for version in counters.VERSIONS] + \
        [_row("v2", 128, ms_median="9.9")]


def test_version_lines_from_a_small_csv(tmp_path):
    csv_path = tmp_path / "h100_counters.csv"
    _write_csv(csv_path, _versions_at_4096(
        v1={"ms_median": "0.4", "tensor_pipe_pct": "50.04"},
        v2={"ms_median": "0.3", "tensor_pipe_pct": "75.06"},
        v3={"ms_median": "0.25", "tensor_pipe_pct": "80", "dram_read_bytes": str(170 * MiB),
            "model_read_bytes": str(166 * MiB)},
        v4={"ms_median": "0.24", "dram_read_bytes": str(140.4 * MiB), "model_read_bytes": str(142 * MiB)},
        v5={"ms_median": "0.22", "tensor_pipe_pct": "85.04"},
        v6={"ms_median": "0.2", "tensor_pipe_pct": "90", "smem_conflicts_st": "10030"},
        v7={"ms_median": "0.18", "tensor_pipe_pct": "93.05", "dram_read_bytes": str(120 * MiB),
            "model_read_bytes": str(118 * MiB)}))
    rows = counters.read_rows(csv_path)
    head = ("**Measured** (H100 80GB HBM3, fp16, 4096³, median of 30 runs; "
            "[counters](results.md#counters)). ")
    lines = {version: counters.version_line(rows, version) for version in counters.VERSIONS}
    assert lines["v1"] == head + (f"v1: {counters.CHANGES['v1'][0]}. "
                                  "Time: 0.4000 ms; tensor pipe busy 50.0% of active cycles.")
    assert lines["v2"] == head + (f"v2: {counters.CHANGES['v2'][0]}. Time: 0.4000 → 0.3000 ms against v1 (-25.0%). "
                                  "Why: tensor pipe busy 50.0% → 75.1% of active cycles.")
    assert lines["v3"].endswith("Time: 0.3000 → 0.2500 ms against v2 (-16.7%). "
                                "Why: tensor pipe busy 75.1% → 80.0% of active cycles.")
    assert lines["v4"].endswith("Time: 0.2500 → 0.2400 ms against v3 (-4.0%). "
                                "Why: DRAM read 170 → 140 MiB (traffic model 166 → 142).")
    assert lines["v5"].endswith("Time: 0.2400 → 0.2200 ms against v4 (-8.3%). "
                                "Why: tensor pipe busy 81.4% → 85.0% of active cycles.")
    assert lines["v6"].endswith("Time: 0.2200 → 0.2000 ms against v5 (-9.1%). "
                                "Why: shared-memory store bank conflicts 524288 → 10030; "
                                "tensor pipe busy 85.0% → 90.0% of active cycles.")
    assert lines["v7"].endswith("Time: 0.2000 → 0.1800 ms against v6 (-10.0%). "
                                "Why: DRAM read 150 → 120 MiB (traffic model 142 → 118); "
                                "tensor pipe busy 90.0% → 93.0% of active cycles.")
    assert all("\n" not in line for line in lines.values())

    pages = []
    for version in counters.VERSIONS:
        page = tmp_path / f"{version}.md"
        page.write_text(f"# {version}\n\n- a change\n\n<!-- counters-line h100 {version} -->\nNot generated yet.\n"
                        "<!-- /counters-line -->\n\n## next\n")
        pages.append(page)
    assert counters.update_lines(pages, csv_path) == 0
    for version, page in zip(counters.VERSIONS, pages):
        assert page.read_text() == (f"# {version}\n\n- a change\n\n<!-- counters-line h100 {version} -->\n"
                                    f"{lines[version]}\n<!-- /counters-line -->\n\n## next\n")
    texts = [page.read_text() for page in pages]
    assert counters.update_lines(pages, csv_path) == 0  # rewriting changes nothing
    assert [page.read_text() for page in pages] == texts


def test_version_line_without_the_previous_version_fails_loudly(tmp_path, capsys):
    csv_path = tmp_path / "h100_counters.csv"
    _write_csv(csv_path, [_row("v5", 4096)])
    with pytest.raises(KeyError, match="v4"):
        counters.version_line(counters.read_rows(csv_path), "v5")
    page = tmp_path / "v5.md"
    original = "<!-- counters-line h100 v5 -->\nNot generated yet.\n<!-- /counters-line -->\n"
    page.write_text(original)
    assert counters.update_lines([page], csv_path) == 1
    assert "no counters row for v4" in capsys.readouterr().err
    assert page.read_text() == original


def test_version_line_without_marker_fails_loudly(tmp_path, capsys):
    page = tmp_path / "v3.md"
    page.write_text("no line here\n")
    assert counters.update_lines([page], tmp_path / "missing.csv") == 1
    assert "no <!-- counters-line" in capsys.readouterr().err


@pytest.mark.parametrize("version", counters.VERSIONS)
def test_every_version_page_has_its_generated_line(version):
    """Each docs/vN.md carries one counters line, as `python docs/counters.py --table` writes it from the CSV."""
    text = (counters.DOCS / f"{version}.md").read_text()
    matches = counters.LINE.findall(text)
    assert [(gpu, page_version) for _, gpu, page_version, _, _ in matches] == [("h100", version)], \
        f"{version}.md needs one <!-- counters-line h100 {version} --> line"
    rows = counters.read_rows(counters.REPO / "results" / "h100_counters.csv")
    assert matches[0][3] == counters.version_line(rows, version) + "\n", "run python docs/counters.py --table"
