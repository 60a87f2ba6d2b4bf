"""Random-weight checkpoints in the draft authors' own formats, with a small target beside them.

`make_hf(out_dir, HFSpec(...))` writes what the authors publish, made by their own classes and
saved with their own `save_pretrained`, so their `from_pretrained` loads it and llama.cpp's
converter reads it as it reads a real draft:

    OUT_DIR/config.json, model.safetensors      the draft (z-lab DFlash / DFlash2, or speculators
                                                DFlash / DFlash2 / DSpark)
    OUT_DIR/target/config.json, model.safetensors, tokenizer.model
                                                a tiny Qwen3 target: the embeddings and lm head the
                                                drafts share, a layer beyond the deepest target
                                                layer, and a sentencepiece tokenizer that the
                                                converter pads to the vocabulary; converted by the
                                                same converter, it is the GGUF the draft runs beside

Target layers are given as the GGUF counts them (1-based, `--target-layers` of GGUF drafts):
z-lab stores them minus one (`target_layer_ids`), speculators as they are
(`aux_hidden_state_layer_ids`), and the converter maps both back.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..models.arch import HEADS
from . import AuthorsError, require_torch
from .folder import AUTHORS, CLASSES, HF_VARIANTS, authors_class

_AUTHORS_NAMES = {"zlab": "z-lab", "speculators": "speculators"}


def label(authors: str, variant: str) -> str:
    """How every command names an authors' class: 'speculators DSpark (DSparkDraftModel)'."""
    return f"{_AUTHORS_NAMES[authors]} {HEADS[variant].title} ({CLASSES[(authors, variant)]})"


@dataclass
class HFSpec:
    variant: str = "dflash"
    authors: str | None = None          # zlab for DFlash / DFlash2, speculators for DSpark
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_ff: int = 128
    n_vocab: int = 256
    block_size: int = 8
    target_layers: list[int] = field(default_factory=lambda: [2, 5])
    n_target_layers: int | None = None  # layers of the target; default: one beyond max(target_layers)
    mask_token_id: int | None = None    # default: the last token
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None    # HF rope_parameters beyond the base: {"rope_type": "linear", "factor": 2}
    rms_eps: float = 1e-6
    seed: int = 0
    causal: bool | None = None
    swa_window: int | None = None
    swa_pattern: list[int] | None = None  # 1 = sliding layer
    # DFlash2
    conv_kernel: int = 2
    conv_group: int = 16
    selector_rank: int = 16
    selector_top_k: int = 4
    codebook_std: float = 2.0           # large enough that the selector's path leaves the argmax
    # DSpark
    markov_rank: int = 16
    conf: bool = True
    sample_from_anchor: bool = True
    d2t_vocab: int | None = None        # a reduced draft vocabulary with its d2t map
    tie_target: bool = False            # the target's lm head is its embedding table
    # settings of the authors' configs that b11739 cannot honour (the converter refuses them; the
    # docs/authors.md's converter gaps): drawn so that a test can show each refusal
    output_multiplier: float | None = None        # z-lab's compute_logits (dflash_config)
    final_logit_softcapping: float | None = None  # z-lab's compute_logits (dflash_config)
    input_embedding_scale: float | None = None    # z-lab's block embeddings (dflash_config)
    conf_with_markov: bool = True       # speculators DSpark: confidence_head_with_markov
    attention_bias: bool = False
    hidden_act: str = "silu"

    def resolved(self) -> HFSpec:
        s = HFSpec(**asdict(self))
        if s.variant not in HF_VARIANTS:
            raise AuthorsError(f"--variant {s.variant}: the authors' formats have {', '.join(HF_VARIANTS)}")
        head = HEADS[s.variant]
        if s.authors is None:
            s.authors = head.authors[0]
        if s.authors not in AUTHORS:
            raise AuthorsError(f"--authors {s.authors}: expected one of {', '.join(AUTHORS)}")
        if (s.authors, s.variant) not in CLASSES:
            raise AuthorsError(f"--authors {s.authors} has no {s.variant} model (z-lab's dflash package "
                               "has DFlash and DFlash2; speculators has all three)")
        if s.mask_token_id is None:
            s.mask_token_id = s.n_vocab - 1
        if not s.target_layers or min(s.target_layers) < 1:
            raise AuthorsError(f"--target-layers {s.target_layers}: 1-based target layers, at least one")
        if s.n_target_layers is None:
            # one beyond the deepest: b11739 publishes each layer's input, never the last layer's
            # output, so a real speculative loop reads target layer N from layer N's input
            s.n_target_layers = max(s.target_layers) + 1
        if max(s.target_layers) > s.n_target_layers:
            raise AuthorsError(f"--target-layers {s.target_layers}: the target has {s.n_target_layers} layers")
        if s.n_head % s.n_head_kv:
            raise AuthorsError(f"--heads {s.n_head} is not a multiple of --heads-kv {s.n_head_kv}")
        if head.selector and s.n_embd % s.conv_group:
            raise AuthorsError(f"--conv-group {s.conv_group} does not divide --n-embd {s.n_embd}")
        if s.d2t_vocab is not None and not head.draft_vocab:
            raise AuthorsError("--d2t-vocab: only the speculators DSpark format carries a draft vocabulary here")
        if s.d2t_vocab is not None and not 0 < s.d2t_vocab <= s.n_vocab:
            raise AuthorsError(f"--d2t-vocab {s.d2t_vocab} must be in 1..{s.n_vocab}")
        if s.swa_pattern is not None and len(s.swa_pattern) != s.n_layer:
            raise AuthorsError(f"--swa-pattern has {len(s.swa_pattern)} entries for {s.n_layer} layers")
        if s.swa_pattern is not None and any(s.swa_pattern) and not s.swa_window:
            raise AuthorsError("--swa-pattern needs --swa-window")
        if not s.conf_with_markov and not head.confidence:
            raise AuthorsError("--conf-markov: only the speculators DSpark format has a confidence head")
        return s

    @property
    def class_name(self) -> str:
        return CLASSES[(self.authors, self.variant)]


def _qwen3_config_kwargs(s: HFSpec, n_layers: int) -> dict:
    kw = dict(hidden_size=s.n_embd, intermediate_size=s.n_ff, num_hidden_layers=n_layers,
              num_attention_heads=s.n_head, num_key_value_heads=s.n_head_kv, head_dim=s.head_dim,
              vocab_size=s.n_vocab, rms_norm_eps=s.rms_eps, max_position_embeddings=4096,
              rope_parameters={"rope_type": "default", **(s.rope_scaling or {}), "rope_theta": s.rope_theta})
    return kw


def _output_settings(s: HFSpec) -> dict:
    return {k: v for k, v in (("output_multiplier", s.output_multiplier),
                              ("final_logit_softcapping", s.final_logit_softcapping),
                              ("input_embedding_scale", s.input_embedding_scale)) if v is not None}


def _layer_settings(s: HFSpec) -> dict:
    return {"attention_bias": s.attention_bias, "hidden_act": s.hidden_act}


def _layer_types(s: HFSpec) -> dict:
    if not s.swa_pattern or not any(s.swa_pattern):
        return {}
    return {"layer_types": ["sliding_attention" if w else "full_attention" for w in s.swa_pattern],
            "sliding_window": s.swa_window, "use_sliding_window": True}


def _reinit(model, seed: int, codebook_std: float) -> None:
    """Draw every parameter from a seeded generator, so one seed gives one checkpoint whatever the
    authors' own init does, and norms and codebooks are not left at their identity init."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if name.endswith("norm.weight"):
                val = 1.0 + 0.1 * torch.randn(p.shape, generator=gen)
            elif "codebook" in name:
                val = codebook_std * torch.randn(p.shape, generator=gen)
            elif name.endswith(".bias"):
                val = 0.1 * torch.randn(p.shape, generator=gen)
            elif "embed_tokens" in name or "markov_w1" in name:
                val = torch.randn(p.shape, generator=gen)
            elif "base_kernel" in name:
                val = 0.5 * torch.randn(p.shape, generator=gen)
            else:  # a projection: keep activations of order one through the layers
                fan_in = p.shape[-1] if p.dim() > 1 else p.shape[0]
                val = torch.randn(p.shape, generator=gen) / math.sqrt(fan_in)
            p.copy_(val.to(p.dtype))


_TOKENIZER_TEXT = """the draft proposes a block of tokens and the target checks them all at once
a small model guesses what a large model would say next
speculative decoding keeps the target's distribution while it runs faster
every accepted token saves one step of the large model
"""


def _write_tokenizer(folder: Path) -> None:
    import sentencepiece as spm
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "text.txt"
        text.write_text(_TOKENIZER_TEXT * 4)
        spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(Path(tmp) / "tok"), vocab_size=40,
                                       model_type="unigram", minloglevel=2, bos_id=1, eos_id=2, unk_id=0,
                                       pad_id=-1)
        shutil.copy(Path(tmp) / "tok.model", folder / "tokenizer.model")


def _write_target(folder: Path, s: HFSpec) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    folder.mkdir(parents=True)
    cfg = Qwen3Config(**_qwen3_config_kwargs(s, s.n_target_layers), tie_word_embeddings=bool(s.tie_target),
                      bos_token_id=1, eos_token_id=2)
    torch.manual_seed(s.seed)
    target = Qwen3ForCausalLM(cfg)
    _reinit(target, s.seed + 1, 1.0)
    if s.tie_target:
        target.tie_weights()
    target.save_pretrained(folder)
    _write_tokenizer(folder)


def _zlab_model(s: HFSpec):
    from transformers import Qwen3Config
    import dflash.model as zm
    dflash_config = {"mask_token_id": s.mask_token_id, "block_size": s.block_size,
                     "target_layer_ids": [t - 1 for t in s.target_layers], **_output_settings(s)}
    if HEADS[s.variant].selector:
        dflash_config.update(conv_kernel_size=s.conv_kernel, conv_group_size=s.conv_group,
                             selector_rank=s.selector_rank, selector_top_k=s.selector_top_k)
    extra = {} if s.causal is None else {"is_causal": s.causal}
    cfg = Qwen3Config(**_qwen3_config_kwargs(s, s.n_layer), **_layer_types(s), **extra, **_layer_settings(s),
                      num_target_layers=s.n_target_layers, dflash_config=dflash_config,
                      architectures=[s.class_name])
    return getattr(zm, CLASSES[("zlab", s.variant)])(cfg)


def _speculators_model(s: HFSpec, target_dir: Path):
    import torch
    from transformers import Qwen3Config
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    tl = Qwen3Config(**_qwen3_config_kwargs(s, s.n_layer), **_layer_types(s), **_layer_settings(s))
    # the authors' inference runs without flex attention's compiled masks (CPU, no torch.compile)
    tl._attn_implementation = "sdpa"
    sample_from_anchor = s.sample_from_anchor if HEADS[s.variant].anchor_row else False
    common = dict(transformer_layer_config=tl, draft_vocab_size=s.d2t_vocab or s.n_vocab,
                  block_size=s.block_size, aux_hidden_state_layer_ids=list(s.target_layers),
                  mask_token_id=s.mask_token_id, sample_from_anchor=sample_from_anchor,
                  speculators_config=SpeculatorsConfig(
                      algorithm=s.variant,
                      proposal_methods=[GreedyTokenProposalConfig(
                          speculative_tokens=s.block_size if sample_from_anchor else s.block_size - 1)],
                      default_proposal_method="greedy",
                      verifier=VerifierConfig.from_pretrained(str(target_dir))))
    # speculators' config class per head, with what the head adds to it
    import importlib
    head = HEADS[s.variant]
    config_class = getattr(importlib.import_module(f"speculators.models.{s.variant}.config"),
                           f"{head.title}SpeculatorConfig")
    extra = {}
    if head.markov:
        extra = dict(markov_rank=s.markov_rank, enable_confidence_head=s.conf,
                     confidence_head_with_markov=s.conf_with_markov)
    elif head.selector:
        extra = dict(conv_kernel_size=s.conv_kernel, conv_group_size=s.conv_group,
                     selector_rank=s.selector_rank, selector_top_k=s.selector_top_k)
    model = authors_class("speculators", s.variant)(config_class(**common, **extra))
    if s.d2t_vocab is not None and s.d2t_vocab < s.n_vocab:
        gen = torch.Generator().manual_seed(s.seed + 2)
        # the draft vocabulary: a sorted random subset of the target's; d2t holds offsets
        ids = torch.sort(torch.randperm(s.n_vocab, generator=gen)[:s.d2t_vocab]).values
        t2d = torch.zeros(s.n_vocab, dtype=torch.bool)
        t2d[ids] = True
        model.load_vocab_mappings(t2d, ids - torch.arange(s.d2t_vocab))
    return model


def make_hf(out_dir: str | os.PathLike, spec: HFSpec, force: bool = False) -> Path:
    """Write a draft checkpoint in the authors' format and its target into `out_dir` (a new folder,
    or with `force` one that holds an earlier such checkpoint). Written under a temporary name and
    renamed at the end, so an interrupted run leaves nothing that looks complete."""
    require_torch()
    from . import quiet_transformers
    quiet_transformers()  # no "Writing model shards" bars: graphgen says what it wrote
    s = spec.resolved()
    out = Path(out_dir)
    if out.exists():
        if not out.is_dir():
            raise AuthorsError(f"{out}: exists and is not a folder")
        marker = out / "graphgen-hf.json"
        if any(out.iterdir()) and not (force and marker.exists()):
            raise AuthorsError(f"{out}: folder is not empty" + ("" if marker.exists() else
                               " and holds no graphgen checkpoint") + "; pick a new folder"
                               + (" or pass --force" if marker.exists() else ""))
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as e:
        raise AuthorsError(f"{out}: cannot write here ({e.strerror or e})") from None
    try:
        import torch
        _write_target(tmp / "target", s)
        torch.manual_seed(s.seed)
        if s.authors == "zlab":
            model = _zlab_model(s)
        else:
            model = _speculators_model(s, tmp / "target")
        _reinit(model, s.seed, s.codebook_std)
        model.save_pretrained(tmp)
        if s.authors == "speculators":
            # name the verifier by the folder's final place, not the temporary one
            cfg_path = tmp / "config.json"
            cfg = json.loads(cfg_path.read_text())
            name_verifier(cfg, (out / "target").resolve())
            # speculators' classes have no field for these: written as a config key, as a hand-edited
            # checkpoint would carry it (the converter reads it)
            cfg.update(_output_settings(s))
            cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
        (tmp / "graphgen-hf.json").write_text(json.dumps({"spec": asdict(s), "class": s.class_name}, indent=1) + "\n")
        for p in [tmp, *tmp.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def name_verifier(cfg: dict, target: Path) -> None:
    """A speculators config names its verifier by path: set it to `target` (the folder's final
    place, not the one it was written in). Other configs have no verifier to name."""
    ver = cfg.get("speculators_config", {}).get("verifier", {})
    if "name_or_path" in ver:
        ver["name_or_path"] = str(target)


def read_marker(folder: str | os.PathLike) -> dict | None:
    """The spec a graphgen-made checkpoint was written from, or None for anyone else's."""
    try:
        return json.loads((Path(folder) / "graphgen-hf.json").read_text())
    except (OSError, ValueError):
        return None
