"""A draft checkpoint folder, checked once before anything reads it (graphgen/authors/folder.py):
which authors' format a config is, the weight files as llama.cpp's converter picks them, the
safetensors headers checked against the files' sizes, and every refusal in one line naming the
user's path. Folders are written by hand here; only the shape check builds the authors' classes."""

from __future__ import annotations

import json
import struct

import pytest

from authors_util import require_extra
from graphgen.authors import AuthorsError
from graphgen.authors import folder as F

ZLAB = {"architectures": ["DFlashDraftModel"], "dflash_config": {"mask_token_id": 9, "target_layer_ids": [0]}}
SPECULATORS = {"speculators_model_type": "dspark", "transformer_layer_config": {}, "aux_hidden_state_layer_ids": [1]}


def _safetensors(path, tensors: dict, meta=True, cut: int = 0):
    """A safetensors file: {name: shape} of float32 zeros, written by hand; `cut` bytes left off the end."""
    header, at = {}, 0
    for name, shape in tensors.items():
        n = 4
        for s in shape:
            n *= s
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [at, at + n]}
        at += n
    if meta:
        header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header).encode()
    data = struct.pack("<Q", len(raw)) + raw + b"\0" * at
    path.write_bytes(data[:len(data) - cut])
    return path


def _folder(tmp_path, config, tensors=None, name="ck"):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    if tensors is not None:
        _safetensors(d / "model.safetensors", tensors)
    return d


# -- the formats -----------------------------------------------------------------------------------

def test_the_formats_and_their_classes():
    assert F.HF_VARIANTS == ("dflash", "dflash2", "dspark")
    assert F.CLASSES == {("zlab", "dflash"): "DFlashDraftModel", ("speculators", "dflash"): "DFlashDraftModel",
                         ("zlab", "dflash2"): "DFlash2DraftModel", ("speculators", "dflash2"): "DFlash2DraftModel",
                         ("speculators", "dspark"): "DSparkDraftModel"}


@pytest.mark.parametrize("config,found", [
    (ZLAB, ("zlab", "dflash")),
    ({**ZLAB, "architectures": ["DFlash2DraftModel"]}, ("zlab", "dflash2")),
    (SPECULATORS, ("speculators", "dspark")),
    ({**SPECULATORS, "speculators_model_type": "dflash2", "architectures": ["X"]}, ("speculators", "dflash2")),
    ({"architectures": ["Qwen3DSparkModel"]}, (None, "dspark")),
    ({"architectures": ["Lfm2DSparkDraftModel", "Other"]}, (None, "dspark")),
])
def test_a_config_says_its_authors_and_variant(tmp_path, config, found):
    assert F.detect(tmp_path, config) == found


@pytest.mark.parametrize("config,message", [
    ({"architectures": ["LlamaForCausalLM"]}, "key 'architectures' = ['LlamaForCausalLM'] is not a DFlash-family "
                                              "draft (known: DFlashDraftModel, DFlash2DraftModel, Qwen3DSparkModel"),
    ({"model_type": "qwen3"}, "missing key 'architectures'; not a DFlash-family draft checkpoint"),
    ({"architectures": []}, "missing key 'architectures'"),
    ({"architectures": ["DFlashDraftModel"]}, "missing key 'dflash_config' of a z-lab DFlashDraftModel"),
    ({**SPECULATORS, "speculators_model_type": "eagle3"}, "key 'speculators_model_type' = 'eagle3' is not a "
                                                          "DFlash-family draft (dflash, dflash2, dspark)"),
    ({"speculators_model_type": "dflash", "transformer_layer_config": {}},
     "missing key 'aux_hidden_state_layer_ids' of a speculators dflash config"),
])
def test_a_config_of_no_dflash_family_format_is_refused_naming_the_key(tmp_path, config, message):
    with pytest.raises(AuthorsError) as e:
        F.detect(tmp_path, config)
    assert str(e.value).startswith(f"{tmp_path / 'config.json'}: {message}")


# -- the config file -----------------------------------------------------------------------------------

def test_a_config_that_is_no_json_object_is_refused(tmp_path):
    with pytest.raises(AuthorsError, match=r"ck: no config.json: not a HuggingFace checkpoint folder$"):
        F.read_config(tmp_path / "ck")
    d = _folder(tmp_path, "{not json", name="a")
    with pytest.raises(AuthorsError, match=r"a/config.json: not JSON \("):
        F.read_config(d)
    d = _folder(tmp_path, "[1, 2]", name="b")
    with pytest.raises(AuthorsError, match=r"b/config.json: expected a JSON object$"):
        F.read_config(d)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "config.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(AuthorsError, match=r"c/config.json: not readable \("):
        F.read_config(tmp_path / "c")
    assert F.read_config(_folder(tmp_path, ZLAB, name="d")) == ZLAB


# -- the weight files -------------------------------------------------------------------------------

def test_weight_files_as_the_converter_picks_them(tmp_path):
    d = _folder(tmp_path, ZLAB)
    for name in ("model-00002-of-00002.safetensors", "model-00001-of-00002.safetensors", "pytorch_model.bin",
                 "other.safetensors"):
        (d / name).write_bytes(b"")
    assert [p.name for p in F.weight_files(d)] == ["model-00001-of-00002.safetensors",
                                                   "model-00002-of-00002.safetensors"]
    for p in d.glob("model-*"):
        p.unlink()
    assert [p.name for p in F.weight_files(d)] == ["pytorch_model.bin"]
    # an index names its files, each once, whatever else lies there
    (d / "a.safetensors").write_bytes(b"")
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"x": "other.safetensors", "y": "a.safetensors", "z": "other.safetensors"}}))
    assert [p.name for p in F.weight_files(d)] == ["a.safetensors", "other.safetensors"]
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "gone.safetensors"}}))
    with pytest.raises(AuthorsError, match=r"ck/gone.safetensors: named by model.safetensors.index.json, no such file$"):
        F.weight_files(d)
    (d / "model.safetensors.index.json").write_text("{")
    with pytest.raises(AuthorsError, match=r"model.safetensors.index.json: not readable JSON \("):
        F.weight_files(d)


def test_a_safetensors_header_is_checked_against_the_files_size(tmp_path):
    ok = _safetensors(tmp_path / "ok.safetensors", {"a.weight": [2, 3], "b": [4]})
    assert F.safetensors_header(ok) == {"a.weight": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
                                        "b": {"dtype": "F32", "shape": [4], "data_offsets": [24, 40]}}
    cut = _safetensors(tmp_path / "cut.safetensors", {"a.weight": [2, 3]}, cut=1)
    size = cut.stat().st_size
    with pytest.raises(AuthorsError) as e:
        F.safetensors_header(cut)
    assert str(e.value) == f"{cut}: truncated safetensors file: its tensors need {size + 1} bytes, the file holds {size}"
    # a file cut inside its header (these two are said inside "not a readable safetensors file (...)" today)
    tiny = tmp_path / "tiny.safetensors"
    tiny.write_bytes(b"\x01\x02\x03")
    with pytest.raises(AuthorsError) as e:
        F.safetensors_header(tiny)
    # named once, as what it is (not wrapped as an unreadable file)
    assert str(e.value) == f"{tiny}: truncated safetensors file (3 bytes, no header)"
    long = tmp_path / "long.safetensors"
    long.write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(AuthorsError) as e:
        F.safetensors_header(long)
    assert str(e.value) == (f"{long}: truncated safetensors file: its header is 1000 bytes, "
                            "the file holds 2 after the length")
    for name, head in (("json.safetensors", b"{oops"), ("list.safetensors", b"[1, 2]")):
        (tmp_path / name).write_bytes(struct.pack("<Q", len(head)) + head)
    with pytest.raises(AuthorsError, match=r"json.safetensors: not a readable safetensors file \("):
        F.safetensors_header(tmp_path / "json.safetensors")
    with pytest.raises(AuthorsError, match=r"list.safetensors: not a safetensors file \(its header is no JSON object\)$"):
        F.safetensors_header(tmp_path / "list.safetensors")


# -- inspect -----------------------------------------------------------------------------------------

def test_inspect_reads_the_config_and_every_tensors_shape(tmp_path):
    d = _folder(tmp_path, ZLAB)
    _safetensors(d / "model-00001-of-00002.safetensors", {"fc.weight": [8, 16]})
    _safetensors(d / "model-00002-of-00002.safetensors", {"norm.weight": [8], "layers.0.mlp.up_proj.weight": [4, 8]})
    ck = F.inspect(d, shapes=False)
    assert (ck.path, ck.config, ck.authors, ck.variant) == (d, ZLAB, "zlab", "dflash")
    assert [p.name for p in ck.weights] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert ck.tensors == {"fc.weight": [8, 16], "norm.weight": [8], "layers.0.mlp.up_proj.weight": [4, 8]}


def test_inspect_refuses_what_is_no_checkpoint_folder(tmp_path):
    with pytest.raises(AuthorsError, match=r"nothing: no such file or folder$"):
        F.inspect(tmp_path / "nothing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(AuthorsError, match=r"file: is a file, not a checkpoint folder \(config.json and safetensors\)$"):
        F.inspect(tmp_path / "file")
    d = _folder(tmp_path, ZLAB)
    with pytest.raises(AuthorsError, match=r"ck: no model\*.safetensors \(nor pytorch_model\*.bin\) weights$"):
        F.inspect(d)
    _safetensors(d / "model.safetensors", {"fc.weight": [8, 16]}, cut=3)
    with pytest.raises(AuthorsError, match="model.safetensors: truncated safetensors file"):
        F.inspect(d, shapes=False)


def test_a_tensor_the_config_contradicts_is_named_with_its_file(tmp_path):
    require_extra()
    from graphgen.authors.checkpoint import HFSpec, make_hf
    ck_dir = make_hf(tmp_path / "ck", HFSpec(variant="dflash", n_layer=1, block_size=4, target_layers=[1, 2]))
    ck = F.inspect(ck_dir)
    assert F.shape_mismatch(ck) is None
    assert F.authors_class("zlab", "dflash").__name__ == "DFlashDraftModel"
    assert F.authors_class("speculators", "dspark").__module__ == "speculators.models.dspark.core"
    cfg_path = ck_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["intermediate_size"] = 96  # the checkpoint's FFN is 128 wide
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(AuthorsError) as e:
        F.inspect(ck_dir)
    assert str(e.value) == (f"{ck_dir / 'model.safetensors'}: tensor 'layers.0.mlp.down_proj.weight' has shape "
                            f"[64, 128], {cfg_path} makes it [64, 96]")
    # without the shape check the folder reads
    assert F.inspect(ck_dir, shapes=False).variant == "dflash"
