"""tools/mutate.py finds each mutation's place by function and code, whatever the formatting,
and every mutation of the list finds its place in this tree."""

from pathlib import Path

import pytest

import mutate as M


def test_every_mutation_finds_its_place_here():
    for m in M.MUTATIONS:
        f, a, b = M.locate(M.ROOT, m)
        assert f.read_text()[a:b] != m.new, m.name


def test_every_mutation_names_tests_that_exist():
    """A test file moved or renamed would leave a mutation that runs nothing."""
    for m in M.MUTATIONS:
        assert m.tests or m.name == "m", m.name
        for t in m.tests:
            assert (M.ROOT / t.split("::")[0]).is_file(), f"{m.name}: no {t}"


def _tree(tmp_path, files: dict) -> Path:
    for rel, text in files.items():
        p = tmp_path / "graphgen" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


CODE = "class Cache:\n    def seq_rm(self, p0, p1):\n        hit = (self.pos >= p0) & (self.pos < p1)\n        return hit\n"
MUT = M.Mutation("m", "Cache.seq_rm", "hit = (self.pos >= p0) & (self.pos < p1)",
                 "hit = (self.pos >= p0) & (self.pos <= p1)", ())


@pytest.mark.parametrize("text", [
    CODE,
    # reformatted: other spaces, the expression broken over lines
    "class Cache:\n    def seq_rm(self, p0, p1):\n        hit = ( self.pos >= p0 ) & (\n            self.pos < p1\n        )\n"
    "        return hit\n",
])
def test_found_whatever_the_formatting(tmp_path, text):
    tree = _tree(tmp_path, {"runtime/kv.py": text})
    f, a, b = M.locate(tree, MUT)
    assert f.name == "kv.py" and "self.pos" in f.read_text()[a:b]


def test_found_after_the_function_moved(tmp_path):
    tree = _tree(tmp_path, {"runtime/kv.py": "X = 1\n", "cache/cells.py": CODE})
    f, _, _ = M.locate(tree, MUT)
    assert f.relative_to(tree).as_posix() == "graphgen/cache/cells.py"


def test_ambiguous_or_missing_places_are_errors(tmp_path):
    tree = _tree(tmp_path, {"a.py": CODE, "b.py": CODE})
    with pytest.raises(ValueError, match="2 such functions"):
        M.locate(tree, MUT)
    f, _, _ = M.locate(tree, M.Mutation("m", "graphgen/b.py:Cache.seq_rm", MUT.old, MUT.new, ()))
    assert f.name == "b.py"
    with pytest.raises(ValueError, match="no such function"):
        M.locate(tree, M.Mutation("m", "Cache.gone", MUT.old, MUT.new, ()))
    with pytest.raises(ValueError, match="occurs 0 times"):
        M.locate(tree, M.Mutation("m", "graphgen/a.py:Cache.seq_rm", "self.pos > p0", "x", ()))
