"""Helpers of the tests that run the real `hoptrace` binary ($HOPTRACE_BIN): they are
skipped unless HOPTRACE_INTEGRATION=1, and then a missing binary or service is a failure.

A collector is started on 127.0.0.1:0 in a process group of its own; its address is read
from the line `collecting on ADDR ...` it prints on stderr; it is stopped with SIGTERM
(it then flushes every file and writes run.json)."""

import csv
import io
import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import List, Optional

import pytest

INTEGRATION = os.environ.get("HOPTRACE_INTEGRATION") == "1"

PIPELINE = """\
name = "python-probe"

[[hops]]
name = "publish"
id = 0
description = "Publisher egress."

[[hops]]
name = "flow_in"
id = 1
description = "Processor ingress."

[[hops]]
name = "flow_out"
id = 2
description = "Processor egress."
{extra_hops}
[[stages]]
name = "Broker Time"
from = "publish"
to = "flow_in"
definition = "From publish to arrival in the processor."

[[stages]]
name = "Flow Internal"
from = "flow_in"
to = "flow_out"
definition = "Inside the processor."
{extra_stages}
[join]
window_ms = 60000
"""

SINK_HOP = """
[[hops]]
name = "sink"
id = 3
description = "Last consumer."
"""

SINK_STAGE = """
[[stages]]
name = "Onward"
from = "flow_out"
to = "sink"
definition = "From the processor's egress to the last consumer."
"""


def require_integration(what: str = "the hoptrace binary") -> None:
    """Skips the calling test unless HOPTRACE_INTEGRATION=1."""
    if not INTEGRATION:
        pytest.skip(f"needs {what}: set HOPTRACE_INTEGRATION=1 (and HOPTRACE_BIN)")


def hoptrace_bin() -> str:
    """$HOPTRACE_BIN; a failure when integration tests are enabled and it is unusable."""
    require_integration()
    path = os.environ.get("HOPTRACE_BIN")
    if not path:
        pytest.fail("HOPTRACE_BIN is not set (the path of the hoptrace binary)")
    if not os.access(path, os.X_OK):
        pytest.fail(f"HOPTRACE_BIN={path} is not an executable file")
    return path


def write_pipeline(path: Path, sink: bool = False) -> Path:
    path.write_text(PIPELINE.format(extra_hops=SINK_HOP if sink else "",
                                    extra_stages=SINK_STAGE if sink else ""))
    return path


def start(cmd: List[str], log: Path, **kw) -> subprocess.Popen:
    """A process in its own process group, stdout piped, stderr to `log`."""
    return subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE,
                            stderr=open(log, "w"), text=True, start_new_session=True, **kw)


def stop(p: subprocess.Popen, timeout: float = 60) -> str:
    """SIGTERM to the process group; its stdout after it exits (SIGKILL if it hangs)."""
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        pytest.fail(f"{p.args[:2]} did not stop on SIGTERM within {timeout} s")
    return out


def wait_for_line(log: Path, pattern: str, p: subprocess.Popen, timeout: float = 30) -> re.Match:
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = re.search(pattern, log.read_text())
        if m:
            return m
        if p.poll() is not None:
            break
        time.sleep(0.05)
    pytest.fail(f"{p.args[:2]}: no line matching {pattern!r}: {log.read_text()[-3000:]}")


class Collector:
    """A real `hoptrace collect` on 127.0.0.1 (port 0 unless one is given)."""

    def __init__(self, tmp: Path, run_id: str, pipeline: Path, port: int = 0,
                 extra: Optional[list] = None) -> None:
        self.bin = hoptrace_bin()
        self.out = tmp / "runs"
        self.run_dir = self.out / run_id
        self.pipeline = pipeline
        self.command = [self.bin, "collect", "--listen", f"127.0.0.1:{port}",
                        "--pipeline", pipeline, "--out", self.out, "--run-id", run_id,
                        *(extra or [])]
        self.starts = 0
        self.stdout: Optional[str] = None
        self._start()

    def _start(self) -> None:
        self.starts += 1
        self.log = self.out.parent / f"collector-{self.run_dir.name}-{self.starts}.log"
        self.proc = start(self.command, self.log)
        m = wait_for_line(self.log, r"collecting on (\S+)", self.proc)
        self.address = m.group(1)

    def kill(self) -> None:
        """SIGKILL: the collector dies without flushing or writing anything."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def restart(self) -> None:
        """Starts the same command again (same --listen, same --run-id): it replays its
        log and continues the run."""
        assert self.proc.poll() is not None, "the collector still runs"
        self._start()

    def stop(self) -> dict:
        """Stops the collector; returns run.json."""
        self.stdout = stop(self.proc)
        assert self.proc.returncode == 0, (self.stdout, self.log.read_text()[-3000:])
        return json.loads((self.run_dir / "run.json").read_text())

    def sql(self, query: str) -> List[dict]:
        """`hoptrace sql RUN QUERY --format csv`, as rows of strings."""
        out = subprocess.run([self.bin, "sql", str(self.run_dir), query, "--format", "csv"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return list(csv.DictReader(io.StringIO(out.stdout)))


def read_traces(run_dir: Path) -> dict:
    """Every row of traces/part-*.parquet (pyarrow), timestamps as int64 ns, by trace key."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted((run_dir / "traces").glob("part-*.parquet"))
    assert files, f"no parquet files under {run_dir}"
    table = pa.concat_tables(pq.read_table(f) for f in files)
    cols = {name: (col.cast(pa.int64()) if pa.types.is_timestamp(col.type) else col).to_pylist()
            for name, col in zip(table.column_names, table.columns)}
    rows = {}
    for i in range(table.num_rows):
        row = {k: v[i] for k, v in cols.items()}
        key = (row["publisher"], row["stream"], row["sequence"])
        assert key not in rows, f"two rows for trace {key}"
        rows[key] = row
    return rows


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port
