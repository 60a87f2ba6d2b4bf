"""graphgen.synth.model: make_model's draft with a d2t map, from the command line, and for a target."""

import argparse

import numpy as np
import pytest
from synth_read import read

from graphgen.cli.model import add_make_model_args, make_model_from_args
from graphgen.synth import make_model


def test_d2t(tmp_path):
    make_model(tmp_path / "d.gguf", d2t_vocab=100)
    _, _, tensors, data = read(tmp_path / "d.gguf")
    assert tensors["d2t"] == (100,)
    ids = data["d2t"]
    assert ids.dtype == np.int64
    assert (np.diff(ids) > 0).all() and ids.min() >= 0 and ids.max() < 256
    assert tensors["output.weight"] == (64, 100)
    assert tensors["token_embd.weight"] == (64, 256)


def test_command_line(tmp_path):
    parser = argparse.ArgumentParser()
    add_make_model_args(parser)
    out = tmp_path / "c.gguf"
    args = parser.parse_args([str(out), "--variant", "dspark", "--conf", "--layers", "3",
                              "--target-layers", "0,2,4", "--swa-window", "16", "--swa-pattern", "1,0,1",
                              "--shared-kv", "--sample-from-anchor", "false", "--markov-rank", "4"])
    s = make_model_from_args(args)
    assert s["variant"] == "dspark"
    keys, _, tensors, _ = read(out)
    assert keys["dflash.target_layers"] == [0, 2, 4]
    assert keys["dflash.attention.sliding_window_pattern"] == [True, False, True]
    assert keys["dflash.sample_from_anchor"] is False
    assert tensors["fc.weight"] == (192, 64)
    assert tensors["markov_w1.weight"] == (4, 256)
    assert "conf_proj.weight" in tensors and "blk.0.attn_v.weight" not in tensors

    args = parser.parse_args([str(out), "--variant", "dflash", "--conv-kernel", "3"])
    with pytest.raises(ValueError, match="conv_kernel_size"):
        make_model_from_args(args)


def _target_keys(path, n_layer):
    """A target as make_model reads it (keys only): width, depth, a small vocabulary."""
    from gguf import GGUFWriter
    w = GGUFWriter(str(path), "llama")
    w.add_uint32("llama.embedding_length", 64)
    w.add_uint32("llama.block_count", n_layer)
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(256)])
    w.add_array("tokenizer.ggml.token_type", [1] * 255 + [3])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_target_too_shallow_for_the_default_layers_needs_them_given(tmp_path):
    """The authors' spread of three layers repeats one on a target of five layers or fewer: a draft
    reading one layer twice is no default, so make_model asks for target_layers; given, they stand."""
    for n_layer, spread in ((3, "2,1,1"), (4, "2,2,2"), (5, "2,3,3")):
        t = _target_keys(tmp_path / f"t{n_layer}.gguf", n_layer)
        with pytest.raises(ValueError, match=rf"t{n_layer}\.gguf has {n_layer} layers.*\({spread}\).*"
                                             rf"0\.\.{n_layer - 1} \(--target-layers\)"):
            make_model(tmp_path / "x.gguf", target=t, n_layer=1)
        assert not (tmp_path / "x.gguf").exists()
    s = make_model(tmp_path / "x.gguf", target=_target_keys(tmp_path / "t4.gguf", 4), n_layer=1, target_layers=[3, 3])
    assert s["keys"]["dflash.target_layers"] == [3, 3]
    s = make_model(tmp_path / "y.gguf", target=_target_keys(tmp_path / "t6.gguf", 6), n_layer=1)
    assert s["keys"]["dflash.target_layers"] == [2, 3, 4]
