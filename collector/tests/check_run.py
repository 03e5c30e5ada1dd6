"""Independent check of a collector run directory with pyarrow.

usage: check_run.py RUN_DIR TRACES

Reads every traces/part-*.parquet with pyarrow (not with the crate that wrote it) and
checks the schema, one row per message, every stamp against the rule the Rust test used
to produce it, and run.json's accounting.
"""

import glob
import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq

HOPS = ["publish", "flow_in", "flow_out", "store_in", "query_start", "queryable"]


def hops_of(seq):
    if seq % 25 == 0:
        return [0]
    if seq % 10 == 0:
        return [0, 1, 2, 4, 5]
    return list(range(6))


BASE_NS = 0


def stamp_ns(seq, i):
    return BASE_NS + seq * 1_000 + i * 1_000 + (500 if i == 1 else 0)


def main(run_dir, traces):
    files = sorted(glob.glob(os.path.join(run_dir, "traces", "part-*.parquet")))
    assert files, "no parquet files"
    assert not glob.glob(os.path.join(run_dir, "traces", "*.inprogress")), "a file was left open"
    table = pa.concat_tables(pq.read_table(f) for f in files)
    for h in HOPS:
        field = table.schema.field(f"{h}_ns")
        assert field.type == pa.timestamp("ns"), field
        assert field.nullable
    assert table.schema.field("sequence").type == pa.uint64()
    meta = pq.ParquetFile(files[0]).metadata
    assert meta.row_group(0).column(0).compression == "ZSTD"
    assert table.num_rows == traces, (table.num_rows, traces)
    # Timestamps as raw int64 nanoseconds (Python datetimes stop at microseconds).
    rows = {
        name: (col.cast(pa.int64()) if pa.types.is_timestamp(col.type) else col).to_pylist()
        for name, col in zip(table.column_names, table.columns)
    }
    seen = set()
    for r in range(table.num_rows):
        seq = rows["sequence"][r]
        assert seq not in seen, f"duplicate row for {seq}"
        seen.add(seq)
        assert rows["run_id"][r] == "test-run"
        assert rows["publisher"][r] == 3 and rows["metric_count"][r] == 10
        present = hops_of(seq)
        for i, h in enumerate(HOPS):
            v = rows[f"{h}_ns"][r]
            if i in present:
                assert v == stamp_ns(seq, i), (seq, h, v)
            else:
                assert v is None, (seq, h, v)
        complete = len(present) == 6
        assert rows["status"][r] == ("complete" if complete else "incomplete"), (seq, rows["status"][r])
        mask = 0 if complete else sum(1 << i for i in range(6) if i not in present)
        assert rows["missing_mask"][r] == mask, (seq, rows["missing_mask"][r], mask)
    clock = pq.read_table(os.path.join(run_dir, "clock.parquet"))
    assert clock.num_rows >= 1
    assert clock.schema.field("error_bound_ns").type == pa.uint64()
    probes = pq.read_table(os.path.join(run_dir, "probes.parquet"))
    probes = {n: probes.column(n).to_pylist() for n in ("sent", "queue_full")}
    assert max(probes["sent"]) == traces * 6 - sum(6 - len(hops_of(s)) for s in range(traces)), probes["sent"]
    assert max(probes["queue_full"]) == 0
    run = json.load(open(os.path.join(run_dir, "run.json")))
    acc = run["accounting"]
    assert acc["adds_up"] is True
    pub = acc["publishers"][0]
    assert pub["sent"] == pub["complete"] + pub["incomplete"] + pub["unseen"]
    assert pub["complete"] + pub["incomplete"] == table.num_rows
    print(f"ok: {table.num_rows} rows in {len(files)} file(s) read by pyarrow {pa.__version__}")


if __name__ == "__main__":
    BASE_NS = int(sys.argv[3])
    main(sys.argv[1], int(sys.argv[2]))
