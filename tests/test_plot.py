"""plot.py re-plots a results CSV without a GPU and renders the results tables from it."""

import csv

import plot
from support import cli

ROWS = [
    {"gpu": "NVIDIA H100 80GB HBM3", "version": v, "m": s, "n": s, "k": s, "ms": ms, "tflops": tf,
     "pct_of_cublas": pct, "rel_err": "2.1e-04", "config": "block_m=128", "tilus": "0.2.0", "torch": "2.11",
     "date": "2026-11-22"}
    for v, s, ms, tf, pct in [
        ("v1", 4096, "0.3", "458.1", "60.0"), ("cublas", 4096, "0.18", "763.5", "100.0"),
        ("v1", 8192, "2.0", "549.8", "72.0"), ("cublas", 8192, "1.44", "763.6", "100.0"),
        ("v1", 512, "0.01", "26.8", "40.0"), ("triton", 512, "0.006", "44.7", "66.7"),
        ("cublas", 512, "0.004", "67.1", "100.0"), ("triton", 4096, "0.19", "723.4", "94.7"),
    ]
]


def write_fixture(path):
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=cli.CSV_FIELDS)
        writer.writeheader()
        writer.writerows(ROWS)


def test_replot_from_csv(tmp_path):
    source = tmp_path / "h100.csv"
    write_fixture(source)
    paths = plot.plot(plot.read_rows(source), "h100", out_dir=tmp_path)
    names = ["perf_h100", "sizes_h100", "classes_h100"]
    assert [p.name for p in paths] == [f"{name}.{ext}" for name in names for ext in ("svg", "png")]
    assert all(p.stat().st_size > 1000 for p in paths)


def test_results_table_from_csv(tmp_path):
    source = tmp_path / "h100.csv"
    write_fixture(source)
    table = plot.results_table(plot.read_rows(source), ["v1"])
    assert "| 4096x4096x4096 | 458.1 | 60.0 | 763.5 | 2.1e-04 | `block_m=128` |" in table
    assert "NVIDIA H100 80GB HBM3" in table and "measured 2026-11-22" in table


def test_tables_are_rewritten_between_markers(tmp_path):
    write_fixture(tmp_path / "h100.csv")
    doc = tmp_path / "page.md"
    doc.write_text("before\n<!-- results h100 v1 -->\nstale\n<!-- /results -->\nafter\n")
    assert plot.update_documents(csv_dir=tmp_path, documents=[doc]) == [doc]
    text = doc.read_text()
    assert "stale" not in text and "| 8192x8192x8192 | 549.8 | 72.0 |" in text and text.endswith("after\n")


def test_peer_column_and_only_class_shapes_in_tables(tmp_path):
    source = tmp_path / "h100.csv"
    write_fixture(source)
    table = plot.results_table(plot.read_rows(source), ["v1", "triton"])
    assert "| class | size | v1 | Triton (torch.compile) | cuBLAS |" in table
    assert "| square | 4096x4096x4096 | 458.1 (60.0%) | 723.4 (94.7%) | 763.5 TFLOPS |" in table
    assert "512x512x512" not in table  # the square sweep is plotted, not tabled
