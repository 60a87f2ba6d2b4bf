"""The HTML viewer in a real headless Chromium, driven over the DevTools protocol.

Chromium speaks the protocol over a pipe (`--remote-debugging-pipe`: commands on fd 3, replies on
fd 4, each a JSON message ended by NUL), so the tests need nothing beyond the standard library:
they load pages, dispatch real mouse events (clicks, drags, the wheel) and read the DOM back.
"""

import fcntl
import json
import math
import os
import re
import select
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import REF_DIR
from graphgen.dump import load_dump
from graphgen.view import graph as V
from graphgen.view.diffmap import STATUS_COLOURS
from graphgen.view.dot import op_colour
from graphgen.view.html import to_html

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium binary (chromium, chromium-browser or "
                                                          "google-chrome) on PATH")
WIDTH, HEIGHT = 1400, 900


class Browser:
    """One headless Chromium with one page, over the DevTools pipe."""

    def __init__(self, profile: Path):
        to_r, self._to_w = os.pipe()
        self._from_r, from_w = os.pipe()

        def child_fds():
            # move both ends clear of 3 and 4 first: either may itself be 3 or 4
            r, w = fcntl.fcntl(to_r, fcntl.F_DUPFD, 10), fcntl.fcntl(from_w, fcntl.F_DUPFD, 10)
            os.dup2(r, 3)
            os.dup2(w, 4)
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--disable-background-networking", "--no-first-run", "--remote-debugging-pipe",
             f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}", "about:blank"],
            preexec_fn=child_fds, close_fds=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_r)
        os.close(from_w)
        self._buf, self._id = b"", 0
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False}, page=True)

    def send(self, method: str, params: dict | None = None, page: bool = False, timeout: float = 120):
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if page:
            msg["sessionId"] = self.session
        os.write(self._to_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self._from_r], [], [], left)[0]:
                    raise TimeoutError(f"Chromium did not answer {method} within {timeout} s")
                chunk = os.read(self._from_r, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"Chromium closed the pipe during {method}")
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def js(self, expr: str):
        r = self.send("Runtime.evaluate", {"expression": expr, "returnByValue": True, "awaitPromise": True}, page=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def load(self, url: str, timeout: float = 120) -> float:
        """Navigate and wait for the viewer's script to finish; returns the seconds it took."""
        t0 = time.monotonic()
        self.send("Page.navigate", {"url": url}, page=True)
        while time.monotonic() - t0 < timeout:
            try:
                ready = f"location.href === {json.dumps(url)} && document.body && document.body.dataset.ready"
                if self.js(ready) == "1":
                    return time.monotonic() - t0
            except RuntimeError:
                pass  # the old document went away mid-evaluation
            time.sleep(0.05)
        raise TimeoutError(f"{url}: the viewer was not ready after {timeout} s")

    def mouse(self, kind: str, x: float, y: float, **extra):
        self.send("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, **extra}, page=True)

    def click(self, x: float, y: float):
        self.mouse("mouseMoved", x, y)
        self.mouse("mousePressed", x, y, button="left", buttons=1, clickCount=1)
        self.mouse("mouseReleased", x, y, button="left", buttons=0, clickCount=1)

    def centre_of(self, selector: str) -> tuple[float, float]:
        r = self.js(f"(function(){{var e=document.querySelector({json.dumps(selector)});if(!e)return null;"
                    "var b=e.getBoundingClientRect();return [b.left+b.width/2,b.top+b.height/2];})()")
        assert r is not None, f"nothing matches {selector}"
        return r[0], r[1]

    def errors(self) -> list[str]:
        return self.js("window.__errors")

    def close(self):
        try:
            os.close(self._to_w)
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._from_r)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    b = Browser(tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()


def _page(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return p.as_uri()


def _drawn(browser) -> list[list]:
    """[row, fill] of every drawn node."""
    return browser.js("Array.from(document.querySelectorAll('#nodes .gnode')).map(function(g){"
                      "return [+g.getAttribute('data-row'), g.querySelector('rect.body').getAttribute('fill')];})")


def _numbers(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"-?(?:\d+\.?\d*(?:e[-+]?\d+)?|nan|inf)", text)]


@pytest.mark.parametrize("case, graph", [("dflash-fa-off", "01-block"), ("dflash-iswa-fa-on", "01-block"),
                                         ("dsv4-fa-on", "01-block"), ("dspark-fa-off", "00-inject")])
def test_opened_graph_draws_every_node(browser, tmp_path, case, graph):
    d = load_dump(REF_DIR / case / f"{graph}.json")
    url = _page(tmp_path, "v.html", to_html(d))
    browser.load(url + "#open=all")
    assert browser.errors() == []
    drawn = _drawn(browser)
    assert sorted(r for r, _ in drawn) == list(range(len(d.nodes)))
    assert all(fill == op_colour(d.nodes[r].op) for r, fill in drawn)
    # one open box per layer (outputs after the layers get their own), nothing left collapsed
    layers = V.node_layers(d.nodes)
    assert browser.js("document.querySelectorAll('.glayer.collapsed').length") == 0
    opened = browser.js("Array.from(document.querySelectorAll('.glayer.open')).map(function(g){"
                        "return g.getAttribute('data-layer');})")
    assert {re.sub(r"^global \d+$", "global", x) for x in opened} == {V.layer_label(il) for il in layers}
    assert len(opened) <= len(set(layers)) + 1  # the inputs and the output head, outside any layer
    # the layout follows the data flow: every producer in the same layer sits above its consumer
    ys = {r: y for r, y in browser.js("Array.from(document.querySelectorAll('#nodes .gnode')).map(function(g){"
                                      "return [+g.getAttribute('data-row'), g.getBoundingClientRect().top];})")}
    sources = V.resolve_sources(d.nodes)
    for k, srcs in enumerate(sources):
        for _, _, p in srcs:
            if p is not None and layers[p] == layers[k] and (layers[k] is not None or p < k):
                assert ys[p] < ys[k], (d.nodes[p].name, d.nodes[k].name)


def test_click_opens_a_layer_and_shows_node_values(browser, tmp_path):
    d = load_dump(REF_DIR / "dflash-fa-off" / "01-block.json")
    url = _page(tmp_path, "v.html", to_html(d))
    browser.load(url)
    assert browser.js("document.querySelectorAll('#nodes .gnode').length") == 0  # all collapsed
    layers = V.node_layers(d.nodes)
    browser.click(*browser.centre_of('.glayer[data-layer="layer 1"] rect.frame'))
    assert browser.js("document.querySelector('.glayer[data-layer=\"layer 1\"]').classList.contains('open')")
    rows = [r for r, _ in _drawn(browser)]
    assert rows and all(layers[r] == 1 for r in rows)
    # a real click on a drawn node with stored values shows them
    k = next(r for r in rows if d.values(r) is not None and d.nodes[r].op == "RMS_NORM")
    browser.js(f"window.__viewer.select({k}, true)")  # centre it, then click where it is drawn
    browser.js("document.getElementById('details').innerHTML = ''")
    browser.click(*browser.centre_of(f'#nodes .gnode[data-row="{k}"]'))
    assert browser.js("document.querySelector('#details h3').getAttribute('data-row')") == str(k)
    assert browser.js("document.querySelector('#details h3').textContent") == d.nodes[k].name
    vals = d.values(k).astype(np.float64).ravel()
    shown = _numbers(browser.js("document.querySelector('#details .values').textContent"))
    assert np.allclose(shown, vals[:8], rtol=1e-5, atol=1e-6)
    text = browser.js("document.getElementById('details').textContent")
    mmm = re.search(r"min / max / mean(.*?)NaN", text).group(1)
    assert np.allclose(_numbers(mmm), [vals.min(), vals.max(), vals.mean()], rtol=1e-5, atol=1e-6)
    assert "0 / 0 of " + str(vals.size) in text
    assert browser.js("document.querySelector('#details .params').textContent") == "eps=1e-06"
    assert browser.js(f"document.querySelector('#nodes .gnode[data-row=\"{k}\"]').classList.contains('selected')")


def test_node_fragment_selects_and_pan_zoom_move_the_view(browser, tmp_path):
    d = load_dump(REF_DIR / "dsv4-fa-on" / "01-block.json")
    k = next(n.index for n in d.nodes if n.op == "SWIGLU_CLAMP")
    url = _page(tmp_path, "v.html", to_html(d))
    browser.load(url + f"#node={k}")
    assert browser.js("document.querySelector('#details h3').getAttribute('data-row')") == str(k)
    assert "limit=2" in browser.js("document.querySelector('#details .params').textContent")
    x, y = browser.centre_of(f'#nodes .gnode[data-row="{k}"]')
    assert 0 < x < WIDTH and 0 < y < HEIGHT  # selected nodes are brought into view
    v0 = browser.js("window.__viewer.view()")
    browser.mouse("mouseWheel", 300, 400, deltaX=0, deltaY=400)
    v1 = browser.js("window.__viewer.view()")
    assert v1["s"] < v0["s"] * 0.7  # wheel down zooms out
    # drag the background: the view follows the mouse
    browser.mouse("mouseMoved", 40, 600)
    browser.mouse("mousePressed", 40, 600, button="left", buttons=1, clickCount=1)
    for step in range(1, 6):
        browser.mouse("mouseMoved", 40 + 30 * step, 600 + 20 * step, button="left", buttons=1)
    browser.mouse("mouseReleased", 190, 700, button="left", buttons=0, clickCount=1)
    v2 = browser.js("window.__viewer.view()")
    assert math.isclose(v2["tx"] - v1["tx"], 150, abs_tol=1) and math.isclose(v2["ty"] - v1["ty"], 100, abs_tol=1)
    # a drag is not a click: the selection stays
    assert browser.js("document.querySelector('#details h3').getAttribute('data-row')") == str(k)


def test_diff_page_colours_status_and_plots_nmse(browser, tmp_path):
    from test_view import _seeded
    ref, ours = _seeded(tmp_path)
    url = _page(tmp_path, "diff.html", to_html(ref, ours))
    browser.load(url + "#open=all")
    assert browser.errors() == []
    data = json.loads(browser.js("document.getElementById('data').textContent"))
    f = {k: i for i, k in enumerate(data["fields"])}
    drawn = _drawn(browser)
    assert len(drawn) == len(data["rows"]) == len(ref.nodes) + 1
    assert all(fill == STATUS_COLOURS[data["rows"][r][f["status"]]] for r, fill in drawn)
    first = browser.js("Array.from(document.querySelectorAll('.gnode.first-divergence')).map(function(g){"
                       "return +g.getAttribute('data-row');})")
    assert [data["rows"][r][f["ref"]] for r in first] == [20]
    # the NMSE plot: one point per compared node here, the perturbed one above the threshold
    pts = browser.js("Array.from(document.querySelectorAll('#plot .pt')).map(function(c){"
                     "return [+c.getAttribute('data-row'), +c.getAttribute('cy')];})")
    compared = [k for k, r in enumerate(data["rows"]) if r[f["nmse"]] is not None]
    assert sorted(r for r, _ in pts) == compared
    y = dict(pts)
    row20 = first[0]
    thr_y = float(browser.js("document.querySelector('#plot .threshold').getAttribute('y1')"))
    assert y[row20] < thr_y and all(y[k] > thr_y for k in compared if data["rows"][k][f["status"]] == "matched")
    # clicking a point selects its node
    k = next(k for k in compared if k != row20)
    browser.click(*browser.centre_of(f'#plot .pt[data-row="{k}"]'))
    assert browser.js("document.querySelector('#details h3').getAttribute('data-row')") == str(k)
    text = browser.js("document.getElementById('details').textContent")
    assert "first values (ref)" in text and "first values (ours)" in text


def _big_dump(n=100_000, per_layer=100):
    from test_view import _big_dump as big
    return big(n, per_layer)


def test_100k_nodes_load_and_open_a_layer(browser, tmp_path):
    d = _big_dump()
    url = _page(tmp_path, "big.html", to_html(d))
    seconds = browser.load(url)
    assert seconds < 20, f"the 100,000-node page took {seconds:.1f} s to load"
    assert browser.errors() == []
    # every layer drawn as its collapsed box, no node drawn
    assert browser.js("document.querySelectorAll('.glayer.collapsed').length") == 1000
    assert browser.js("document.querySelectorAll('#nodes .gnode').length") == 0
    t0 = time.monotonic()
    browser.click(*browser.centre_of('.glayer[data-layer="layer 2"] rect.frame'))
    assert time.monotonic() - t0 < 5
    rows = [r for r, _ in _drawn(browser)]
    assert rows and all(200 <= r < 300 for r in rows)
    assert browser.js("document.querySelectorAll('.glayer.open').length") == 1
    # a new fragment on the open page searches: the hit's layer opens too, and the view moves there
    browser.load(url + "#search=x5-999")
    for _ in range(100):
        if browser.js("(document.querySelector('#details h3') || {}).textContent") == "x5-999":
            break
        time.sleep(0.05)
    assert browser.js("document.querySelector('#details h3').textContent") == "x5-999"
    assert sorted(browser.js("Array.from(document.querySelectorAll('.glayer.open')).map(function(g){"
                             "return g.getAttribute('data-layer');})")) == ["layer 2", "layer 999"]
    rows = [r for r, _ in _drawn(browser)]
    assert rows and all(99_900 <= r < 100_000 for r in rows)
    # a fresh load with the fragment opens only that layer
    browser.send("Page.navigate", {"url": "about:blank"}, page=True)
    while browser.js("location.href") != "about:blank":
        time.sleep(0.05)
    browser.load(url + "#search=x5-999")
    assert browser.js("document.querySelector('#details h3').textContent") == "x5-999"
    assert browser.js("document.querySelectorAll('.glayer.open').length") == 1


def _free_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_model_explorer_web_app_loads_the_export(browser, tmp_path):
    """Model Explorer's own server and web app open the exported graph and its NMSE overlay."""
    pytest.importorskip("model_explorer", reason="the explorer extra (ai-edge-model-explorer) is not installed")
    import sys

    from graphgen.diff import diff_dumps
    from graphgen.view.explorer import export
    from test_view import _seeded
    ref, ours = _seeded(tmp_path)
    paths = export(tmp_path / "me", ref, ours)
    graph = json.loads(paths[0].read_text())["graphs"][0]
    nmse_file = next(p for p in paths if p.name.endswith(".nmse.json"))
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "model_explorer", str(paths[0]), f"--node_data_paths={nmse_file}",
                               "--no_open_in_browser", f"--port={port}"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url, log = None, []
        deadline = time.monotonic() + 120
        while url is None and time.monotonic() < deadline:
            line = server.stdout.readline()
            if not line:
                break
            log.append(line)
            if line.startswith(f"http://localhost:{port}/?data="):
                url = line.strip()
        assert url, "Model Explorer did not start:\n" + "".join(log)
        browser.send("Page.navigate", {"url": url}, page=True)
        text = ""
        for _ in range(600):
            text = browser.js("document.body ? document.body.innerText : ''") or ""
            if re.search(r"Max\s+\S+", text) and re.search(r"op node count\s+\d+", text):
                break
            time.sleep(0.1)
        # the graph as Model Explorer counted it: every node and leaf, layers as its layers
        assert int(re.search(r"op node count\s+(\d+)", text).group(1)) == len(graph["nodes"])
        namespaces = {n["namespace"] for n in graph["nodes"]} - {""}
        assert int(re.search(r"layer count\s+(\d+)", text).group(1)) == len(namespaces)
        assert re.search(rf"{re.escape(ref.graph)}\s+{len(graph['nodes'])} nodes", text)
        # and the overlay applied to it: its largest NMSE is the perturbed node's
        res = diff_dumps(ref, ours)
        worst = max(r.nmse for r in res.numeric if math.isfinite(r.nmse))
        assert math.isclose(float(re.search(r"Max\s+(\S+)", text).group(1)), worst, rel_tol=1e-9)
        assert worst == next(r.nmse for r in res.numeric if r.ref_index == 20)
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
