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
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import REF_DIR
from graphgen.dump.format import load_dump
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

    # `timeout`: stops waiting on a Chromium that will never answer; generous for a loaded machine
    def send(self, method: str, params: dict | None = None, page: bool = False, timeout: float = 3600):
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

    def load(self, url: str, timeout: float = 3600) -> float:
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
    from .test_view import _seeded
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
    from .test_view import _big_dump as big
    return big(n, per_layer)


def test_100k_nodes_load_and_open_a_layer(browser, tmp_path):
    d = _big_dump()
    url = _page(tmp_path, "big.html", to_html(d))
    # what keeps a page of this size usable is what it draws, not how fast this machine is: every
    # layer as its collapsed box and no node, then one layer's 100 nodes when it opens
    browser.load(url)
    assert browser.errors() == []
    assert browser.js("document.querySelectorAll('.glayer.collapsed').length") == 1000
    assert browser.js("document.querySelectorAll('#nodes .gnode').length") == 0
    browser.click(*browser.centre_of('.glayer[data-layer="layer 2"] rect.frame'))
    assert browser.js("document.querySelectorAll('#nodes .gnode').length") <= 100
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

    from graphgen.compare.diff import diff_dumps
    from graphgen.view.explorer import export
    from .test_view import _seeded
    ref, ours = _seeded(tmp_path)
    paths = export(tmp_path / "me", ref, ours)
    graph = json.loads(paths[0].read_text())["graphs"][0]
    nmse_file = next(p for p in paths if p.name.endswith(".nmse.json"))
    port = _free_port()
    # unbuffered: its address line must reach the pipe at once, whatever the environment says
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    server = subprocess.Popen([sys.executable, "-m", "model_explorer", str(paths[0]), f"--node_data_paths={nmse_file}",
                               "--no_open_in_browser", f"--port={port}"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    # a server that never prints its address is ended, so the blocking read below ends too
    watchdog = threading.Timer(120, server.kill)
    watchdog.start()
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
        watchdog.cancel()
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


# ---- zoom, labels, legend, what changed, backends, largest error, the two first jumps ----------

STATUS_WORDS = {"matched": "identical", "changed": "changed", "value": "value failure", "deleted": "deleted",
                "inserted": "inserted", "explained": "explained", "uncompared": "not compared"}
OP_PARAMS_AT, OP_AT, VALUE_AT, UNCOMPARED_AT = 12, 40, 27, 36  # nodes of the DFlash block, planted below
WORST_FLAT, WORST_DELTA = 1234, 0.75


def _f32_bits(x: float) -> int:
    import struct
    return struct.unpack("<i", struct.pack("<f", x))[0]


def _planted(tmp_path: Path):
    """ref = the plain DFlash block; ours = the same with, in graph order: node 12's RMS_NORM eps
    1e-6 -> 1e-5, node 27's values off by 1e-3 everywhere and by 0.75 at one element, node 36's
    values and digest dropped (not comparable), node 40's op ADD -> SUB."""
    import dataclasses

    from graphgen.dump.format import write_dump
    ref = load_dump(REF_DIR / "dflash-fa-off" / "01-block.json")
    vals = {i: ref.values(i) for i in range(len(ref.nodes)) if ref.values(i) is not None}
    nodes = [dataclasses.replace(n) for n in ref.nodes]
    assert nodes[OP_PARAMS_AT].op == "RMS_NORM" and nodes[OP_PARAMS_AT].op_params[0] == _f32_bits(1e-6)
    params = list(nodes[OP_PARAMS_AT].op_params)
    params[0] = _f32_bits(1e-5)
    nodes[OP_PARAMS_AT] = dataclasses.replace(nodes[OP_PARAMS_AT], op_params=params)
    v = vals[VALUE_AT].copy().ravel()
    v += np.float32(1e-3)
    v[WORST_FLAT] += np.float32(WORST_DELTA)
    vals[VALUE_AT] = v.reshape(vals[VALUE_AT].shape)
    del vals[UNCOMPARED_AT]
    nodes[UNCOMPARED_AT] = dataclasses.replace(nodes[UNCOMPARED_AT], digest=None)
    nodes[OP_AT] = dataclasses.replace(nodes[OP_AT], op="SUB")
    header = {"source": ref.source, "model": ref.model, "settings": ref.settings, "cpu_features": ref.cpu_features}
    return ref, load_dump(write_dump(tmp_path / "ours", 1, "block", header, nodes, vals))


def _row_of_ref(browser, i: int) -> int:
    data = json.loads(browser.js("document.getElementById('data').textContent"))
    f = {k: n for n, k in enumerate(data["fields"])}
    return next(k for k, r in enumerate(data["rows"]) if r[f["ref"]] == i)


def _canvas(browser) -> dict:
    return browser.js("(function(){var b=document.getElementById('canvas').getBoundingClientRect();"
                      "return {left:b.left,top:b.top,right:b.right,bottom:b.bottom,width:b.width,height:b.height};})()")


def _rect(browser, selector: str) -> dict:
    r = browser.js(f"(function(){{var e=document.querySelector({json.dumps(selector)});if(!e)return null;"
                   "var b=e.getBoundingClientRect();return {left:b.left,top:b.top,right:b.right,bottom:b.bottom,"
                   "width:b.width,height:b.height};})()")
    assert r is not None, f"nothing matches {selector}"
    return r


def _wait(browser, expr: str, want, tries: int = 100):
    for _ in range(tries):
        if browser.js(expr) == want:
            return
        time.sleep(0.05)
    assert browser.js(expr) == want, expr


def test_opening_a_layer_fits_it_and_a_search_centres_its_node(browser, tmp_path):
    d = load_dump(REF_DIR / "dflash-fa-off" / "01-block.json")
    url = _page(tmp_path, "zoom.html", to_html(d))
    browser.load(url)
    for _ in range(3):  # zoom far out first, as after looking at the whole graph
        browser.mouse("mouseWheel", 300, 300, deltaX=0, deltaY=1000)
    assert browser.js("window.__viewer.view()")["s"] < 0.03
    browser.click(*browser.centre_of('.glayer[data-layer="layer 1"] rect.frame'))
    assert browser.js("document.querySelector('.glayer[data-layer=\"layer 1\"]').classList.contains('open')")
    # the opened layer is wholly in view and fills it along one side
    c, frame = _canvas(browser), _rect(browser, '.glayer[data-layer="layer 1"] rect.frame')
    assert frame["left"] >= c["left"] - 1 and frame["right"] <= c["right"] + 1
    assert frame["top"] >= c["top"] - 1 and frame["bottom"] <= c["bottom"] + 1
    assert max(frame["width"] / c["width"], frame["height"] / c["height"]) > 0.9
    layers = V.node_layers(d.nodes)
    drawn = [r for r, _ in _drawn(browser)]
    assert sorted(drawn) == [k for k, il in enumerate(layers) if il == 1]  # every node of it drawn
    # a search for a node of another layer, typed: the view moves to it, centred and readable
    names = [n.name for n in d.nodes]
    k = next(k for k, n in enumerate(names)
             if layers[k] == 0 and n and sum(n.lower() in m.lower() for m in names) == 1)
    browser.js("window.__viewer.fit()")
    browser.click(*browser.centre_of("#search"))
    browser.send("Input.insertText", {"text": names[k]}, page=True)
    for kind in ("keyDown", "keyUp"):
        browser.send("Input.dispatchKeyEvent", {"type": kind, "key": "Enter", "code": "Enter",
                                                "windowsVirtualKeyCode": 13}, page=True)
    _wait(browser, "(document.querySelector('#details h3') || {}).textContent", names[k])
    node = _rect(browser, f'#nodes .gnode[data-row="{k}"] rect.body')
    c = _canvas(browser)
    assert abs((node["left"] + node["right"]) / 2 - (c["left"] + c["right"]) / 2) < 2
    assert abs((node["top"] + node["bottom"]) / 2 - (c["top"] + c["bottom"]) / 2) < 2
    assert node["width"] >= 0.95 * 190  # 1:1 or closer: the node's name and op are legible
    text = browser.js(f"document.querySelector('#nodes .gnode[data-row=\"{k}\"]').textContent")
    assert names[k] in text and d.nodes[k].op in text


def _labels(browser) -> list[dict]:
    return browser.js("Array.from(document.querySelectorAll('#nodes .gnode')).map(function(g){"
                      "var b=g.querySelector('rect.body').getBoundingClientRect(), ts=g.querySelectorAll('text');"
                      "return {row:+g.getAttribute('data-row'), n:ts.length, text:ts.length?ts[0].textContent:'',"
                      "box:[b.left,b.top,b.right,b.bottom], t:Array.from(ts).map(function(t){"
                      "var r=t.getBoundingClientRect();return [r.left,r.top,r.right,r.bottom];})};})")


@pytest.mark.parametrize("case, layer", [("dflash-fa-off", None), ("dflash-iswa-fa-on", None), ("dsv4-fa-on", 0)])
def test_labels_fit_their_boxes_at_fit_zoom(browser, tmp_path, case, layer):
    """The whole block fitted to the view (the DeepSeek-V4 block, 260 nodes, one layer opened and
    fitted: the whole of it would leave boxes 2.6 px tall, with no room for a glyph)."""
    d = load_dump(REF_DIR / case / "01-block.json")
    url = _page(tmp_path, f"labels-{case}.html", to_html(d))
    browser.load(url + ("#open=all" if layer is None else ""))
    if layer is not None:
        browser.click(*browser.centre_of(f'.glayer[data-layer="layer {layer}"] rect.frame'))
    s = browser.js("window.__viewer.view()")["s"]
    assert s < 0.3  # the graph does not fit at a readable zoom: this is the zoomed-out case
    labels = _labels(browser)
    layers = V.node_layers(d.nodes)
    assert sorted(lb["row"] for lb in labels) == [k for k in range(len(d.nodes)) if layer is None or layers[k] == layer]
    shown = {"name": 0, "op": 0}
    for lb in labels:
        n = d.nodes[lb["row"]]
        assert lb["n"] == 1 and lb["text"] in (n.name, n.op) and lb["text"], (n.name, lb)
        shown["name" if lb["text"] == n.name and n.name != n.op else "op"] += 1
        (l0, t0, r0, b0), (l1, t1, r1, b1) = lb["box"], lb["t"][0]
        assert l1 >= l0 - 0.5 and r1 <= r0 + 0.5 and t1 >= t0 - 0.5 and b1 <= b0 + 0.5, (n.name, lb)
        assert b1 - t1 > 0  # drawn, not collapsed to nothing
    if case == "dflash-fa-off":  # 0.21: room for the short names, the ops elsewhere, all legible
        assert shown["name"] and shown["op"], shown
        assert min(lb["t"][0][3] - lb["t"][0][1] for lb in labels) >= 5
    # zoomed in, a node shows both lines: index and name, then op, type and shape
    k = next(k for k, n in enumerate(d.nodes) if n.name and n.op == "MUL_MAT")
    browser.js(f"window.__viewer.select({k}, true)")
    texts = browser.js(f"Array.from(document.querySelectorAll('#nodes .gnode[data-row=\"{k}\"] text'))"
                       ".map(function(t){return t.textContent;})")
    assert texts == [f"#{k} {d.nodes[k].name}"[:24 + len(str(k)) + 2].rstrip() if len(d.nodes[k].name) <= 24
                     else f"#{k} {d.nodes[k].name[:23]}\u2026",
                     f"MUL_MAT {d.nodes[k].type} [{', '.join(map(str, d.nodes[k].ne))}]"]


def _hex_rgb(h: str) -> str:
    return f"rgb({int(h[1:3], 16)}, {int(h[3:5], 16)}, {int(h[5:7], 16)})"


def test_legend_names_the_colours_the_nodes_are_drawn_with(browser, tmp_path):
    from graphgen.compare.diff import diff_dumps
    ref, ours = _planted(tmp_path)
    res = diff_dumps(ref, ours)
    url = _page(tmp_path, "legend.html", to_html(ref, ours, res))
    browser.load(url + "#open=all")
    assert browser.errors() == []
    legend = browser.js("Array.from(document.querySelectorAll('#legend .item[data-key]')).map(function(i){"
                        "return [i.getAttribute('data-key'), i.textContent, getComputedStyle(i.querySelector('.sw'))"
                        ".backgroundColor];})")
    by_key = {k: (text, colour) for k, text, colour in legend}
    assert set(by_key) == set(STATUS_WORDS)
    for key, (text, _) in by_key.items():
        assert text.startswith(STATUS_WORDS[key]), (key, text)
    assert len({c for _, c in by_key.values()}) == len(by_key)  # one colour per status
    # every drawn node's fill is its status's swatch; the counts are the diff's own
    data = json.loads(browser.js("document.getElementById('data').textContent"))
    f = {k: i for i, k in enumerate(data["fields"])}
    drawn = _drawn(browser)
    assert len(drawn) == len(ref.nodes)
    want = {OP_PARAMS_AT: "changed", OP_AT: "changed", VALUE_AT: "value", UNCOMPARED_AT: "uncompared"}
    for row, fill in drawn:
        i = data["rows"][row][f["ref"]]
        assert _hex_rgb(fill) == by_key[want.get(i, "matched")][1], (i, fill)
    count = {k: int(re.search(r"(\d+)$", text).group(1)) for k, (text, _) in by_key.items()}
    assert count == {"matched": len(ref.nodes) - 4, "changed": 2, "value": 1, "deleted": 0, "inserted": 0,
                     "explained": 0, "uncompared": 1}
    # the NMSE strip and the outlines are named too
    text = browser.js("document.getElementById('legend').textContent")
    assert "NMSE" in text and "first divergence" in text and "selected" in text


def test_changed_node_worst_element_and_the_two_first_jumps(browser, tmp_path):
    ref, ours = _planted(tmp_path)
    url = _page(tmp_path, "changed.html", to_html(ref, ours))
    browser.load(url)
    assert browser.errors() == []

    def click_button(bid: str) -> int:
        browser.js("document.getElementById('details').innerHTML = ''")
        assert not browser.js(f"document.getElementById({json.dumps(bid)}).hidden")
        browser.click(*browser.centre_of("#" + bid))
        row = int(browser.js("document.querySelector('#details h3').getAttribute('data-row')"))
        x, y = browser.centre_of(f'#nodes .gnode[data-row="{row}"]')
        c = _canvas(browser)
        assert c["left"] < x < c["right"] and c["top"] < y < c["bottom"]  # brought into view
        return row

    # the first structural change (node 12, before the value failure) and the first value failure
    assert click_button("first-structural") == _row_of_ref(browser, OP_PARAMS_AT)
    changes = browser.js("Array.from(document.querySelectorAll('#details table.changes tr[data-field]')).map("
                         "function(r){return Array.from(r.cells).map(function(c){return c.textContent;});})")
    assert [c[0] for c in changes] == ["op_params"]
    (a,), (b,) = _numbers(changes[0][1]), _numbers(changes[0][2])
    assert changes[0][1].startswith("eps=") and changes[0][2].startswith("eps=")
    assert math.isclose(a, float(np.float32(1e-6)), rel_tol=1e-5) and math.isclose(b, float(np.float32(1e-5)), rel_tol=1e-5)
    assert click_button("first-value") == _row_of_ref(browser, VALUE_AT)
    # the element furthest apart: flat index, coordinates in ggml order (ne0 fastest), both values
    a = ref.values(VALUE_AT).astype(np.float64).ravel()
    b = ours.values(VALUE_AT).astype(np.float64).ravel()
    m = int(np.argmax(np.abs(a - b)))
    assert m == WORST_FLAT
    ne = ref.nodes[VALUE_AT].ne
    coord = [m % ne[0], m // ne[0] % ne[1], m // (ne[0] * ne[1]) % ne[2], m // (ne[0] * ne[1] * ne[2])]

    def cell(cls):
        return browser.js(f"(document.querySelector('#details table.worst .{cls}') || {{}}).textContent")
    assert cell("w-index") == str(m)
    assert _numbers(cell("w-coord")) == coord
    assert math.isclose(_numbers(cell("w-ref"))[0], a[m], rel_tol=1e-5, abs_tol=1e-7)
    assert math.isclose(_numbers(cell("w-ours"))[0], b[m], rel_tol=1e-5, abs_tol=1e-7)
    assert math.isclose(_numbers(cell("w-abs"))[0], abs(a[m] - b[m]), rel_tol=1e-5)
    # a changed op shows both ops; a node nobody compared says so and has no largest error
    browser.js(f"window.__viewer.select({_row_of_ref(browser, OP_AT)}, true)")
    changes = browser.js("Array.from(document.querySelectorAll('#details table.changes tr[data-field]')).map("
                         "function(r){return Array.from(r.cells).map(function(c){return c.textContent;});})")
    assert ["op", ref.nodes[OP_AT].op, "SUB"] in changes
    browser.js(f"window.__viewer.select({_row_of_ref(browser, UNCOMPARED_AT)}, true)")
    text = browser.js("document.getElementById('details').textContent")
    assert "not compared" in text and browser.js("document.querySelector('#details table.worst')") is None


@pytest.mark.reference
def test_backend_of_each_side_from_live_dumps(browser, tmp_path):
    """A llama.cpp b11739 dump and graphgen's, made here: each side names the backend it computed
    on. The wheel's llama.cpp has the CPU backend alone (and RPC, given no server), so "CPU" is
    the truth for it; graphgen records the backend of every node."""
    from graphgen.play.engine import run_scenario
    from graphgen.reference.runner import run_reference
    from graphgen.play.scenario import load_scenario
    from graphgen.synth import make_model
    model = tmp_path / "d.gguf"
    make_model(model, "dflash", "base")
    doc = {"n_ctx": 64, "n_ubatch": 8, "flash_attn": "off", "type_kv": "f16", "seed": 1,
           "steps": [{"inject": {"n_tokens": 3}}, {"block": {"tokens": [3, 5, 7, 9], "pos0": 3}}]}
    sc = tmp_path / "s.json"
    sc.write_text(json.dumps(doc))
    run_reference(model, sc, tmp_path / "ref", stderr_log=None)
    run_scenario(model, load_scenario(sc), tmp_path / "ours")
    ref, ours = (load_dump(tmp_path / side / "01-block.json") for side in ("ref", "ours"))
    assert ref.source["engine"] == "llama.cpp" and ours.source["engine"] == "graphgen"
    assert ref.source.get("backend") == "CPU" and all(n.backend is None for n in ref.nodes)
    assert {n.backend for n in ours.nodes} == {"CPU"}
    k = next(n.index for n in ref.nodes if n.op == "MUL_MAT")
    for name, page, cls in (("ref.html", to_html(ref), "backend"), ("ours.html", to_html(ours), "backend"),
                            ("diff.html", to_html(ref, ours), "backend.ref"),
                            ("diff.html", None, "backend.ours")):
        if page is not None:
            url = _page(tmp_path, name, page)
            browser.load(url + f"#node={k}")
        assert browser.js(f"document.querySelector('#details .{cls}').textContent") == "CPU", (name, cls)
