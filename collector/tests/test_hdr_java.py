"""The collector's HdrHistogram interval logs, read by the Java HdrHistogram.

Runs `hoptrace roundtrip` (HOPTRACE_BIN), then reads every stage's `.hlog` with
HdrHistogram's own `HistogramLogReader` (fetched from Maven Central) and checks the
merged count against run.json and the percentiles within the stated precision.
"""

import glob
import json
import os
import pathlib
import subprocess

import pytest

HERE = pathlib.Path(__file__).resolve().parent
JAVA_DIR = HERE / "hdr-java"


def hoptrace_bin():
    path = os.environ.get("HOPTRACE_BIN")
    if not path:
        if os.environ.get("HOPTRACE_INTEGRATION") == "1":
            pytest.fail("HOPTRACE_BIN is not set (infra/test.sh sets it)")
        pytest.skip("HOPTRACE_BIN not set")
    return path


@pytest.fixture(scope="module")
def java_classpath(tmp_path_factory):
    lib = tmp_path_factory.mktemp("hdr-java-lib")
    subprocess.run(
        ["mvn", "-q", "-f", str(JAVA_DIR / "pom.xml"), "dependency:copy-dependencies",
         f"-DoutputDirectory={lib}"],
        check=True, capture_output=True, text=True,
    )
    classes = tmp_path_factory.mktemp("hdr-java-classes")
    cp = f"{lib}/*"
    subprocess.run(["javac", "-cp", cp, "-d", str(classes), str(JAVA_DIR / "HlogCheck.java")],
                   check=True, capture_output=True, text=True)
    return f"{cp}:{classes}"


def test_interval_logs_read_by_java_hdrhistogram(tmp_path, java_classpath):
    subprocess.run(
        [hoptrace_bin(), "roundtrip", "--messages", "30000", "--rate", "15000", "--runs", str(tmp_path)],
        check=True, capture_output=True, text=True,
    )
    (run_dir,) = glob.glob(str(tmp_path / "roundtrip-*"))
    run = json.load(open(os.path.join(run_dir, "run.json")))
    assert run["stages"], "no stages"
    for stage in run["stages"]:
        out = subprocess.run(
            ["java", "-cp", java_classpath, "HlogCheck", os.path.join(run_dir, stage["hdr_log"])],
            check=True, capture_output=True, text=True,
        ).stdout
        fields = dict(kv.split("=") for kv in out.split())
        assert int(fields["intervals"]) >= 1
        assert int(fields["count"]) == stage["count"], (stage["name"], out)
        p50 = next(p for p in stage["percentiles"] if p["quantile"] == 0.5)
        # Java reports the highest equivalent value; hoptrace the bucket middle +- half width.
        assert abs(int(fields["p50"]) - p50["value_ns"]) <= 2 * p50["precision_ns"] + 1, (stage["name"], out, p50)
        assert int(fields["max"]) >= stage["max_ns"]
