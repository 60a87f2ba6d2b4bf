"""`graphgen convert`: llama.cpp's own converter on checkpoints saved by the authors' own classes
(z-lab dflash, vLLM speculators), each bridge's warning, each refusal, and output safety. Drafts
without embeddings or lm head are written as the converter writes them and run beside their
target's GGUF (converted by the same converter), in graphgen and in b11739 alike."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from authors_util import require_extra

require_extra()

import sentencepiece as spm  # noqa: E402
import torch  # noqa: E402

from gguf import GGUFReader  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

from graphgen.authors.convert import CONVERTER_COMMIT, ConvertError, convert, converter_tree  # noqa: E402
from graphgen.cli import main  # noqa: E402
from graphgen.errors import GGUFModelError  # noqa: E402
from graphgen.reference.target import LAYER_INPUT_ARCHS  # noqa: E402
from graphgen.runtime.model import load  # noqa: E402
from graphgen.runtime.session import Session  # noqa: E402

MASK = 3
LAYER = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, vocab_size=256)
DFLASH2 = dict(conv_kernel_size=2, conv_group_size=16, selector_rank=8, selector_top_k=4)


# --- checkpoints, made by the authors' own classes ------------------------------------------------

def _randomize(model, seed):
    # random everywhere, including what the authors leave uninitialized (torch.empty) or NaN
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)


def make_target(folder: Path, tie: bool = False) -> Path:
    cfg = Qwen3Config(**{**LAYER, "num_hidden_layers": 1}, tie_word_embeddings=tie)
    model = Qwen3ForCausalLM(cfg)
    _randomize(model, 7)
    model.save_pretrained(folder)
    corpus = folder.parent / f"{folder.name}-corpus.txt"
    corpus.write_text("\n".join(["the quick brown fox jumps over the lazy dog", "draft blocks for a target model",
                                 "speculative decoding proposes several tokens at once"] * 10))
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(folder / "tokenizer"), vocab_size=40,
                                   model_type="bpe", minloglevel=2)
    (folder / "tokenizer.vocab").unlink()
    return folder


def make_zlab(folder: Path, v2: bool = False) -> Path:
    from dflash.model import DFlash2DraftModel, DFlashDraftModel
    dc = dict(mask_token_id=MASK, target_layer_ids=[1, 4], block_size=8, **(DFLASH2 if v2 else {}))
    cfg = Qwen3Config(**LAYER, dflash_config=dc, num_target_layers=8,
                      architectures=["DFlash2DraftModel" if v2 else "DFlashDraftModel"])
    model = (DFlash2DraftModel if v2 else DFlashDraftModel)(cfg)
    _randomize(model, 1)
    model.save_pretrained(folder)
    return folder


def make_speculators(folder: Path, target: Path, kind: str, draft_vocab: int = 256, **extra) -> Path:
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig
    from speculators.models.dflash2 import DFlash2DraftModel, DFlash2SpeculatorConfig
    from speculators.models.dspark import DSparkDraftModel, DSparkSpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    config_cls, model_cls = {"dflash": (DFlashSpeculatorConfig, DFlashDraftModel),
                             "dflash2": (DFlash2SpeculatorConfig, DFlash2DraftModel),
                             "dspark": (DSparkSpeculatorConfig, DSparkDraftModel)}[kind]
    sc = SpeculatorsConfig(algorithm=kind, proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=7)],
                           default_proposal_method="greedy",
                           verifier=VerifierConfig(name_or_path=str(target), architectures=["Qwen3ForCausalLM"]))
    cfg = config_cls(transformer_layer_config=Qwen3Config(**LAYER, _attn_implementation="eager"),
                     draft_vocab_size=draft_vocab, block_size=8, aux_hidden_state_layer_ids=[2, 5],
                     mask_token_id=MASK, speculators_config=sc, **extra)
    model = model_cls(cfg)
    _randomize(model, 2)
    if draft_vocab < LAYER["vocab_size"]:
        ids = torch.arange(draft_vocab) * (LAYER["vocab_size"] // draft_vocab)
        t2d = torch.zeros(LAYER["vocab_size"], dtype=torch.bool)
        t2d[ids] = True
        model.load_vocab_mappings(t2d, ids - torch.arange(draft_vocab))
    model.save_pretrained(folder)
    return folder


def tensor(folder: Path, name: str) -> np.ndarray:
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        return f.get_tensor(name).float().numpy()


def gguf_tensors(path: Path) -> dict[str, np.ndarray]:
    return {t.name: np.asarray(t.data) for t in GGUFReader(path).tensors}


class Run:
    def __init__(self, tmp: Path, hf_dir: Path, target: Path, **kw):
        self.hf_dir, self.target = hf_dir, target
        self.warned: list[str] = []
        self.res = convert(hf_dir, tmp / f"{hf_dir.name}.gguf", target_dir=target, warn=self.warned.append, **kw)


# --- shared folders and conversions ---------------------------------------------------------------

@pytest.fixture(scope="module")
def work(tmp_path_factory):
    converter_tree()  # fetched once, outside the timings
    return tmp_path_factory.mktemp("convert")


@pytest.fixture(scope="module")
def target(work):
    return make_target(work / "target")


@pytest.fixture(scope="module")
def tied_target(work):
    return make_target(work / "tied-target", tie=True)


@pytest.fixture(scope="module")
def zlab(work, target):
    # the target converted beside the draft, once for the module
    return Run(work, make_zlab(work / "zlab"), target, target_gguf=work / "target.gguf")


@pytest.fixture(scope="module")
def target_gguf(zlab):
    return zlab.res.target_out


@pytest.fixture(scope="module")
def zlab2(work, target):
    return Run(work, make_zlab(work / "zlab2", v2=True), target)


@pytest.fixture(scope="module")
def spec(work, target):
    return Run(work, make_speculators(work / "spec", target, "dflash"), target)


@pytest.fixture(scope="module")
def spec2(work, target):
    return Run(work, make_speculators(work / "spec2", target, "dflash2", **DFLASH2), target)


@pytest.fixture(scope="module")
def spark_folder(work, tied_target):
    return make_speculators(work / "spark", tied_target, "dspark", markov_rank=8)


@pytest.fixture(scope="module")
def spark_full(work, spark_folder, tied_target):
    # a full-vocabulary DSpark beside a target that ties its head to its embeddings
    return Run(work, spark_folder, tied_target, target_gguf=work / "tied-target.gguf")


@pytest.fixture(scope="module")
def spark_d2t(work, target):
    return Run(work, make_speculators(work / "spark-d2t", target, "dspark", draft_vocab=64, markov_rank=8), target)


def _copy(src: Path, dst: Path) -> Path:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    return dst


def _edit_config(folder: Path, **changes) -> Path:
    cfg = json.loads((folder / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


# --- conversions --------------------------------------------------------------------------------

BOTH = ["token_embd.weight", "output.weight"]


@pytest.mark.parametrize("name, variant", [("zlab", "dflash"), ("zlab2", "dflash2"), ("spec", "dflash"),
                                           ("spec2", "dflash2")])
def test_dflash_converts_as_written_and_loads_beside_its_target(request, target_gguf, name, variant):
    run = request.getfixturevalue(name)
    assert run.res.commit == CONVERTER_COMMIT and run.res.out.read_bytes()[:4] == b"GGUF"
    assert "Model successfully exported" in run.res.log
    t = gguf_tensors(run.res.out)
    # no mask_embedding.pt bridge: the converter leaves out the target's tables, which are lent at run time
    assert not set(BOTH) & set(t) and run.res.borrows == BOTH
    np.testing.assert_array_equal(t["fc.weight"], tensor(run.hf_dir, "fc.weight"))
    m = load(run.res.out)
    try:
        assert m.borrows == BOTH   # its metadata reads alone; computing needs the target
    finally:
        m.close()
    with pytest.raises(GGUFModelError, match="has no 'token_embd.weight': it borrows the target model's"):
        Session(run.res.out)
    m = load(run.res.out, target=target_gguf)
    try:
        assert m.variant == variant
        # z-lab stores [1, 4] (ids - 1), speculators [2, 5]; both are GGUF layers [2, 5]
        assert m.hparams.block_size == 8 and m.hparams.target_layers == [2, 5]
        assert m.hparams.mask_token_id == MASK and m.hparams.n_vocab == LAYER["vocab_size"]
        if variant == "dflash2":
            assert (m.hparams.conv_kernel_size, m.hparams.conv_group_size) == (2, 16)
            assert (m.hparams.selector_rank, m.hparams.selector_top_k) == (8, 4)
    finally:
        m.close()
    assert not any("mask_embedding" in w for w in run.warned)
    assert run.res.warnings == run.warned and all(w.startswith("warning: ") for w in run.warned)
    speculators = name.startswith("spec")
    assert any("speculators' " in w and "flattened copy" in w for w in run.warned) == speculators
    assert run.res.beside_line().endswith(f"runs beside its target, which lends them (graphgen draft -m "
                                          f"{run.res.target_out or 'TARGET.gguf'} -md {run.res.out})")


def test_target_gguf_is_the_converters_target(zlab, spark_full, target, tied_target):
    """The target folder through the same converter: a Qwen3 GGUF, whose b11739 graph publishes
    layer inputs, holding the tables the authors' drafts use."""
    for run, folder, tied in ((zlab, target, False), (spark_full, tied_target, True)):
        assert run.res.target_arch == "qwen3" and "qwen3" in LAYER_INPUT_ARCHS
        assert "Model successfully exported" in run.res.target_log
        t = gguf_tensors(run.res.target_out)
        np.testing.assert_array_equal(t["token_embd.weight"], tensor(folder, "model.embed_tokens.weight"))
        if tied:
            assert "output.weight" not in t  # llama.cpp's loader ties it to token_embd
        else:
            np.testing.assert_array_equal(t["output.weight"], tensor(folder, "lm_head.weight"))


def _beside(work: Path, run: "Run", target_gguf: Path, name: str, n_seq: int = 1):
    """graphgen and b11739 on one drafting round beside the target; the graphgen dump folder."""
    from graphgen.compare.pairing import diff_paths
    from graphgen.compare.report import exit_code
    from graphgen.play.engine import run_scenario
    from graphgen.reference.runner import run_reference
    from graphgen.play.scenario import parse_scenario
    doc = {"n_ctx": 64, "n_ubatch": 32, "flash_attn": "off", "type_kv": "f32", "seed": 1,
           "target": str(target_gguf),
           "steps": [{"inject": {"n_tokens": 4, "pos0": 0}}, {"block": {"tokens": [7] + [MASK] * 7, "pos0": 4}}]}
    sc_path = work / f"{name}.beside.json"
    sc_path.write_text(json.dumps(doc))
    dirs = {k: work / f"{name}-beside-{k}" for k in ("llama.cpp", "graphgen")}
    run_reference(run.res.out, sc_path, dirs["llama.cpp"], 262144, stderr_log=None)
    run_scenario(run.res.out, parse_scenario(doc), dirs["graphgen"], scenario_path=sc_path)
    assert exit_code(diff_paths(dirs["llama.cpp"], dirs["graphgen"])) == 0


@pytest.mark.parametrize("name, target_name", [("zlab2", "target_gguf"), ("spark_d2t", "target_gguf"),
                                               ("spark_full", None)])
def test_runs_beside_its_target_as_b11739_does(request, work, name, target_name):
    run = request.getfixturevalue(name)
    target_gguf = request.getfixturevalue(target_name) if target_name else run.res.target_out
    n_in = LAYER["hidden_size"] * 2
    features = np.random.default_rng(0).standard_normal((4, n_in), dtype=np.float32)
    with Session(run.res.out, target=target_gguf, n_ctx=64, type_kv="f32") as sess:
        sess.inject(features, 0)
        logits = sess.block([7] + [MASK] * 7, 4).logits
    assert logits.shape == (8, LAYER["vocab_size"])
    # a draft vocabulary scatters to the target's ids (-inf elsewhere); the others are finite
    finite = np.isfinite(logits).sum(-1)
    assert (finite == (64 if name == "spark_d2t" else LAYER["vocab_size"])).all()
    _beside(work, run, target_gguf, name)


def test_dflash2_selector_codebooks_keep_their_values(zlab2, spec2):
    # z-lab saves the codebooks as Embedding weights ('...codebook.weight'), speculators as bare
    # Parameters ('...codebook'); the converter maps both (and writes the conv bases without '.weight')
    for run, suffix in ((zlab2, ".weight"), (spec2, "")):
        t = gguf_tensors(run.res.out)
        np.testing.assert_array_equal(t["selector_predecessor.weight"],
                                      tensor(run.hf_dir, "candidate_selector.predecessor_codebook" + suffix))
        np.testing.assert_array_equal(t["blk.1.ffn_conv_base"],
                                      tensor(run.hf_dir, "layers.1.mlp_conv.base_kernel"))


def test_full_vocab_dspark_borrows_the_targets_head(spark_full):
    # the converter drops its lm head (speculators' is the target's own, frozen and never saved):
    # the target lends it, here its embeddings, to which it ties its head
    t = gguf_tensors(spark_full.res.out)
    assert not set(BOTH) & set(t) and spark_full.res.borrows == BOTH
    assert "markov_w1.weight" in t and "d2t" not in t
    assert not any("full-vocabulary" in w for w in spark_full.warned)
    m = load(spark_full.res.out, target=spark_full.res.target_out)
    try:
        assert m.variant == "dspark" and m.lender.picks["output"].name == "token_embd.weight"
    finally:
        m.close()


def test_draft_vocabulary_dspark_keeps_its_head_and_d2t(spark_d2t):
    m = load(spark_d2t.res.out)
    try:
        assert m.variant == "dspark" and m.hparams.target_layers == [2, 5] and m.hparams.block_size == 8
    finally:
        m.close()
    t = gguf_tensors(spark_d2t.res.out)
    d2t = tensor(spark_d2t.hf_dir, "d2t")
    # the converter writes d2t as absolute target ids (speculators stores offsets)
    np.testing.assert_array_equal(t["d2t"], d2t + np.arange(64))
    np.testing.assert_array_equal(t["output.weight"], tensor(spark_d2t.hf_dir, "lm_head.weight"))
    # its own head stays; the embeddings are the target's, lent at run time
    assert "token_embd.weight" not in t and spark_d2t.res.borrows == ["token_embd.weight"]
    assert spark_d2t.res.beside_line().startswith(f"{spark_d2t.res.out} has no token embeddings of its own: ")
    assert not spark_d2t.warned


def test_own_mask_embedding_is_used_as_it_is(work, zlab, target):
    # a checkpoint that ships its own mask vector (MiMo's): the converter writes the target's tables
    # with that row, and the draft needs no lender
    folder = _copy(zlab.hf_dir, work / "zlab-mask")
    vec = torch.full((LAYER["hidden_size"],), 0.5)
    torch.save({"mask_token_id": MASK, "embedding": vec}, folder / "mask_embedding.pt")
    run = Run(work, folder, target)
    assert not run.warned and run.res.borrows == [] and run.res.beside_line() is None
    m = load(run.res.out)
    assert m.borrows == []
    m.close()
    emb = gguf_tensors(run.res.out)["token_embd.weight"]
    np.testing.assert_array_equal(emb[MASK], vec.numpy())
    np.testing.assert_array_equal(np.delete(emb, MASK, 0),
                                  np.delete(tensor(target, "model.embed_tokens.weight"), MASK, 0))


def test_cli_converts_and_says_it_runs_beside_its_target(work, zlab, target, capsys, monkeypatch):
    import graphgen.authors.convert as mod
    staged = []
    real_stage = mod._stage

    def stage(folder, hf_dir, plan):
        real_stage(folder, hf_dir, plan)
        staged.extend(p.name for p in folder.iterdir())
    monkeypatch.setattr(mod, "_stage", stage)
    out, tgt = work / "cli.gguf", work / "cli-target.gguf"
    assert main(["convert", str(zlab.hf_dir), str(out), "--target", str(target), "--outtype", "q8_0",
                 "--target-gguf", str(tgt)]) == 0
    cap = capsys.readouterr()
    # the checkpoint's own files, nothing added
    assert sorted(staged) == sorted(p.name for p in zlab.hf_dir.iterdir()) and "mask_embedding.pt" not in staged
    n = len(GGUFReader(out).tensors)
    lines = cap.out.splitlines()
    assert lines[0].startswith(f"converted {zlab.hf_dir} -> {out} (llama.cpp converter {CONVERTER_COMMIT}, "
                               f"{n} tensors, ")
    assert lines[1:] == [f"converted its target -> {tgt} (qwen3)",
                         f"{out} has no token embeddings or lm head of its own: it runs beside its target, which "
                         f"lends them (graphgen draft -m {tgt} -md {out})"]
    assert cap.err == ""
    load(out, target=tgt).close()
    # without --target-gguf the line names a target to give
    assert main(["convert", str(zlab.hf_dir), str(out), "--target", str(target), "--force"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith(f"(graphgen draft -m TARGET.gguf -md {out})")


def test_target_gguf_refusals_keep_both_outputs(work, zlab, target):
    out = work / "pair.gguf"
    with pytest.raises(ConvertError, match="the target's GGUF and the draft's are one file"):
        convert(zlab.hf_dir, out, target_dir=target, target_gguf=out, warn=None)
    notes = work / "pair-notes.gguf"
    notes.write_text("not a model")
    with pytest.raises(ConvertError, match=r"pair-notes\.gguf: exists and is not a GGUF file"):
        convert(zlab.hf_dir, out, target_dir=target, target_gguf=notes, warn=None)
    assert notes.read_text() == "not a model" and not out.exists()
    # a target the converter cannot take: neither file is written
    bad = _copy(target, work / "target-bogus")
    tensors = load_file(bad / "model.safetensors")
    tensors["bogus.weight"] = torch.zeros(4, 4)
    save_file(tensors, bad / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConvertError, match=r"target-bogus: llama.cpp's converter \(\w+\) failed on the target: "):
        convert(zlab.hf_dir, out, target_dir=bad, target_gguf=work / "pair-target.gguf", warn=None)
    assert not out.exists() and not (work / "pair-target.gguf").exists()
    assert not list(work.glob(".pair*"))


def test_upstream_alone_refuses_speculators_dflash(spec):
    # the gap the flattened copy bridges; a converter that reads them would make the warning wrong
    tree = converter_tree()
    env = {**os.environ, "PYTHONPATH": str(tree / "gguf-py"), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, str(tree / "convert_hf_to_gguf.py"), str(spec.hf_dir), "--outfile",
                           str(spec.hf_dir.parent / "upstream.gguf"), "--target-model-dir", str(spec.target)],
                          cwd=tree, env=env, capture_output=True, text=True)
    assert proc.returncode != 0 and "KeyError" in proc.stderr and "num_hidden_layers" in proc.stderr


# --- refusals -----------------------------------------------------------------------------------

def test_draft_vocabulary_dflash_is_refused(work, target):
    folder = make_speculators(work / "spec-d2t", target, "dflash", draft_vocab=64)
    with pytest.raises(ConvertError, match=r"config\.json: key 'draft_vocab_size' = 64 .*d2t only for DSpark"):
        convert(folder, work / "d2t.gguf", target_dir=target, warn=None)
    assert not (work / "d2t.gguf").exists()


def test_speculators_dflash_sampling_from_the_anchor_is_refused(work, spec):
    folder = _edit_config(_copy(spec.hf_dir, work / "spec-anchor"), sample_from_anchor=True)
    with pytest.raises(ConvertError, match=r"key 'sample_from_anchor' is true"):
        convert(folder, work / "anchor.gguf", target_dir=spec.target, warn=None)


@pytest.mark.parametrize("change, match", [
    (dict(architectures=["LlamaForCausalLM"]), r"key 'architectures' = \['LlamaForCausalLM'\]"),
    (dict(architectures=None), r"config\.json: missing key 'architectures'"),
    (dict(dflash_config={"block_size": 8, "target_layer_ids": [1, 4]}), r"key 'dflash_config\.mask_token_id' = None"),
])
def test_unknown_or_incomplete_configs_are_refused(work, zlab, change, match):
    folder = _edit_config(_copy(zlab.hf_dir, work / "zlab-edit"), **change)
    with pytest.raises(ConvertError, match=match):
        convert(folder, work / "edit.gguf", target_dir=zlab.target, warn=None)


def test_missing_files_are_named(work, zlab, target):
    folder = _copy(zlab.hf_dir, work / "zlab-noconfig")
    (folder / "config.json").unlink()
    with pytest.raises(ConvertError, match=r"zlab-noconfig: no config\.json: not a HuggingFace checkpoint folder"):
        convert(folder, work / "x.gguf", target_dir=target, warn=None)
    with pytest.raises(ConvertError, match=r"--target-model-dir.*zlab/target does not exist"):
        convert(zlab.hf_dir, work / "x.gguf", warn=None)
    no_tok = _copy(target, work / "target-notok")
    (no_tok / "tokenizer.model").unlink()
    with pytest.raises(ConvertError, match=r"target-notok: no tokenizer\.model or tokenizer\.json"):
        convert(zlab.hf_dir, work / "x.gguf", target_dir=no_tok, warn=None)
    no_cfg = _copy(target, work / "target-nocfg")
    (no_cfg / "config.json").unlink()
    with pytest.raises(ConvertError, match=r"target-nocfg/config\.json: no such file"):
        convert(zlab.hf_dir, work / "x.gguf", target_dir=no_cfg, warn=None)


def test_default_target_is_the_folder_inside(work, zlab, target):
    folder = _copy(zlab.hf_dir, work / "zlab-inner")
    inner = _copy(target, folder / "target")
    (inner / "tokenizer.model").unlink()
    with pytest.raises(ConvertError, match=r"zlab-inner/target: no tokenizer\.model"):
        convert(folder, work / "inner.gguf", warn=None)


# --- output safety ------------------------------------------------------------------------------

def test_non_gguf_out_is_refused_without_force(work, zlab, target):
    out = work / "notes.gguf"
    out.write_text("not a model")
    with pytest.raises(ConvertError, match=r"notes\.gguf: exists and is not a GGUF file; pass --force"):
        convert(zlab.hf_dir, out, target_dir=target, warn=None)
    assert out.read_text() == "not a model"
    assert main(["convert", str(zlab.hf_dir), str(out), "--target", str(target)]) == 2
    assert out.read_text() == "not a model"


def test_failed_conversion_keeps_out_and_leaves_no_temp_file(work, zlab, target, capsys):
    folder = _copy(zlab.hf_dir, work / "zlab-bogus")
    tensors = load_file(folder / "model.safetensors")
    tensors["bogus.weight"] = torch.zeros(4, 4)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    out = work / "keep.gguf"
    shutil.copy(zlab.res.out, out)
    before = out.read_bytes()
    with pytest.raises(ConvertError) as e:
        convert(folder, out, target_dir=target, warn=None)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{folder}: llama.cpp's converter ({CONVERTER_COMMIT}) failed: ")
    assert msg.endswith("ValueError: Can not map tensor 'model.bogus.weight'")
    assert out.read_bytes() == before
    assert sorted(p.name for p in work.glob(".keep.gguf.*")) == []
    # the command line says the same in one line and exits 2
    assert main(["convert", str(folder), str(out), "--target", str(target)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("graphgen: error: ") and "Can not map tensor" in err[-1]
    assert out.read_bytes() == before


def test_missing_torch_names_the_extra(work, zlab, target, monkeypatch, capsys):
    import importlib.util

    import graphgen.authors.convert as mod
    real = importlib.util.find_spec
    monkeypatch.setattr(mod.importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    assert main(["convert", str(zlab.hf_dir), str(work / "t.gguf"), "--target", str(target)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "graphgen[torch]" in err[0] and "missing torch" in err[0]


# --- settings b11739 cannot honour: each refused in one line naming its key ------------------------
# drawn by graphgen's own make-model --format hf, as a user would make them

@pytest.mark.parametrize("flags, key", [
    (["--variant", "dflash2", "--rope-scaling", "yarn", "--yarn-beta-fast", "8"], "'rope_parameters.beta_fast' = 8.0"),
    (["--variant", "dflash", "--rope-scaling", "yarn", "--yarn-beta-slow", "2"], "'rope_parameters.beta_slow' = 2.0"),
    (["--variant", "dflash", "--rope-scaling", "yarn", "--yarn-attn-factor", "0.7"],
     "'rope_parameters.attention_factor' = 0.7"),
    (["--variant", "dflash", "--logit-scale", "1.5"], "'dflash_config.output_multiplier' = 1.5"),
    (["--variant", "dflash", "--final-softcap", "4"], "'dflash_config.final_logit_softcapping' = 4.0"),
    (["--variant", "dflash2", "--authors", "speculators", "--logit-scale", "1.5"], "'output_multiplier' = 1.5"),
    (["--variant", "dspark", "--conf", "--conf-markov", "false"], "'confidence_head_with_markov' = False"),
    (["--variant", "dflash", "--attention-bias"], "'attention_bias' = True"),
    (["--variant", "dflash", "--hidden-act", "gelu"], "'hidden_act' = 'gelu'"),
])
def test_departures_are_refused_naming_the_key(work, flags, key, capsys):
    from graphgen.cli import main
    folder = work / ("dep-" + "-".join(f.strip("-") for f in flags))
    assert main(["make-model", str(folder), "--format", "hf", *flags]) == 0
    capsys.readouterr()
    out = work / "dep.gguf"
    assert main(["convert", str(folder), str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"key {key}" in err[0] and "config.json" in err[0], err
    assert not out.exists()


@pytest.mark.parametrize("flags", [
    # transformers' defaults written out, and settings b11739 honours
    ["--variant", "dflash", "--rope-scaling", "yarn", "--yarn-beta-fast", "32", "--yarn-beta-slow", "1"],
    ["--variant", "dflash", "--embedding-scale", "1.3"],
    ["--variant", "dflash2", "--logit-scale", "1.7", "--final-softcap", "3"],
    ["--variant", "dflash", "--authors", "speculators", "--logit-scale", "1.7"],  # neither side applies it
])
def test_settings_both_sides_honour_convert(work, flags, capsys):
    from graphgen.cli import main
    folder = work / ("ok-" + "-".join(f.strip("-") for f in flags))
    assert main(["make-model", str(folder), "--format", "hf", *flags]) == 0
    assert main(["convert", str(folder), str(work / "ok.gguf"), "--force"]) == 0


def test_hf_only_flags_are_refused_for_a_gguf(tmp_path, capsys):
    from graphgen.cli import main
    assert main(["make-model", str(tmp_path / "d.gguf"), "--conf-markov", "false"]) == 2
    assert "--conf-markov is a setting of the authors' formats" in capsys.readouterr().err
    assert not (tmp_path / "d.gguf").exists()


# --- one checker of checkpoints: the same bad folder, the same line, from every command ----------

def _truncate(folder):
    f = folder / "model.safetensors"
    with open(f, "r+b") as fh:
        fh.truncate(f.stat().st_size // 2)


@pytest.mark.parametrize("edit, message", [
    (lambda d: _edit_config(d, architectures=["LlamaForCausalLM"]),
     "config.json: key 'architectures' = ['LlamaForCausalLM'] is not a DFlash-family draft"),
    (lambda d: _edit_config(d, hidden_size=96), "model.safetensors: tensor 'fc.weight' has shape [64, 128], "),
    (_truncate, "model.safetensors: truncated safetensors file: its tensors need"),
    (lambda d: (d / "model.safetensors").write_bytes(b"\x10"), "model.safetensors: truncated safetensors file"),
    (lambda d: (d / "config.json").write_text("[1]"), "config.json: expected a JSON object"),
    (lambda d: shutil.rmtree(d), "bad: no such file or folder"),
])
def test_every_command_says_the_same_of_a_bad_checkpoint(work, zlab, tmp_path, capsys, edit, message):
    from graphgen.cli import main
    bad = _copy(zlab.hf_dir, tmp_path / "bad")
    edit(bad)
    sc = tmp_path / "s.json"
    sc.write_text(json.dumps({"steps": [{"inject": {"n_tokens": 2, "pos0": 0}}]}))
    lines = []
    for argv in (["convert", "bad", str(tmp_path / "o.gguf"), "--target", str(zlab.target)],
                 ["check", "bad", "--target", str(zlab.target)],
                 ["check", "bad", "-m", str(zlab.res.target_out)],
                 ["dump", "bad", "--engine", "torch", "--scenario", str(sc), "--out", str(tmp_path / "out")],
                 ["info", "bad"]):
        cwd = os.getcwd()
        os.chdir(tmp_path)   # the folder named as the user typed it
        try:
            code = main(argv)
        finally:
            os.chdir(cwd)
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and message in err[0] and err[0].startswith("graphgen: error: bad"), \
            (argv, err)
        lines.append(err[0])
    assert len(set(lines)) == 1, lines
    assert not (tmp_path / "o.gguf").exists() and not (tmp_path / "out").exists()


def test_unwritable_places_are_named(zlab, capsys):
    from graphgen.cli import main
    # /proc takes no new files, even from root
    assert main(["convert", str(zlab.hf_dir), "/proc/graphgen.gguf", "--target", str(zlab.target)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("graphgen: error: /proc/graphgen.gguf: cannot write")
    assert main(["make-model", "/proc/graphgen-ck", "--format", "hf"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["graphgen: error: /proc/graphgen-ck: cannot write here (No such file or directory)"], err


def test_info_reads_a_checkpoint_folder(zlab, capsys):
    from graphgen.cli import main
    assert main(["info", str(zlab.hf_dir), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["format"] == "z-lab DFlash (DFlashDraftModel)" and doc["config"]["hidden_size"] == 64
    names = {t["name"]: t["shape"] for t in doc["tensors"]}
    assert names["fc.weight"] == [64, 128]


def test_make_model_hf_prints_its_line_alone(tmp_path, capfd):
    """transformers' "Writing model shards" bars stay off stderr, --quiet or not."""
    from graphgen.cli import main
    assert main(["make-model", str(tmp_path / "ck"), "--format", "hf"]) == 0
    out, err = capfd.readouterr()
    assert out.strip().startswith(f"wrote {tmp_path / 'ck'}: z-lab DFlash (DFlashDraftModel)")
    assert "Writing model shards" not in err and "it/s" not in err, err
