"""graphgen.synth.writer: the same seed gives the same bytes, and the weights are f32 and tame."""

import numpy as np
from synth_read import read

from graphgen.synth import make_model


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    for variant in ("dflash", "dflash2", "dspark", "lilicorr"):
        a, b, c = (tmp_path / f"{variant}{i}.gguf" for i in range(3))
        make_model(a, variant, seed=3)
        make_model(b, variant, seed=3)
        make_model(c, variant, seed=4)
        assert a.read_bytes() == b.read_bytes(), variant
        assert a.read_bytes() != c.read_bytes(), variant
        assert len(a.read_bytes()) == len(c.read_bytes()), variant


def test_weights_are_f32_and_tame(tmp_path):
    make_model(tmp_path / "d.gguf")
    _, _, _, data = read(tmp_path / "d.gguf")
    for name, t in data.items():
        assert t.dtype == np.float32, name
        assert np.isfinite(t).all() and np.abs(t).max() < 10, name
    assert abs(data["output_norm.weight"].mean() - 1.0) < 0.1
