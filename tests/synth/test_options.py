"""graphgen.synth.options: the options make_model refuses, and the head names it spells for the
command line."""

import pytest

from graphgen.synth import make_model


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_embd=60, n_head=8), "n_embd"),
    (dict(n_head=4, n_head_kv=3), "n_head_kv"),
    (dict(target_layers=()), "target_layers"),
    (dict(n_vocab=3), "n_vocab"),
    (dict(swa_window=8, swa_pattern=[0, 0]), "sliding"),
    (dict(swa_window=8, swa_pattern=[1]), "swa_pattern"),
    (dict(swa_pattern=[1, 0]), "swa_window"),
    (dict(mrope_sections=[8, 0, 0]), "mrope_sections"),
    (dict(d2t_vocab=256), "d2t_vocab"),
    (dict(n_rot=7), "n_rot"),
    (dict(no_such_option=1), "no_such_option"),
    (dict(variant="dflash", selector_top_k=2), "selector_top_k"),
    (dict(variant="dflash", conf=True), "conf"),
    (dict(variant="dflash2", n_embd=16, n_head=2, selector_top_k=4, conv_group_size=8), "top_k"),
    (dict(variant="dflash2", conv_group_size=24), "conv_group_size"),
    (dict(variant="lilicorr", lilicorr_layers=3), "lilicorr_layers"),
    (dict(variant="lilicorr", block_size=1), "block_size"),
    (dict(variant="lilicorr", lilicorr_heads=3), "lilicorr_heads"),
    (dict(variant="lilicorr", conv_kernel_size=3), "lilicorr_conv"),
    (dict(variant="nope"), "variant"),
])
def test_bad_options(tmp_path, kwargs, match):
    kwargs = dict(kwargs)
    variant = kwargs.pop("variant", "dflash")
    with pytest.raises(ValueError, match=match):
        make_model(tmp_path / "x.gguf", variant, **kwargs)
    assert not (tmp_path / "x.gguf").exists()


def test_backbone_options_are_checked(tmp_path):
    with pytest.raises(ValueError, match="backbone must be one of"):
        make_model(tmp_path / "x.gguf", backbone="dsv5")
    with pytest.raises(ValueError, match="q_lora_rank"):
        make_model(tmp_path / "x.gguf", q_lora_rank=8)
    with pytest.raises(ValueError, match="does not apply"):
        make_model(tmp_path / "x.gguf", "dspark", backbone="mistral-large4", q_lora_rank=8)


def test_variants_are_the_registered_heads():
    """synth spells the head names for the command line (which must not load ggml to build its
    options); they must be the registry's heads, and every head option must come from an entry."""
    from graphgen.models.arch import HEADS
    from graphgen.synth.options import VARIANTS, all_options
    assert set(VARIANTS) == set(HEADS)
    owned = {name for h in HEADS.values() for name in h.synth_options}
    assert owned and all(all_options()[name][1] for name in owned)
