"""The live view of a real run, in headless Chromium.

A real run: `hoptrace collect --ui` on free loopback ports, `hoptrace tap` subscribed to
Mosquitto as the `broker` hop, and `hoptrace publish` through Mosquitto, each a process
of its own. Chromium (driven over the DevTools protocol on a pipe, no outside package)
loads the page the collector serves and, once it has updated at least twice:
- every figure of the stage table, of the throughput and of the accounting equals what
  /live.json said for the interval the page shows, which must be the latest or the one
  before (the page is at most one update behind);
- the stage of the run has measured values, over the last interval and the whole run;
- the probe host's clock row is there;
- the page made no request to anything but the collector's loopback address, and logged
  no error;
- a screenshot is kept ($HOPTRACE_ARTIFACTS).

Needs HOPTRACE_BIN (infra/test.sh sets it), Mosquitto (infra/services.sh) and Chromium
(infra/setup.sh --browser).
"""

import base64
import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from procs import start, stop

BIN = os.environ.get("HOPTRACE_BIN")
MQTT = os.environ.get("HOPTRACE_MQTT", "127.0.0.1:11883")
INTEGRATION = os.environ.get("HOPTRACE_INTEGRATION") == "1"

pytestmark = pytest.mark.skipif(
    not BIN and not INTEGRATION, reason="HOPTRACE_BIN not set (run infra/test.sh)"
)

RATE = 400  # metrics per second, one per message

SPEC = """
name = "live-view-test"

[[hops]]
name = "publish"
id = 0

[[hops]]
name = "broker"
id = 1

[[stages]]
name = "Broker Time"
from = "publish"
to = "broker"
definition = "From the publisher's egress, through Mosquitto, to a subscriber."
headline = true
"""


def chromium():
    path = shutil.which("chromium")
    if not path:
        if INTEGRATION:
            pytest.fail("chromium is not installed (infra/setup.sh --browser installs it)")
        pytest.skip("chromium not installed")
    return path


def mqtt_up():
    host, port = MQTT.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
        return True
    except OSError:
        return False


class DevTools:
    """Chromium's DevTools protocol over --remote-debugging-pipe: the browser reads
    commands on its fd 3 and writes answers and events on its fd 4, each a JSON text
    ended by a NUL byte. Here fd 3 and 4 are the child's stdin and stdout, moved."""

    def __init__(self, user_dir: Path, log: Path):
        args = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--disable-extensions", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-default-apps",
                # The page is the only one and never shown: its timers must not be
                # throttled as a background tab's are.
                "--disable-background-timer-throttling", "--disable-renderer-backgrounding",
                "--disable-backgrounding-occluded-windows",
                "--remote-debugging-pipe", "--window-size=1200,1400",
                f"--user-data-dir={user_dir}", "about:blank"]
        self.p = subprocess.Popen(
            ["sh", "-c", 'exec "$0" "$@" 3<&0 4>&1 0</dev/null 1>&2', *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(log, "w"),
            start_new_session=True)
        self.next_id = 0
        self.buf = b""
        self.events = []

    def _read(self):
        while b"\0" not in self.buf:
            chunk = os.read(self.p.stdout.fileno(), 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method, params=None, session=None):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self.p.stdin.write(json.dumps(msg).encode() + b"\0")
        self.p.stdin.flush()
        while True:
            m = self._read()
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def evaluate(self, session, expr):
        r = self.call("Runtime.evaluate", {"expression": expr, "returnByValue": True,
                                            "awaitPromise": True}, session)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def close(self):
        try:
            self.call("Browser.close")
        except Exception:  # noqa: BLE001 - the browser may be gone already
            pass
        stop(self.p, timeout=10)


def get_json(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


# What the page shows of a /live.json, read from the DOM: the same shape both ways.
READ_DOM = """(() => {
  const rows = [...document.querySelectorAll('#stages tbody tr')].map(tr => ({
    stage: Number(tr.dataset.stage), window: tr.dataset.window,
    name: tr.children[0].textContent,
    values: Object.fromEntries([...tr.querySelectorAll('td[data-field]')].map(td =>
      [td.dataset.field, td.dataset.value === '' ? null : Number(td.dataset.value)])),
    text: Object.fromEntries([...tr.querySelectorAll('td[data-field]')].map(td =>
      [td.dataset.field, td.textContent])),
  }));
  const thr = Object.fromEntries([...document.querySelectorAll('#throughput td[data-field]')]
    .map(td => [td.dataset.field, td.dataset.value === '' ? null : Number(td.dataset.value)]));
  const acc = Object.fromEntries([...document.querySelectorAll('#accounting tr[data-key]')]
    .map(tr => [tr.dataset.key, Number(tr.querySelector('td[data-value]').dataset.value)]));
  const hosts = [...document.querySelectorAll('#clocks tr[data-host]')].map(tr =>
    [...tr.children].map(td => td.textContent));
  const events = [...document.querySelectorAll('#events tr[data-kind]')].map(tr => tr.dataset.kind);
  return {intervals: Number(document.body.dataset.intervals),
          updates: Number(document.body.dataset.updates),
          state: document.getElementById('state').textContent,
          rows, thr, acc, hosts, events};
})()"""

FIELDS = ["count", "negative", "min_ns", "p50_ns", "p90_ns", "p99_ns", "p999_ns", "max_ns"]


def expected_dom(live):
    """What the page must show of `live`."""
    rows = []
    for i, st in enumerate(live["stages"]):
        for w in ("interval", "run"):
            rows.append((i, w, {f: st[w][f] for f in FIELDS}))
    acc = dict(live["accounting"])
    missing = acc.pop("missing_by_hop")
    acc = {k: v for k, v in acc.items()}
    acc["connections"] = live["connections"]
    for hop, n in missing.items():
        acc["missing:" + hop] = n
    return rows, acc


@pytest.fixture
def run(tmp_path):
    if not mqtt_up():
        if INTEGRATION:
            pytest.fail(f"Mosquitto is not up at {MQTT} (infra/services.sh)")
        pytest.skip(f"Mosquitto is not up at {MQTT}")
    spec = tmp_path / "pipeline.toml"
    spec.write_text(SPEC)
    runs = tmp_path / "runs"
    log = tmp_path / "collector.log"
    collector = start([BIN, "collect", "--listen", "127.0.0.1:0", "--ui", "127.0.0.1:0",
                       "--target-rate", RATE, "--pipeline", spec, "--runs", runs,
                       "--run-id", "live-view", "--no-log"], log)
    procs = [collector]
    try:
        deadline = time.time() + 30
        while True:
            text = log.read_text()
            at = re.search(r"collecting on (\S+)", text)
            ui = re.search(r"live view on (http://\S+/)", text)
            if at and ui:
                break
            assert collector.poll() is None and time.time() < deadline, text
            time.sleep(0.1)
        addr, url = at.group(1), ui.group(1)
        root = f"hoptrace-live-{os.getpid()}"
        tap = start([BIN, "tap", "--from", f"mqtt://{MQTT}", "--topics", f"{root}/#",
                     "--hop", "broker", "--collector", addr, "--pipeline", spec],
                    tmp_path / "tap.log")
        procs.append(tap)
        time.sleep(1.0)  # the tap subscribes before anything is published
        publisher = start([BIN, "publish", "--to", f"mqtt://{MQTT}", "--topic-root", root,
                           "--rate", RATE, "--streams", 4, "--duration", "60s",
                           "--collector", addr, "--pipeline", spec],
                          tmp_path / "publish.log")
        procs.append(publisher)
        yield {"url": url, "dir": tmp_path, "procs": procs, "log": log}
    finally:
        for p in reversed(procs):
            stop(p)


def artifacts_dir(default: Path) -> Path:
    out = Path(os.environ.get("HOPTRACE_ARTIFACTS", default))
    out.mkdir(parents=True, exist_ok=True)
    return out


def test_the_live_view_shows_the_collectors_figures_in_chromium(run):
    url = run["url"]
    live_url = url + "live.json"
    # Wait until the run has measured something over a whole interval.
    deadline = time.time() + 60
    while True:
        live = get_json(live_url)
        st = live["stages"][0]
        if st["interval"]["count"] > 0 and st["run"]["count"] > 0 and live["clocks"]:
            break
        assert time.time() < deadline, json.dumps(live, indent=1)[-3000:]
        time.sleep(0.3)

    browser = DevTools(run["dir"] / ".chromium", run["dir"] / "chromium.log")
    try:
        target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.call("Target.attachToTarget",
                               {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Network", "Page", "Runtime", "Log"):
            browser.call(f"{domain}.enable", session=session)
        browser.call("Page.navigate", {"url": url}, session)

        # Every /live.json seen, by interval: the figures of an interval never change.
        seen = {}

        def fetch():
            live = get_json(live_url)
            seen[live["intervals"]] = live
            return live

        # At least two updates after the first.
        deadline = time.time() + 30
        updates = "document.body ? Number(document.body.dataset.updates) : 0"
        while browser.evaluate(session, updates) < 3:
            assert time.time() < deadline, browser.evaluate(session, "document.documentElement.outerHTML")
            fetch()
            time.sleep(0.2)

        # The DOM against /live.json of the interval it shows, which must be the latest or
        # the one before (the page polls once a second, as the intervals end).
        for _attempt in range(20):
            fetch()
            dom = browser.evaluate(session, READ_DOM)
            latest = fetch()["intervals"]
            if dom["intervals"] in seen and latest - dom["intervals"] <= 1:
                break
            time.sleep(0.25)
        assert dom["intervals"] in seen, (dom["intervals"], sorted(seen))
        assert latest - dom["intervals"] <= 1, ("more than one update behind", dom["intervals"], latest)
        live = seen[dom["intervals"]]
        assert dom["state"] == "running"

        rows, acc = expected_dom(live)
        got = [(r["stage"], r["window"], r["values"]) for r in dom["rows"]]
        assert got == rows, (got, rows)
        assert dom["rows"][0]["name"] == "Broker Time"
        # Measured values, shown with a unit.
        for r in dom["rows"][:2]:
            assert r["values"]["count"] > 0 and r["values"]["p99_ns"] is not None, r
            assert re.fullmatch(r"-?[\d.]+ (ns|µs|ms|s)", r["text"]["p50_ns"]), r["text"]
        assert dom["acc"] == acc, (dom["acc"], acc)
        t = live["throughput"]
        assert dom["thr"]["messages"] == t["messages"]
        assert dom["thr"]["messages_per_s"] == pytest.approx(t["messages_per_s"])
        assert dom["thr"]["metrics_per_s"] == pytest.approx(t["metrics_per_s"])
        assert dom["thr"]["target_metrics_per_s"] == RATE == t["target_metrics_per_s"]
        assert dom["thr"]["length_s"] == pytest.approx(live["interval"]["length_s"])
        # The probe hosts' clocks: a row per host /live.json names, unknown only when it is.
        assert [h[0] for h in dom["hosts"]] == [c["host"] for c in live["clocks"]]
        for h, c in zip(dom["hosts"], live["clocks"]):
            assert (h[2] == "unknown") == (c["source"] is None), (h, c)
        # The run's events, newest first.
        assert dom["events"] == [e["kind"] for e in reversed(live["events"])], dom["events"]
        # The sparkline drew both lines.
        paths = browser.evaluate(session, "[...document.querySelectorAll('#spark path')]"
                                          ".map(p => p.getAttribute('d'))")
        assert len(paths) == 2 and all(p.startswith("M") for p in paths), paths

        shot = browser.call("Page.captureScreenshot", {"format": "png",
                                                       "captureBeyondViewport": True}, session)
        png = base64.b64decode(shot["data"])
        out = artifacts_dir(run["dir"]) / "live-view.png"
        out.write_bytes(png)
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000

        # Every request the page made went to the collector's loopback address.
        host = re.match(r"http://([^/]+)/", url).group(1)
        requested = [e["params"]["request"]["url"] for e in browser.events
                     if e.get("method") == "Network.requestWillBeSent"]
        assert requested and requested[0] == url, requested
        assert any(u.startswith(url + "live.json") for u in requested), requested
        for u in requested:
            m = re.match(r"(\w+)://([^/]+)/", u)
            assert m and m.group(1) == "http" and m.group(2) == host, u
        errors = [e for e in browser.events
                  if e.get("method") == "Runtime.exceptionThrown"
                  or (e.get("method") == "Log.entryAdded"
                      and e["params"]["entry"]["level"] == "error")
                  or (e.get("method") == "Runtime.consoleAPICalled"
                      and e["params"]["type"] == "error")]
        assert not errors, errors
    finally:
        browser.close()
