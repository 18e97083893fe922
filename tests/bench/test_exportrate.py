"""bench.exportrate, briefly: it fills, exports and ingests 3000 messages, the counts check
and every figure is there. Only counts are asserted; timings are measured, never asserted."""

from __future__ import annotations

import pytest

from tests.commands import run_module_json

pytestmark = pytest.mark.slow

N = 3000


def test_exportrate_measures_export_and_ingest_and_counts_match() -> None:
    code, summary, err = run_module_json("bench.exportrate", "--messages", str(N), "--json")
    assert code == 0, f"{summary}\n{err}"
    assert summary["ok"] and summary["problems"] == []
    assert summary["messages"] == N
    fill, scan = summary["fill"], summary["raw_scan"]
    assert sum(fill["outcomes"].values()) == N
    assert set(fill["outcomes"]) == {"acked", "expired", "pending"}
    assert fill["segments"] >= 2  # the queue store and the topic store
    assert scan["rows"] == N
    for name in ("export", "export_no_body"):
        e = summary[name]
        assert e["rows"] == N
        assert e["source_bytes"] == summary["source_bytes"] > N * 200
        assert e["files"] >= 2
        for key in ("seconds", "rows_per_s", "source_mb_per_s", "parquet_mb_per_s", "x_raw_scan"):
            assert isinstance(e[key], int | float) and e[key] > 0, (name, key, e[key])
        assert e["parquet_bytes"] > 0
    assert summary["export_no_body"]["parquet_bytes"] < summary["export"]["parquet_bytes"]
    memory = summary["export_memory"]
    assert memory["code"] == 0 and 0 < memory["peak_anonymous_mib"] < 128
    ingest = summary["ingest"]
    assert ingest["baseline_rows"] == ingest["baseline_grouped_rows"] == N
    assert (ingest["ingest_rows_read"], ingest["ingest_rows_appended"]) == (N, N)
    assert ingest["ingest_rows_in_table"] == N
    assert (ingest["reingest_rows_appended"], ingest["reingest_rows_in_table"]) == (0, N)
    assert (ingest["reread_rows_read"], ingest["reread_rows_appended"]) == (N, 0)
    for key in (
        "spark_start_s",
        "baseline_cold_s",
        "baseline_s",
        "ingest_s",
        "scan_s",
        "ingest_x_baseline",
        "ingest_x_scan",
        "reingest_s",
        "reingest_x_baseline",
        "reingest_x_scan",
        "reread_s",
        "reread_x_scan",
        "table_bytes",
    ):
        assert isinstance(ingest[key], int | float) and ingest[key] > 0, (key, ingest[key])
