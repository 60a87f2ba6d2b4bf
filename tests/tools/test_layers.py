"""tools/layers.py: graphgen's own tree has no import that climbs back up and no circle, and the
check names both when they are planted in a small tree of its shape."""

import layers


def _tree(root, files):
    for rel, text in files.items():
        p = root / "graphgen" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_graphgen_climbs_nowhere_and_has_no_circle():
    a = layers.analyse()
    assert a["climbing"] == [] and a["circles"] == [] and a["group_circles"] == []
    f = a["floors"]
    # the pipeline read top-down: the dump format under the models, the scenario layer under the
    # comparing side, the speculative package over the engines it drives, the command line on top
    assert f["dump"] < f["models"] < f["runtime"] < f["play"] < f["compare"]
    assert f["reference"] < f["speculative"] and f["authors"] < f["speculative"] < f["accept"]
    assert f["cli"] == max(f.values())


def test_a_climbing_import_and_a_circle_are_named(tmp_path, capsys, monkeypatch):
    _tree(tmp_path, {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/a.py": "def f():\n    from ..high import b  # climbs back up, inside a function\n",
        "high/__init__.py": "",
        "high/b.py": "from ..low import a\n",
        "high/c.py": "from . import d\n",
        "high/d.py": "from .c import x\n",
        "solo.py": "import graphgen.low.a\n",
    })
    a = layers.analyse(tmp_path)
    assert ("graphgen.low.a", "graphgen.high.b") in a["climbing"]
    assert ("graphgen.high.b", "graphgen.low.a") in a["climbing"]
    assert ["graphgen.high.c", "graphgen.high.d"] in a["circles"]
    assert a["group_circles"] == [["high", "low"]]
    monkeypatch.setattr(layers, "ROOT", tmp_path)
    monkeypatch.setattr(layers, "analyse", lambda root=tmp_path: a)
    assert layers.main([]) == 1
    out = capsys.readouterr().out
    assert "climbs back up: graphgen.low.a imports graphgen.high.b" in out
    assert "circle: graphgen.high.c <-> graphgen.high.d" in out and out.rstrip().endswith("FAIL")


def test_floors_stack_by_imports(tmp_path):
    _tree(tmp_path, {"__init__.py": "", "base.py": "", "mid.py": "from . import base\n",
                     "top/__init__.py": "", "top/x.py": "from ..mid import y\nfrom .. import base\n"})
    a = layers.analyse(tmp_path)
    assert a["floors"] == {"base": 0, "mid": 1, "top": 2}
    assert a["climbing"] == [] and a["circles"] == []
