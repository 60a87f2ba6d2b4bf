"""A target llama.cpp b11739 refuses reaches the user as one line naming the file and b11739's reason.

b11739 says why it refuses a model only in its log (`llama_model_load: error loading model:
check_tensor_dims: tensor 'blk.0.attn_norm.weight' not found`), and the refusal is raised in a
child process: left to Python, it would reach the user as the last line of the child's traceback
(`File ".../reference/target.py", line 50, in __init__`), or as "could not load the target" without
the reason. Every command that opens a target prints `could not load the target PATH: <b11739's
reason>`: here draft -m, accept -m and dump --target (the runner's lender, which check uses), on
copies of the SmolLM2 target with one tensor left out, and the library's ReferenceTarget. How the
reason is read from llama.cpp's log lines: test_protocol.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gguf
import pytest

ROOT = Path(__file__).resolve().parents[2]
DRAFT = ROOT / "drafts" / "smollm2-dflash" / "draft.gguf"
CLI = [sys.executable, "-m", "graphgen.cli"]


# -- live: the commands that open a target ------------------------------------------------------

def without(src: Path, dst: Path, name: str) -> Path:
    """A copy of the GGUF at `src` without tensor `name`, every other tensor and key as it is."""
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = gguf.GGUFValueType(int(f.types[0]))
        sub = gguf.GGUFValueType(int(f.types[1])) if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), vtype, sub_type=sub)
    found = False
    for t in r.tensors:
        if t.name == name:
            found = True
            continue
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    assert found, f"{src} has no tensor {name}"
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


# (left-out tensor, the first one b11739 looks for and misses)
MISSING = ["blk.0.attn_norm.weight", "blk.2.ffn_up.weight"]


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    from graphgen.speculative.targets import resolve
    src = resolve("smollm2")
    folder = tmp_path_factory.mktemp("targets")
    return {name: without(src, folder / f"without-{name}.gguf", name) for name in MISSING}


def run(args, cwd):
    return subprocess.run(CLI + args, capture_output=True, text=True, cwd=cwd)


def the_line(p, path: Path, name: str) -> None:
    """One line on stderr, naming the file and b11739's reason; no traceback."""
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("graphgen: error:")]
    assert p.returncode == 2 and len(lines) == 1, p.stderr[-3000:]
    assert lines[0] == (f"graphgen: error: llama.cpp b11739 could not load the target {path}: check_tensor_dims: "
                        f"tensor '{name}' not found"), lines[0]
    assert "Traceback" not in p.stderr and 'File "' not in p.stderr


@pytest.mark.reference
@pytest.mark.parametrize("name", MISSING)
def test_draft_names_the_missing_tensor(broken, name, tmp_path):
    p = run(["draft", "-m", str(broken[name]), "-md", str(DRAFT), "-p", "The capital of France is", "-n", "4",
             "--temp", "0"], tmp_path)
    the_line(p, broken[name], name)


@pytest.mark.reference
def test_accept_names_the_missing_tensor(broken, tmp_path):
    name = MISSING[0]
    p = run(["accept", "-m", str(broken[name]), "-md", str(DRAFT), "-n", "4", "--engines", "llama.cpp,graphgen"],
            tmp_path)
    the_line(p, broken[name], name)


@pytest.mark.reference
def test_dump_beside_a_target_names_the_missing_tensor(broken, tmp_path):
    """The runner's own child (a scenario's "target" lends the draft its tables, as in check)."""
    name = MISSING[1]
    p = run(["dump", str(DRAFT), "--target", str(broken[name]), "--engine", "llama.cpp", "--out",
             str(tmp_path / "out")], tmp_path)
    the_line(p, broken[name], name)


@pytest.mark.reference
def test_the_library_raises_with_the_reason(broken):
    from graphgen.reference.runner import ReferenceFailed
    from graphgen.reference.session import ReferenceTarget
    name = MISSING[0]
    with pytest.raises(ReferenceFailed) as e:
        ReferenceTarget(broken[name], [1], n_ctx=256, n_batch=64)
    assert str(e.value) == (f"llama.cpp b11739 could not load the target {broken[name].resolve()}: "
                            f"check_tensor_dims: tensor '{name}' not found")


@pytest.mark.reference
def test_a_refused_draft_is_named_with_the_reason_too(tmp_path):
    """The draft's context says the same of a file b11739 refuses: its path, then b11739's reason."""
    from gguf_edit import rewrite
    from graphgen.reference.runner import ReferenceFailed, run_reference
    from graphgen.synth import make_model
    make_model(tmp_path / "base.gguf", "dflash", seed=2)
    bad = rewrite(tmp_path / "base.gguf", tmp_path / "draft.gguf", drop_keys={"dflash.block_size"},
                  set_keys={"dflash.block_size": (gguf.GGUFValueType.INT32, 4)})
    sc = tmp_path / "scenario.json"
    sc.write_text(json.dumps({"n_ctx": 256, "n_ubatch": 16, "steps": [{"inject": {"n_tokens": 3, "pos0": 0}}]}))
    with pytest.raises(ReferenceFailed) as e:
        run_reference(bad, sc, tmp_path / "ref", stderr_log=None)
    assert str(e.value).splitlines()[0] == (f"llama.cpp b11739 could not load {bad}: error loading model "
                                            "hyperparameters: key dflash.block_size has wrong type i32 but "
                                            "expected type u32")
