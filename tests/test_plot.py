"""plot.py re-plots a results CSV without a GPU and renders the results tables from it."""

import csv

import pytest

import plot
from support import cli

COPY_BYTES_PER_S = 3.0e12


def share_of_copy(m: int, n: int, k: int, ms: str) -> str:
    return f"{100 * (m * k + n * k + m * n) * 2 / (float(ms) * 1e-3) / COPY_BYTES_PER_S:.4g}"


COMMON = {"gpu": "NVIDIA H100 80GB HBM3", "dtype": "fp16", "rel_err": "2.1e-04", "config": "block_m=128",
          "tilus": "0.2.0", "torch": "2.11", "date": "2026-11-22"}
ROWS = [
    COMMON | {"version": v, "regime": regime, "m": m, "n": n, "k": k, "ms": ms, "tflops": tf, "pct_of_cublas": pct,
              "host_us": host, "sm_mhz": mhz, "power_w": "690", "tflops_per_ghz": per_ghz, "pct_of_clock_peak": peak,
              "pct_of_bandwidth": share_of_copy(m, n, k, ms)}
    for v, regime, m, n, k, ms, tf, pct, host, mhz, per_ghz, peak in [
        ("v1", "burst", 4096, 4096, 4096, "0.3", "458.1", "60.0", "20.5", "1900", "241.1", "44.6"),
        ("cublas", "burst", 4096, 4096, 4096, "0.18", "763.5", "100.0", "25.0", "1800", "424.2", "78.4"),
        ("v1", "back-to-back", 4096, 4096, 4096, "0.31", "443.4", "61.3", "20.5", "1300", "341.1", "63.1"),
        ("cublas", "back-to-back", 4096, 4096, 4096, "0.19", "723.4", "100.0", "25.0", "1310", "552.2", "102.1"),
        ("v1", "burst", 8192, 8192, 8192, "2.0", "549.8", "72.0", "21.0", "1850", "297.2", "55.0"),
        ("cublas", "burst", 8192, 8192, 8192, "1.44", "763.6", "100.0", "26.0", "1800", "424.2", "78.5"),
        ("v1", "burst", 512, 512, 512, "0.01", "26.8", "40.0", "19.0", "1980", "13.5", "2.5"),
        ("triton", "burst", 512, 512, 512, "0.006", "44.7", "66.7", "60.0", "1980", "22.6", "4.2"),
        ("cublas", "burst", 512, 512, 512, "0.004", "67.1", "100.0", "24.0", "1980", "33.9", "6.3"),
        ("triton", "burst", 4096, 4096, 4096, "0.19", "723.4", "94.7", "70.0", "1800", "401.9", "74.3"),
        # decode: 1 x 4096 x 4096 moves 33.6 MB; at 0.0112 ms that is 3.0 TB/s
        ("v1", "back-to-back", 1, 4096, 4096, "0.0224", "1.5", "50.0", "20.0", "1980", "0.76", "0.1"),
        ("cublas", "back-to-back", 1, 4096, 4096, "0.0112", "3.0", "100.0", "25.0", "1980", "1.5", "0.3"),
    ]
]


def write_fixture(path, rows=ROWS, fields=cli.CSV_FIELDS):
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def test_replot_from_csv(tmp_path):
    source = tmp_path / "h100.csv"
    write_fixture(source)
    paths = plot.plot(plot.read_rows(source), "h100", out_dir=tmp_path)
    names = ["perf_h100", "sizes_h100", "classes_h100"]
    assert [p.name for p in paths] == [f"{name}.{ext}" for name in names for ext in ("svg", "png")]
    assert all(p.stat().st_size > 1000 for p in paths)


def test_rows_from_before_the_regime_column_read_as_fp16_burst(tmp_path):
    source = tmp_path / "h100.csv"
    old_fields = ["gpu", "version", "m", "n", "k", "ms", "tflops", "pct_of_cublas", "rel_err", "config", "tilus", "torch",
                  "date"]
    write_fixture(source, ROWS[:2], old_fields)
    rows = plot.read_rows(source)
    assert [(r["dtype"], r["regime"], r["host_us"]) for r in rows] == [("fp16", "burst", "")] * 2


def test_saved_rows_replace_only_their_regime(tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "RESULTS_DIR", tmp_path)
    cli.save_rows(ROWS[:4], "h100")
    cli.save_rows([ROWS[2] | {"ms": "0.29"}], "h100")
    rows = plot.read_rows(tmp_path / "h100.csv")
    assert len(rows) == 4
    assert {(r["version"], r["regime"]): r["ms"] for r in rows}[("v1", "back-to-back")] == "0.29"
    assert {(r["version"], r["regime"]): r["ms"] for r in rows}[("v1", "burst")] == "0.3"


def test_one_version_table_has_both_regimes_with_clock_and_host_cost(tmp_path):
    source = tmp_path / "h100.csv"
    write_fixture(source)
    table = plot.results_table(plot.read_rows(source), ["v1"])
    assert ("| square | 4096x4096x4096 | back-to-back | 443.4 | 61.3 | 20.5 | 1300 | 690 | 341.1 (63.1%) | "
            "- | 2.1e-04 | `block_m=128` |") in table
    assert "| decode | 1x4096x4096 | back-to-back | 1.5 | 50.0 | 20.0 | 1980 | 690 | 0.8 (0.1%) | 1.50 (50%) |" in table
    assert "| square | 4096x4096x4096 | burst | 458.1 | 60.0 |" in table
    assert "NVIDIA H100 80GB HBM3" in table and "Measured 2026-11-22" in table


def test_one_version_table_gives_the_energy_of_a_gemm_beside_cublas(tmp_path):
    source = tmp_path / "h100.csv"
    energy = {("v1", "0.31"): ("0.64", "197"), ("cublas", "0.19"): ("1.05", "131")}
    write_fixture(source, [r | dict(zip(("tflops_per_w", "mj_per_gemm"), energy[r["version"], r["ms"]]))
                           if (r["version"], r["ms"]) in energy else r for r in ROWS])
    table = plot.results_table(plot.read_rows(source), ["v1"])
    assert "| square | 4096x4096x4096 | 0.64 (197 mJ) | 1.05 (131 mJ) |" in table
    assert table.index("| square | 4096x4096x4096 | burst |") < table.index("**energy, back-to-back**")


def test_tables_are_rewritten_between_markers(tmp_path):
    write_fixture(tmp_path / "h100.csv")
    doc = tmp_path / "page.md"
    doc.write_text("before\n<!-- results h100 v1 -->\nstale\n<!-- /results -->\nafter\n")
    assert plot.update_documents(csv_dir=tmp_path, documents=[doc]) == [doc]
    text = doc.read_text()
    assert "stale" not in text and "| square | 8192x8192x8192 | burst | 549.8 | 72.0 |" in text and text.endswith("after\n")


def test_comparison_tables_per_regime_with_peer_decode_and_host_cost(tmp_path):
    source = tmp_path / "h100.csv"
    write_fixture(source)
    table = plot.results_table(plot.read_rows(source), ["v1", "triton"])
    back_to_back, burst = table.split("**burst**")
    assert "| class | size | v1 | Triton (torch.compile) | cuBLAS |" in burst
    assert "| square | 4096x4096x4096 | 458.1 (60.0%) | 723.4 (94.7%) | 763.5 TFLOPS, 1800 MHz |" in burst
    assert "| square | 4096x4096x4096 | 443.4 (61.3%) | - | 723.4 TFLOPS, 1310 MHz |" in back_to_back
    # decode in bytes over time, cuBLAS with its share of the copy bandwidth
    assert "| decode | 1x4096x4096 | 1.50 TB/s (50.0%) | - | 3.00 TB/s, 100% of copy, 1980 MHz |" in back_to_back
    assert "| 20.2 (20.0-20.5) | - | 25.0 (25.0-25.0) |" in burst  # host µs, from the back-to-back rows
    assert "Copy bandwidth: 3.00 TB/s" in table
    assert "512x512x512" not in table  # the square sweep is plotted, not tabled


def test_a_peer_from_an_earlier_run_is_said_to_be(tmp_path):
    # each row's % is against its own run's cuBLAS: a peer timed beside these cuBLAS rows implies their times
    source = tmp_path / "h100.csv"
    write_fixture(source)
    earlier = "is from an earlier run than the others"
    assert earlier not in plot.results_table(plot.read_rows(source), ["v1", "triton"])
    write_fixture(source, [r | {"pct_of_cublas": "90.0"} if r["version"] == "triton" and r["m"] == 4096 else r
                           for r in ROWS])
    assert "The Triton (torch.compile) column " + earlier in plot.results_table(plot.read_rows(source), ["v1", "triton"])


def test_shape_classes():
    assert [plot.shape_class(*size) for size in [(1, 4096, 4096), (64, 14336, 4096), (128, 8192, 8192),
                                                 (4096, 4096, 4096), (4096, 14336, 4096), (16384, 1024, 4096)]] == [
        "decode", "decode", "skinny", "square", "LLM-like", "few tiles"]
    assert sum(plot.shape_class(*cli.parse_size(size)) == "decode" for size in plot.CLASS_SIZES) == 9


def test_bf16_tables_and_the_dtype_comparison(tmp_path):
    bf16 = [row | {"dtype": "bf16", "pct_of_cublas": f"{float(row['pct_of_cublas']) - 1:.1f}"} for row in ROWS
            if row["version"] != "cublas"] + [row | {"dtype": "bf16"} for row in ROWS if row["version"] == "cublas"]
    source = tmp_path / "h100.csv"
    write_fixture(source, ROWS + bf16)
    rows = plot.read_rows(source)
    table = plot.results_table(rows, ["v1"], "bf16")
    assert "| square | 4096x4096x4096 | burst | 458.1 | 59.0 |" in table and "bf16 in and out" in table
    assert "| square | 4096x4096x4096 | burst | 458.1 | 60.0 |" in plot.results_table(rows, ["v1"])  # fp16 by default
    comparison = plot.dtype_table(rows, "v1")
    assert "| square | 4096x4096x4096 | back-to-back | 61.3 | 60.3 | -1.0 |" in comparison
    assert "| decode | 1x4096x4096 | back-to-back | 50.0 | 49.0 | -1.0 |" in comparison
    doc = tmp_path / "page.md"
    doc.write_text("<!-- results h100 v1 bf16 -->\n<!-- /results -->\n<!-- dtypes h100 v1 -->\n<!-- /dtypes -->\n")
    plot.update_documents(csv_dir=tmp_path, documents=[doc])
    assert "| 59.0 |" in doc.read_text() and "| -1.0 |" in doc.read_text()
    paths = plot.plot(rows, "h100", out_dir=tmp_path)
    assert [p.name for p in paths][-2:] == ["classes_bf16_h100.svg", "classes_bf16_h100.png"]


def test_where_a_version_trails_the_one_before_is_listed_from_the_rows(tmp_path):
    v1 = [row | {"config": "block_m=128 block_n=128 block_k=64"} if row["version"] == "v1" else row for row in ROWS]
    v2 = [row | {"version": "v2", "config": "block_m=128 block_n=256 block_k=64 stages=4",
                 "pct_of_cublas": f"{float(row['pct_of_cublas']) + (1 if row['regime'] == 'burst' else -2):.1f}"}
          for row in v1 if row["version"] == "v1"]
    write_fixture(tmp_path / "h100.csv", v1 + v2)
    doc = tmp_path / "page.md"
    doc.write_text("<!-- trails h100 v2 -->\nstale\n<!-- /trails -->\n")
    plot.update_documents(csv_dir=tmp_path, documents=[doc])
    text = doc.read_text()
    # v2 is behind back to back only, at both class shapes there; v1's tile is shown beside v2's
    assert ("| square | 4096x4096x4096 | back-to-back | 61.3 | 59.3 | -2.0 | 0.0 | +0.0% | 128 x 128 | "
            "128 x 256, 4 stages |" in text)  # the fixture's v2 has v1's TFLOPS per GHz
    assert "| decode | 1x4096x4096 | back-to-back | 50.0 | 48.0 | -2.0 |" in text
    assert "burst" not in text and "stale" not in text
    ahead = [row | {"pct_of_cublas": "99.0"} for row in v2]
    assert plot.trails_table(v1 + ahead, "v2").startswith("v2 is at least as fast as v1 at every class shape")


def test_a_gap_within_the_spread_is_not_a_trail(tmp_path):
    v1 = [row for row in ROWS if row["version"] == "v1"]
    v2 = [row | {"version": "v2", "pct_of_cublas": f"{float(row['pct_of_cublas']) - 2:.1f}", "pct_spread": "2.5"}
          for row in v1]
    assert plot.trails_table(v1 + v2, "v2").startswith("v2 is at least as fast as v1")
    narrower = [row | {"pct_spread": "1.5"} for row in v2]
    assert "| 61.3 | 59.3 | -2.0 | 1.5 |" in plot.trails_table(v1 + narrower, "v2")


def test_compare_versions_and_repeat_blocks_render_from_the_rows(tmp_path):
    v2 = [row | {"version": "v2", "config": "block_m=128 block_n=256 block_k=64 stages=4 cluster_m=2",
                 "pct_spread": "0.8"} for row in ROWS if row["version"] == "v1"]
    write_fixture(tmp_path / "h100.csv", ROWS + v2)
    write_fixture(tmp_path / "h100_repeat.csv", [row | {"pct_of_cublas": "62.0"} for row in v2 if row["m"] == 4096])
    doc = tmp_path / "page.md"
    doc.write_text("<!-- compare h100 v1,v2 4096 -->\n<!-- /compare -->\n<!-- repeat h100 -->\n<!-- /repeat -->\n")
    plot.update_documents(csv_dir=tmp_path, documents=[doc])
    text = doc.read_text()
    # the change's ± is the square class's repeatability (61.3 -> 62.0 measured twice), larger than half the spread
    assert "| 4096³ (square) | back-to-back | 61.3% | 61.3% | +0.0 ±0.7, level | 128 x 256, 4 stages, clusters of 2 |" in text
    assert "| 4096x4096x4096 | back-to-back | 61.3 / 62.0 |" in text
    assert "Largest difference between two measurements of a version: back-to-back 0.7 points, burst 2.0 points." in text
    table = plot.versions_table(plot.read_rows(tmp_path / "h100.csv"), "4096")
    assert "| `matmul_v1.py` | " in table and "| cuBLAS | `torch.matmul` | 764 TFLOPS, 1800 MHz | 723 TFLOPS, 1310 MHz |" in table


def test_ratio_and_spread_compare_each_round_with_cublas_in_the_same_round():
    from support import bench

    rounds = {"cublas": [[1.0, 1.0], [2.0, 2.0], [1.0]], "v1": [[2.0, 2.0], [2.0, 2.0], [1.25]]}
    pct, spread = bench.ratio_and_spread(rounds, "v1")
    assert pct == 100 * 1.0 / 2.0  # the medians of every timed ms: 1.0 and 2.0
    assert spread == 100 - 50  # the rounds' ratios: 50, 100 and 80 %
    assert bench.ratio_and_spread(rounds, "cublas") == (100.0, 100.0)  # its own rounds: 1, 2 and 1 ms around 1


def fp8_rows(contenders, date="2026-11-25"):
    """matmul_v11.py --full --peer's rows at 4096^3, both regimes: (name, ms, TFLOPS, % of the contender adding alike,
    error)."""
    fp8 = COMMON | {"date": date}
    return [fp8 | {"version": v, "dtype": "bf16" if v in ("v9", "cublas") else "fp8 " + next(
                       w for w in v.split() if w in ("tensor", "row", "block")),
                   "regime": regime, "m": 4096, "n": 4096, "k": 4096, "ms": ms, "tflops": tf, "pct_of_cublas": pct,
                   "pct_spread": "2.0", "pct_of_bandwidth": "15", "rel_err": err}
            for regime in ("burst", "back-to-back") for v, ms, tf, pct, err in contenders]


FP8_RUN = [("v10 tensor", "0.11", "1249", "95.5", "2.1e-03"),
           ("cublas fp8 tensor fast", "0.105", "1309", "100", "2.1e-03"),
           ("cublas fp8 tensor", "0.12", "1145", "100", "1.7e-03"),
           ("v11 tensor promoted", "0.14", "982", "85.7", "1.7e-03"),
           ("triton fp8 tensor fast", "0.14", "982", "75.0", "2.1e-03"),
           ("v10 row", "0.11", "1249", "101.0", "2.1e-03"), ("cublas fp8 row fast", "0.111", "1238", "100", "2.1e-03"),
           ("cublas fp8 row", "0.13", "1057", "100", "1.7e-03"), ("v11 row promoted", "0.15", "916", "86.7", "1.7e-03"),
           ("triton fp8 row fast", "0.148", "929", "75.1", "2.1e-03"),
           ("v11 block", "0.17", "808", "65.4", "1.7e-03"), ("cublas fp8 block", "0.112", "1227", "100", "1.7e-03"),
           ("v9", "0.22", "625", "99.0", "1.6e-03"), ("cublas", "0.176", "781", "100", "1.6e-03")]


def test_fp8_tables_render_each_scaling_and_the_triton_peer(tmp_path):
    write_fixture(tmp_path / "h100_fp8.csv", fp8_rows(FP8_RUN))
    doc = tmp_path / "page.md"
    doc.write_text("<!-- fp8 h100 large -->\n<!-- /fp8 -->\n<!-- fp8 h100 peer -->\nstale\n<!-- /fp8 -->\n"
                   "<!-- fp8 h100 accumulation 4096 -->\n<!-- /fp8 -->\n<!-- fp8 h100 errors -->\n<!-- /fp8 -->\n")
    plot.update_documents(csv_dir=tmp_path, documents=[doc])
    text = doc.read_text()
    # v10 against cuBLAS fast, ± half the spread; v11 block against cuBLAS block-wise; v10 per-tensor 0.22 / 0.11
    # = 2x v9
    assert "| size | regime | bf16: cuBLAS / v9 | per-tensor: cuBLAS fast / v10 | row-wise: cuBLAS fast / v10 | " \
           "block-wise: cuBLAS / v11 | v10 per-tensor / v9 speed |" in text
    assert "| 4096x4096x4096 | burst | 781 / 625 | 1,309 / 1,249 (95.5% ±1.0) | 1,238 / 1,249 (101.0% ±1.0) | " \
           "1,227 / 808 (65.4% ±1.0) | 2.00x |" in text
    assert "stale" not in text
    assert "| 4096x4096x4096 | back-to-back | 982 (75.0% ±1.0) / 1,249 (95.5% ±1.0) | 929 (75.1% ±1.0) / 1,249 " \
           "(101.0% ±1.0) |" in text
    # each way against cuBLAS adding alike; promoted over fast: cuBLAS 0.12 / 0.105, ours 0.14 / 0.11
    assert "| 4096x4096x4096 | per-tensor | burst | 1,309 / 1,249 (95.5% ±1.0) | 1,145 / 982 (85.7% ±1.0) | " \
           "1.14x / 1.27x | 2.10e-03 / 2.10e-03 | 1.70e-03 / 1.70e-03 |" in text
    assert "| 4096x4096x4096 | 4,096 | per-tensor | 2.10e-03 / 2.10e-03 | 1.70e-03 / 1.70e-03 |" in text
    assert "| 4096x4096x4096 | 4,096 | block-wise | - | 1.70e-03 / 1.70e-03 |" in text


def test_fp8_rows_from_before_the_fast_contenders_state_no_percent(tmp_path):
    # an earlier run timed v10 against cuBLAS's default (promoted): its stored % is not like for like, so no % is
    # shown, and a cuBLAS row's % of anything else (171% of bf16 cuBLAS) is never shown
    old = [c for c in FP8_RUN if "fast" not in c[0] and "promoted" not in c[0]]
    old = [("cublas fp8 tensor", "0.12", "1145", "171", "1.7e-03") if c[0] == "cublas fp8 tensor" else c for c in old]
    rows = fp8_rows(old)
    table = plot.fp8_table(rows, False)  # cuBLAS fast was not timed: its cells are "-"
    assert "| 4096x4096x4096 | burst | 781 / 625 | - / 1,249 | - / 1,249 | 1,227 / 808 (65.4% ±1.0) | 2.00x |" in table
    assert "171" not in table and "(95.5%" not in table
    assert plot.fp8_accumulation_table(rows).startswith("Not measured yet: `python matmul_v11.py --full`")
    # a like-for-like contender measured on another day is another run: no %
    rows = fp8_rows(FP8_RUN[:1]) + fp8_rows(FP8_RUN[1:2], date="2026-11-26")
    assert "(95.5%" not in plot.fp8_table(rows, False)


def test_fp8_peer_table_says_when_not_measured():
    assert plot.fp8_peer_table([]).startswith("Not measured yet:")
    assert plot.fp8_peer_table(fp8_rows(FP8_RUN[:1])).startswith("Not measured yet: `python matmul_v10.py --peer`")


def test_a_change_beyond_the_repeatability_is_not_level_and_unpaired_runs_are_not_compared(tmp_path):
    v2 = [row | {"version": "v2", "pct_of_cublas": f"{float(row['pct_of_cublas']) + 5:.1f}", "pct_spread": "0.2"}
          for row in ROWS if row["version"] == "v1"]
    again = [row | {"pct_of_cublas": f"{float(row['pct_of_cublas']) + 1:.1f}"} for row in v2 if row["m"] == 4096]
    table = plot.compare_table(ROWS + v2, "v1", "v2", ["4096"], again=again)
    assert "| 4096³ (square) | back-to-back | 61.3% | 66.3% | +5.0 ±1.0 |" in table
    # a second measurement from another day pairs with nothing: no repeatability, no repeat row
    other_day = [row | {"date": "2026-01-01"} for row in again]
    assert plot.repeatability(ROWS + v2, other_day) == {}
    assert "| 4096³ (square) | back-to-back | 61.3% | 66.3% | +5.0 ±0.1 |" in plot.compare_table(
        ROWS + v2, "v1", "v2", ["4096"], again=other_day)


def test_the_peers_second_measurement_does_not_set_the_versions_repeatability():
    again = [row | {"pct_of_cublas": f"{float(row['pct_of_cublas']) + 1:.1f}"} for row in ROWS if row["version"] == "v1"]
    peer = [row | {"version": plot.PEER} for row in ROWS if row["version"] == "v1"]
    peer_again = [row | {"pct_of_cublas": f"{float(row['pct_of_cublas']) + 20:.1f}"} for row in peer]
    assert max(plot.repeatability(ROWS + peer, again + peer_again).values()) == pytest.approx(1.0, abs=0.05)
    assert "of Triton (torch.compile): back-to-back 20.0 points" in plot.repeat_table(ROWS + peer, again + peer_again)

