"""The report's numbers checked by an independent engine, and its files by their schema.

A run is made with `hoptrace roundtrip` (publisher, hops and the real collector over
loopback TCP), reported with `hoptrace report`, and then:
- every stage's count, min, max, mean and standard deviation must equal what DuckDB
  computes over the same Parquet; every percentile must be within its stated precision
  of DuckDB's exact `quantile_disc`;
- summary.json must validate against analysis/schema/summary.schema.json;
- `hoptrace sql` must give the same figures as CSV, JSON and Parquet;
- `hoptrace compare --require` must exit non-zero exactly when its requirement does not hold.

Needs HOPTRACE_BIN (infra/test.sh sets it to the build of cargo test).
"""

import csv
import io
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import duckdb
import jsonschema
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("HOPTRACE_BIN")

pytestmark = pytest.mark.skipif(
    not BIN and os.environ.get("HOPTRACE_INTEGRATION") != "1",
    reason="HOPTRACE_BIN not set (run infra/test.sh)",
)


def hoptrace(*args, check=True):
    assert BIN, "HOPTRACE_BIN must point at the hoptrace binary"
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, check=check, timeout=300)


def make_run(out: Path, skew_ns=0) -> Path:
    hoptrace("roundtrip", "--messages", "30k", "--rate", "30k", "--streams", "50",
             "--last-hop-skew-ns", skew_ns, "--runs", out)
    (run,) = [p for p in out.iterdir() if (p / "run.json").exists()]
    return run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="module")
def report(run, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    hoptrace("report", run, "--out", out)
    return out


@pytest.fixture(scope="module")
def skewed(tmp_path_factory):
    """A run whose last hop's clock is 50 µs behind: part of its last stage is negative."""
    run = make_run(tmp_path_factory.mktemp("skewed"), skew_ns=-50_000)
    out = tmp_path_factory.mktemp("skewed-report")
    hoptrace("report", run, "--out", out)
    return run, out


def stage_deltas_sql(run: Path, stage) -> str:
    files = str(run / "traces" / "*.parquet")
    return (
        f"SELECT epoch_ns(\"{stage['to']}_ns\") - epoch_ns(\"{stage['from']}_ns\") AS d "
        f"FROM read_parquet('{files}') "
        f"WHERE \"{stage['to']}_ns\" IS NOT NULL AND \"{stage['from']}_ns\" IS NOT NULL"
    )


def check_stages_against_duckdb(run, stages):
    """Every stage's figures over all its deltas, negative ones included, against DuckDB."""
    con = duckdb.connect()
    assert stages, "the run has stages"
    for st in stages:
        deltas = stage_deltas_sql(run, st)
        qs = [p["quantile"] for p in st["percentiles"]]
        n, neg, mn, mx, mean, sd, disc = con.execute(
            f"SELECT count(*), count(*) FILTER (WHERE d < 0), min(d), max(d), avg(d), "
            f"stddev_pop(d), quantile_disc(d, {qs}) FROM ({deltas})"
        ).fetchone()
        name = st["name"]
        assert (st["count"], st["negative"], st["min_ns"], st["max_ns"]) == (n, neg, mn, mx), name
        assert st["mean_ns"] == pytest.approx(mean, rel=1e-9, abs=1e-6), name
        assert st["stddev_ns"] == pytest.approx(sd, rel=1e-6), name
        for p, exact in zip(st["percentiles"], disc):
            assert abs(p["value_ns"] - exact) <= p["precision_ns"], (
                f"{name} {p['label']}: hoptrace {p['value_ns']} ± {p['precision_ns']}, DuckDB {exact}"
            )
            assert p["precision_ns"] <= 0.0005 * abs(exact) + 1, (name, p)


def test_every_stage_matches_duckdb(run, report):
    summary = json.loads((report / "summary.json").read_text())
    check_stages_against_duckdb(run, summary["stages"])


def test_negative_deltas_count_in_every_figure_and_agree_with_duckdb(skewed):
    """A skewed clock makes part of a stage negative: count, min, mean, std dev and every
    percentile run over all known deltas, in summary.json, run.json and SQL alike."""
    run, out = skewed
    summary = json.loads((out / "summary.json").read_text())
    neg = [st for st in summary["stages"] if st["negative"] > 0]
    assert neg, [(st["name"], st["negative"]) for st in summary["stages"]]
    assert all(st["min_ns"] < 0 for st in neg), neg
    check_stages_against_duckdb(run, summary["stages"])
    check_stages_against_duckdb(run, json.loads((run / "run.json").read_text())["stages"])
    st = neg[0]
    col = st["column"]
    q = (f"SELECT count({col}) AS n, hdr_count(hdr_histogram({col})) AS h, "
         f"hdr_percentile({col}, 0.5) AS p50 FROM traces")
    line = json.loads(hoptrace("sql", run, q, "--format", "json").stdout.splitlines()[0])
    assert line["n"] == line["h"] == st["count"], line
    p50 = next(p for p in st["percentiles"] if p["label"] == "P50")
    assert line["p50"] == p50["value_ns"]
    # A percentile inside the negative part, through SQL, against DuckDB's exact one.
    q_neg = st["negative"] / st["count"] / 2
    sql = (f"SELECT hdr_percentile({col}, {q_neg}) AS p, "
           f"hdr_precision({col}, {q_neg}) AS e FROM traces")
    got = json.loads(hoptrace("sql", run, sql, "--format", "json").stdout.splitlines()[0])
    exact = duckdb.connect().execute(
        f"SELECT quantile_disc(d, {q_neg}) FROM ({stage_deltas_sql(run, st)})").fetchone()[0]
    assert exact < 0 and got["p"] < 0, (got, exact)
    assert abs(got["p"] - exact) <= got["e"], (got, exact)
    # The interval logs hold both signs: the negative ones in their own file.
    hlogs = sorted(p.name for p in (run / "hdr").glob("*.hlog"))
    assert any(n.endswith(".negative.hlog") for n in hlogs), hlogs


def test_batches_are_counted_per_metric_and_agree_with_duckdb(tmp_path):
    """Messages carrying 10 metrics each: summary.json's per-metric figures (every trace
    weighted by its metric_count) against DuckDB over each row repeated metric_count
    times, `hdr_percentile(ns, q, metric_count)` in SQL giving the same, and the report
    counting metrics and saying so. A run of one metric per message says it counts
    messages."""
    out = tmp_path / "runs"
    hoptrace("roundtrip", "--messages", "20k", "--rate", "40k", "--streams", "20",
             "--metrics-per-message", "10", "--runs", out)
    (run,) = [p for p in out.iterdir() if (p / "run.json").exists()]
    rep = tmp_path / "report"
    hoptrace("report", run, "--out", rep)
    summary = json.loads((rep / "summary.json").read_text())
    assert summary["totals"]["metrics"] == 10 * summary["totals"]["messages"], summary["totals"]
    con = duckdb.connect()
    for st in summary["stages"]:
        pm = st["per_metric"]
        deltas = stage_deltas_sql(run, st).replace(" AS d ", " AS d, metric_count AS w ")
        qs = [p["quantile"] for p in pm["percentiles"]]
        n, disc = con.execute(
            f"SELECT count(*), quantile_disc(d, {qs}) FROM ({deltas}), range(w)").fetchone()
        name = st["name"]
        assert pm["count"] == n == 10 * st["count"], (name, pm["count"], n)
        for p, exact in zip(pm["percentiles"], disc):
            assert abs(p["value_ns"] - exact) <= p["precision_ns"], (name, p, exact)
        # Mean and population std dev over the repeated rows, as DuckDB computes them.
        mean, sd = con.execute(
            f"SELECT avg(d), stddev_pop(d) FROM ({deltas}), range(w)").fetchone()
        assert abs(pm["mean_ns"] - mean) <= 1e-9 * abs(mean) + 1e-6, (name, pm["mean_ns"], mean)
        assert abs(pm["stddev_ns"] - sd) <= 1e-6 * sd + 1e-6, (name, pm["stddev_ns"], sd)
        col = st["column"]
        q = (f"SELECT hdr_percentile({col}, 0.99, metric_count) AS p99, "
             f"hdr_count(hdr_histogram({col}, metric_count)) AS n FROM traces")
        line = json.loads(hoptrace("sql", run, q, "--format", "json").stdout.splitlines()[0])
        p99 = next(p for p in pm["percentiles"] if p["label"] == "P99")
        assert line == {"p99": p99["value_ns"], "n": pm["count"]}, (name, line)
    md = (rep / "report.md").read_text()
    assert "Counted per metric" in md and "per metric (every trace weighted" in md
    head = next(st for st in summary["stages"] if st["headline"])
    assert f"| Count | {head['per_metric']['count']:,} | metrics ({head['count']:,} messages) |" in md
    assert "| Mean |" in md and "exact, per metric |" in md


def test_single_metric_messages_are_counted_per_message(report):
    md = (report / "report.md").read_text()
    assert "Counted per message: each message carried one metric" in md
    assert "Counted per metric" not in md


def test_counts_add_up_against_the_parquet(run, report):
    summary = json.loads((report / "summary.json").read_text())
    table = pq.read_table(str(run / "traces"))
    statuses = table.column("status").to_pylist()
    acc = summary["accounting"]
    assert acc["complete"] == statuses.count("complete")
    assert acc["incomplete"] == statuses.count("incomplete")
    assert acc["sent"] == acc["complete"] + acc["incomplete"] + acc["unseen"]
    assert acc["adds_up"] is True
    assert summary["data"]["rows"] == table.num_rows == 30_000
    assert sum(b["messages"] for b in summary["throughput"]["buckets"]) == table.num_rows


def test_summary_json_validates_against_its_schema(report):
    schema = json.loads((ROOT / "analysis" / "schema" / "summary.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(json.loads((report / "summary.json").read_text()), schema)
    broken = json.loads((report / "summary.json").read_text())
    broken["stages"][0]["percentiles"][0]["precision_ns"] = -1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


def test_report_files(report):
    md = (report / "report.md").read_text()
    for needle in ["Performance Highlights", "Test Environment", "Latency Stage Definitions",
                   "| Stat | Value | Precision |", "| P99.99 |", "Clock uncertainty", "Accounting",
                   "Latency Heatmaps"]:
        assert needle in md, needle
    images = re.findall(r"\]\((charts/[^)]+\.svg)\)", md)
    assert len(images) >= 4, images
    for img in images:
        svg = (report / img).read_text()
        assert svg.startswith("<svg") and "</svg>" in svg, img
    html = (report / "report.html").read_text()
    # Self-contained: nothing is loaded from elsewhere.
    markup = re.sub(r"<script>.*?</script>", "", html, flags=re.S)
    assert not re.search(r"<(script|link|img|iframe)\b[^>]*\b(src|href)=", markup)
    assert html.count("<div class=\"chart\"") >= 4
    for spec in (report / "charts").glob("*.vl.json"):
        assert json.loads(spec.read_text())["$schema"].endswith("vega-lite/v6.json")


def test_sql_formats_agree(run, report):
    summary = json.loads((report / "summary.json").read_text())
    total = next(s for s in summary["stages"] if s["headline"])
    col = total["column"]
    q = f"SELECT count({col}) AS n, hdr_percentile({col}, 0.99) AS p99 FROM traces"
    rows = list(csv.DictReader(io.StringIO(hoptrace("sql", run, q, "--format", "csv").stdout)))
    p99 = next(p for p in total["percentiles"] if p["label"] == "P99")
    assert int(rows[0]["n"]) == total["count"]
    assert int(rows[0]["p99"]) == p99["value_ns"]
    line = json.loads(hoptrace("sql", run, q, "--format", "json").stdout.splitlines()[0])
    assert line == {"n": total["count"], "p99": p99["value_ns"]}
    out = run.parent / "q.parquet"
    hoptrace("sql", run, q, "--format", "parquet", "--out", out)
    t = pq.read_table(out)
    assert t.column("p99").to_pylist() == [p99["value_ns"]]
    table = hoptrace("sql", run, "SELECT run_id, complete FROM runs").stdout
    assert "1 row(s)" in table
    bad = hoptrace("sql", run, "SELECT nope FROM traces", check=False)
    assert bad.returncode != 0 and "nope" in bad.stderr


def test_compare_gate_exits_non_zero_when_it_holds(run, tmp_path):
    slower = make_run(tmp_path, skew_ns=100_000_000)
    stage = "total (publish -> store_in)"
    same = hoptrace("compare", run, run, "--require", f"{stage}.p99 <= +10%", check=False)
    assert same.returncode == 0, same.stderr
    assert "pass" in same.stdout
    worse = hoptrace("compare", run, slower, "--require", f"{stage}.p50 <= +10%", check=False)
    assert worse.returncode == 1, worse.stdout + worse.stderr
    assert "FAIL" in worse.stdout and "gate(s) failed" in worse.stderr
    bad = hoptrace("compare", run, run, "--require", "nonsense", check=False)
    assert bad.returncode != 0 and "bad gate" in bad.stderr


def chromium():
    path = shutil.which("chromium")
    if not path:
        if os.environ.get("HOPTRACE_INTEGRATION") == "1":
            pytest.fail("chromium is not installed (infra/setup.sh --browser installs it)")
        pytest.skip("chromium not installed")
    return path


class Node:
    """An element of a page as Chromium serialized it (--dump-dom)."""

    def __init__(self, tag, attrs, parent=None):
        self.tag, self.attrs, self.parent = tag, dict(attrs), parent
        self.children, self.text = [], ""

    def classes(self):
        return (self.attrs.get("class") or "").split()

    def walk(self):
        yield self
        for c in self.children:
            yield from c.walk()

    def find_all(self, pred):
        return [n for n in self.walk() if pred(n)]

    def all_text(self):
        return self.text + "".join(c.all_text() for c in self.children)


VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}


def parse_dom(markup):
    from html.parser import HTMLParser

    class Builder(HTMLParser):
        def __init__(self):
            super().__init__(convert_charrefs=True)
            self.root = Node("#root", {})
            self.cur = self.root

        def handle_starttag(self, tag, attrs):
            node = Node(tag, attrs, self.cur)
            self.cur.children.append(node)
            if tag not in VOID:
                self.cur = node

        def handle_startendtag(self, tag, attrs):
            self.cur.children.append(Node(tag, attrs, self.cur))

        def handle_endtag(self, tag):
            n = self.cur
            while n is not None and n.tag != tag:
                n = n.parent
            if n is not None and n.parent is not None:
                self.cur = n.parent

        def handle_data(self, data):
            self.cur.text += data

    b = Builder()
    b.feed(markup)
    return b.root


def has_class(*names):
    return lambda n: all(c in n.classes() for c in names)


def drawn_marks(node):
    """The mark items drawn under `node`: paths with a shape, or sized rects."""
    items = []
    for group in node.find_all(has_class("role-mark")):
        for item in group.children:
            if item.tag == "path" and item.attrs.get("d", "").strip():
                items.append(item)
            elif item.tag == "rect" and float(item.attrs.get("width") or 0) > 0:
                items.append(item)
    return items


def axis_labels(node):
    return [t.all_text().strip() for g in node.find_all(has_class("role-axis-label"))
            for t in g.find_all(lambda n: n.tag == "text")]


def chromium_base(user_dir, height):
    isolate = ["unshare", "--net"] if shutil.which("unshare") and os.geteuid() == 0 else []
    return [*isolate, chromium(), "--headless", "--no-sandbox", "--disable-gpu",
            "--no-first-run", "--disable-extensions", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--proxy-server=127.0.0.1:9",
            "--enable-logging=stderr", "--v=0", "--virtual-time-budget=20000",
            f"--window-size=1100,{height}", f"--user-data-dir={user_dir}"]


def artifacts_dir(default: Path) -> Path:
    out = Path(os.environ.get("HOPTRACE_ARTIFACTS", default))
    out.mkdir(parents=True, exist_ok=True)
    return out


def test_report_html_renders_offline_in_chromium(report):
    """report.html in headless Chromium with no network at all (a fresh network namespace),
    checked for what a reader sees: every chart drawn as SVG, with marks for every stage
    (a panel per stage in the histograms, a line per stage in the spectrum, every
    heatmap filled), tick labels on the axes, a table of contents whose links all land on
    a heading, and no error logged. Screenshots are kept ($HOPTRACE_ARTIFACTS)."""
    page = (report / "report.html").resolve().as_uri()
    summary = json.loads((report / "summary.json").read_text())
    stages = [st["name"] for st in summary["stages"] if st["count"] > 0]
    assert len(stages) >= 2, stages
    base = chromium_base(report / ".chromium", 14000)
    dom = subprocess.run([*base, "--dump-dom", page], capture_output=True, text=True, timeout=180)
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [l for l in dom.stderr.splitlines() if "CONSOLE" in l]
    errors = [l for l in console if ":ERROR:" in l or "Uncaught" in l]
    assert not errors, errors
    root = parse_dom(dom.stdout)
    body = next(n for n in root.walk() if n.tag == "body")
    assert body.attrs.get("data-charts") == "done", dom.stdout[-2000:]

    charts = root.find_all(lambda n: n.tag == "div" and "chart" in n.classes() and n.attrs.get("id", "").startswith("chart-"))
    assert len(charts) >= 3 + len(stages), [c.attrs for c in charts]
    by_stem = {}
    for c in charts:
        stem = c.attrs["data-stem"]
        assert c.attrs.get("data-rendered") == "true" and "chart-error" not in c.classes(), (stem, c.attrs)
        svgs = c.find_all(lambda n: n.tag == "svg")
        assert svgs, f"{stem}: no SVG"
        assert drawn_marks(svgs[0]), f"{stem}: nothing drawn"
        labels = [l for l in axis_labels(svgs[0]) if l]
        assert len(labels) >= 4, f"{stem}: axis tick labels {labels}"
        by_stem[stem] = svgs[0]

    # Histograms: one panel per stage, headed by its name, each with its own bars and
    # its own axes (tick labels on both).
    hist = by_stem["latency-histograms"]
    (facets,) = hist.find_all(has_class("role-scope", "cell"))
    panels = [g for g in facets.children if g.tag == "g"]
    titles = [" ".join(t.all_text().strip() for g in p.find_all(has_class("role-title-text"))
                       for t in g.find_all(lambda n: n.tag == "text")) for p in panels]
    assert titles == stages, titles
    for name, panel in zip(stages, panels):
        assert len(drawn_marks(panel)) >= 3, f"histogram panel of {name} has hardly any bars"
        labels = [l for l in axis_labels(panel) if l]
        assert any(l.endswith("%") for l in labels), (name, labels)
        assert sum(l[0].isdigit() and not l.endswith("%") for l in labels) >= 2, (name, labels)

    # Percentile spectrum: a line per stage, a legend naming each, percentile ticks.
    cdf = by_stem["latency-cdf"]
    lines = [m for g in cdf.find_all(has_class("mark-line")) for m in g.children
             if m.tag == "path" and m.attrs.get("d", "").strip()]
    assert len(lines) == len(stages), len(lines)
    legend = " ".join(t.all_text() for g in cdf.find_all(has_class("role-legend-label"))
                      for t in g.find_all(lambda n: n.tag == "text"))
    assert all(name in legend for name in stages), legend
    ticks = axis_labels(cdf)
    assert {"50%", "90%", "99%"} <= set(ticks), ticks

    # Heatmaps: one per stage, each filled.
    heatmaps = [s for s in by_stem if s.startswith("heatmap-")]
    assert len(heatmaps) == len(stages), heatmaps
    for s in heatmaps:
        assert len(drawn_marks(by_stem[s])) >= 3, s

    # Table of contents: links to every section heading, each landing on one.
    nav = next(n for n in root.walk() if n.tag == "nav" and n.attrs.get("id") == "toc")
    links = [a.attrs["href"] for a in nav.find_all(lambda n: n.tag == "a")]
    ids = {n.attrs["id"] for n in root.walk() if "id" in n.attrs}
    headings = [n for n in root.walk() if n.tag in ("h2", "h3")]
    assert links and all(l.startswith("#") and l[1:] in ids for l in links), (links, sorted(ids))
    assert {l[1:] for l in links} == {h.attrs.get("id") for h in headings}, links
    md = (report / "report.md").read_text()
    for l in links:
        assert f"]({l})" in md, f"report.md has no contents link {l}"

    artifacts = artifacts_dir(report)
    shots = [("report-html.png", page, 14000), ("report-html-top.png", page, 1400)]
    for name, url, height in shots:
        shot = artifacts / name
        taken = subprocess.run([*chromium_base(report / f".chromium-{height}", height),
                                f"--screenshot={shot}", url],
                               capture_output=True, text=True, timeout=180)
        assert taken.returncode == 0 and shot.exists() and shot.stat().st_size > 10_000, taken.stderr[-2000:]
