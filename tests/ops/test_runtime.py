"""The ggml graphgen computes on: the reference's own by default, any other folder by --ggml.

Each other library folder runs in a child process, since one process holds one ggml.
"""

import json
import shutil
import subprocess
import sys

import pytest

from conftest import REF_DIR
from graphgen.ops import ggml as G
from graphgen.ops import runtime
from graphgen.libload import lib_file, package_dir

CLI = [sys.executable, "-m", "graphgen.cli"]


def run(args, **kw):
    return subprocess.run(CLI + args, capture_output=True, text=True, **kw)


def test_default_runtime_is_the_reference_ggml():
    rt = runtime.active()
    assert rt is not None and rt.origin == "reference" and rt.version == "0.27.0"
    # the very libraries the wheel ships (or their glibc-patched copies), byte for byte in size
    for base in ("ggml", "ggml-base", "ggml-cpu"):
        ours = lib_file(rt.lib_dir, base)
        assert ours.stat().st_size == lib_file(package_dir(), base).stat().st_size
        assert (rt.package_dir / "lib" / f"lib{base}.so").resolve() == ours.resolve()
    assert G._g.ggml_version().decode() == "0.27.0"


def test_op_ids_come_from_the_library():
    # ggml 0.27.0 numbers its ops differently from ggml-python's constants (four ops inserted)
    assert G.GGML_OP_UNARY == 91 and G.GGML_OP_GLU == 100 and G.GGML_OP_COUNT == 101
    assert G.GGML_GLU_OP_SWIGLU_CLAMP == 6 and G.GGML_OP_FLASH_ATTN_EXT == 74
    for name, op in G.OP_IDS.items():
        if name.startswith("GGML_OP_") and name != "GGML_OP_COUNT":
            assert G._g.ggml_op_name(op).decode() == name[len("GGML_OP_"):]


def test_fused_ops_build_the_upstream_nodes():
    ctx = G.ggml_init(G.ggml_init_params(mem_size=64 * G.ggml_tensor_overhead(), mem_buffer=None, no_alloc=True))
    try:
        x = G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 8, 4, 3)
        w = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)
        pre = G.ggml_dsv4_hc_pre(ctx, x, w)
        assert G.op_desc(pre) == "DSV4_HC_PRE" and [G.ne(pre, i) for i in range(2)] == [8, 3]
        a = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 8, 3)
        clamp = G.ggml_swiglu_clamp(ctx, a, a, 7.0)
        assert G.op_desc(clamp) == "SWIGLU_CLAMP"
        rope = G.ggml_rope_ext(ctx, x, G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_I32, 3), None, 4, 0, 0,
                               10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)
        assert G.ggml_rope_set_offset(rope, 4).contents.op_params[15] == 4
    finally:
        G.ggml_free(ctx)


@pytest.fixture(scope="module")
def copied_libs(tmp_path_factory):
    """A second library folder: the reference's libraries copied elsewhere, under plain names."""
    d = tmp_path_factory.mktemp("ggml-copy")
    for base in ("ggml", "ggml-base", "ggml-cpu", "ggml-rpc"):
        src = lib_file(runtime.active().lib_dir, base)
        shutil.copy2(src, d / src.name)
    return d


def test_ggml_option_loads_another_folder(copied_libs, tmp_path):
    p = run(["devices", "--ggml", str(copied_libs)])
    assert p.returncode == 0, p.stderr
    assert f"ggml 0.27.0 from {copied_libs} (--ggml)" in p.stdout
    # the environment variable does the same, and a dump records which ggml computed it
    model = tmp_path / "m.gguf"
    assert run(["make-model", str(model), "--variant", "dflash"]).returncode == 0
    p = run(["dump", str(model), "--scenario", str(REF_DIR / "dflash-fa-off" / "scenario.json"), "--out",
             str(tmp_path / "d")], env=dict(__import__("os").environ, GRAPHGEN_GGML_DIR=str(copied_libs)))
    assert p.returncode == 0, p.stderr
    src = json.loads(next((tmp_path / "d").glob("*-block.json")).read_text())["source"]
    assert src["ggml"] == "0.27.0" and src["ggml_dir"] == str(copied_libs)
    assert src["ggml_origin"] == "$GRAPHGEN_GGML_DIR"


def _stub_ggml(folder, missing):
    """Libraries that export every function graphgen needs but `missing` (none of them callable)."""
    names = runtime.bound_functions(runtime.active().package_dir / "ggml.py") + list(runtime.FUSED_FUNCTIONS)
    body = "\n".join(f"void {n}(void) {{}}" for n in sorted(set(names)) if n not in (missing, "ggml_version"))
    src = folder / "stub.c"
    src.write_text('const char * ggml_version(void) { return "0.0.1"; }\n' + body + "\n")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the stub library")
    for base in ("ggml", "ggml-base", "ggml-cpu"):
        subprocess.run([cc, "-shared", "-fPIC", "-o", str(folder / f"lib{base}.so"), str(src)], check=True)


def test_a_ggml_without_a_needed_function_is_refused_in_one_line(tmp_path):
    _stub_ggml(tmp_path, "ggml_dsv4_hc_comb")
    p = run(["--ggml", str(tmp_path), "devices"])
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "lacks ggml_dsv4_hc_comb" in lines[0] and "ggml 0.0.1" in lines[0] and str(tmp_path) in lines[0]


def test_missing_library_folder_is_refused(tmp_path):
    p = run(["--ggml", str(tmp_path / "nowhere"), "devices"])
    assert p.returncode == 2 and "does not exist" in p.stderr
    p = run(["--ggml", str(tmp_path), "devices"])
    assert p.returncode == 2 and "has no libggml-base.so" in p.stderr


def test_bound_functions_skip_optional_bindings():
    names = runtime.bound_functions(runtime.active().package_dir / "ggml.py")
    assert "ggml_init" in names and "ggml_backend_sched_graph_compute" in names
    # declared with enabled=hasattr(...): absent in some builds, never required
    assert "ggml_softplus" not in names and len(names) > 500
