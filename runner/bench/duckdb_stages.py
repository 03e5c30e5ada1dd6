"""Exact stage statistics of a hoptrace run with DuckDB, for `hoptrace bench report`.

Usage: python3 duckdb_stages.py RUN_DIR SUMMARY_JSON OUT_JSON

For every stage of SUMMARY_JSON (hoptrace's summary.json of the same run) it computes,
from the run's Parquet alone, the stage delta (to-hop stamp minus from-hop stamp, in ns)
and over every known delta, negative ones included (as `docs/dataset.md` defines the
statistics): count, min, max, mean, population standard deviation and `quantile_disc` at
the summary's quantiles, plus the count of negative deltas. One
query per stage, so DuckDB holds one stage's values at a time. Writes the figures and
the seconds the queries took (DuckDB's own time, without Python's start) to OUT_JSON.
"""

import json
import os
import sys
import time
from pathlib import Path

import duckdb


def main() -> None:
    run_dir, summary_path, out_path = (Path(a) for a in sys.argv[1:4])
    summary = json.loads(summary_path.read_text())
    files = str(run_dir / "traces" / "*.parquet")
    con = duckdb.connect()
    con.execute(f"SET threads = {os.cpu_count() or 1}")
    started = time.perf_counter()
    stages = []
    for st in summary["stages"]:
        qs = [p["quantile"] for p in st["percentiles"]]
        d = f'epoch_ns("{st["to"]}_ns") - epoch_ns("{st["from"]}_ns")'
        n, neg, mn, mx, mean, sd, disc = con.execute(
            f"SELECT count(d), count(d) FILTER (WHERE d < 0), "
            f"min(d), max(d), avg(d), stddev_pop(d), quantile_disc(d, {qs}) "
            f"FROM (SELECT {d} AS d FROM read_parquet('{files}'))"
        ).fetchone()
        stages.append(
            {
                "name": st["name"],
                "count": n,
                "negative": neg,
                "min_ns": mn,
                "max_ns": mx,
                "mean_ns": mean,
                "stddev_ns": sd,
                "quantiles": qs,
                "values_ns": list(disc or []),
            }
        )
        print(f"duckdb: {st['name']} done at {time.perf_counter() - started:.1f}s", file=sys.stderr)
    out = {
        "duckdb_version": duckdb.__version__,
        "threads": os.cpu_count(),
        "query_s": time.perf_counter() - started,
        "stages": stages,
    }
    out_path.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
