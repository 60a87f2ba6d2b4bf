"""A target and a draft: can they run together, before b11739 could abort on them?

`target_info` reads what a draft needs of its target from the target GGUF: architecture, width,
depth, vocabulary. `check_pair` says, one line per problem naming both files, what keeps the pair
from running: an architecture that publishes no layer inputs (b11739 asserts "layer input tensor is
null" on the first decode), a target layer out of range, an fc input width that is not the target
layers times the target's width, a vocabulary, mask token or special token that differs, a draft
without embeddings or lm head facing a target whose own do not fit.

Target layers are layer-input indices as llama.cpp's converter writes them (`dflash.target_layers`
= the authors' `target_layer_ids` + 1: the input of layer il is the output of layer il - 1); b11739
publishes the inputs of layers 0..n_layer-1, so the authors' ids run from -1 to n_layer - 2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .errors import GGUFModelError
from .ggufile import field_value, open_reader
from .reference.target import LAYER_INPUT_ARCHS

TOKENIZER_PREFIX = "tokenizer."


@dataclass
class TargetInfo:
    path: Path
    arch: str
    n_embd: int
    n_layer: int
    n_vocab: int
    tokens: list = field(repr=False, default_factory=list)
    special: dict = field(default_factory=dict)    # bos / eos / unk / pad / mask -> id (absent ones left out)
    tensors: dict = field(repr=False, default_factory=dict)   # name -> ggml shape

    @property
    def publishes_layer_inputs(self) -> bool:
        return self.arch in LAYER_INPUT_ARCHS


SPECIAL_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id",
                "pad": "padding_token_id", "mask": "mask_token_id"}


def _special(reader) -> dict:
    out = {}
    for name, key in SPECIAL_KEYS.items():
        v = field_value(reader, f"tokenizer.ggml.{key}")
        if v is not None:
            out[name] = int(v)
    return out


def target_info(path) -> TargetInfo:
    """What a draft needs of the target GGUF at `path`; GGUFModelError names what is missing."""
    path = Path(path)
    if not path.is_file():
        raise GGUFModelError(f"{path}: no such target model file")
    reader = open_reader(path)
    arch = field_value(reader, "general.architecture")
    if arch is None:
        raise GGUFModelError(f"{path}: key 'general.architecture' is missing; not a model GGUF")
    if arch == "dflash":
        raise GGUFModelError(f"{path}: is a DFlash draft, not a target model (give the target with -m, the draft "
                             "with -md)")
    n_embd = field_value(reader, f"{arch}.embedding_length")
    n_layer = field_value(reader, f"{arch}.block_count")
    for key, v in ((f"{arch}.embedding_length", n_embd), (f"{arch}.block_count", n_layer)):
        if not isinstance(v, int) or v <= 0:
            raise GGUFModelError(f"{path}: key '{key}' is missing or not a positive integer")
    tokens = field_value(reader, "tokenizer.ggml.tokens") or []
    tensors = {t.name: [int(x) for x in t.shape] for t in reader.tensors}
    n_vocab = len(tokens) or (tensors.get("token_embd.weight", [0, 0])[1])
    return TargetInfo(path, arch, int(n_embd), int(n_layer), int(n_vocab), tokens, _special(reader), tensors)


def tokenizer_fields(path) -> list[tuple[str, object]]:
    """The target's tokenizer.* keys with their values (a draft converted for it carries them)."""
    reader = open_reader(Path(path))
    return [(k, field_value(reader, k)) for k in reader.fields if k.startswith(TOKENIZER_PREFIX)]


def default_target_layers(n_layer_target: int, n: int = 3) -> list[int]:
    """Layer-input indices as llama.cpp's converter writes them for the authors' default choice of
    n target layers (z-lab's build_target_layer_ids: spread over 1 .. n_layer - 3, then + 1)."""
    if n == 1:
        return [n_layer_target // 2 + 1]
    start, end = 1, n_layer_target - 3
    span = end - start
    return [int(round(start + i * span / (n - 1))) + 1 for i in range(n)]


def check_pair(target, draft) -> list[str]:
    """Every problem keeping `draft` from running on `target`, one line each naming both files."""
    target, draft = Path(target), Path(draft)
    both = f"{target.name} + {draft.name}"
    try:
        t = target_info(target)
    except GGUFModelError as e:
        return [f"{both}: the target: {e}"]
    try:
        dr = open_reader(draft)
    except GGUFModelError as e:
        return [f"{both}: the draft: {e}"]
    problems = []
    d_arch = field_value(dr, "general.architecture")
    if d_arch != "dflash":
        return [f"{both}: the draft's architecture is {d_arch!r}, not a DFlash family draft ('dflash')"]
    if not t.publishes_layer_inputs:
        problems.append(f"{both}: the target's architecture '{t.arch}' publishes no layer inputs in llama.cpp "
                        "b11739 (its decode would abort: \"layer input tensor is null\"); targets that do: "
                        + ", ".join(sorted(LAYER_INPUT_ARCHS)))
    layers = field_value(dr, "dflash.target_layers") or []
    bad = [il for il in layers if not isinstance(il, int) or il < 0 or il >= t.n_layer]
    if bad:
        hint = ""
        if all(isinstance(il, int) and 0 <= il - 1 < t.n_layer for il in layers) and max(layers) == t.n_layer:
            hint = (f"; {t.n_layer} is the output of the last layer, which b11739 does not publish: the draft's "
                    "ids look like the authors' numbering shifted twice, or the target has fewer layers than the "
                    "draft was trained for")
        problems.append(f"{both}: target layer {bad[0]} of {layers} is out of range: the target publishes the inputs "
                        f"of layers 0..{t.n_layer - 1} (key 'dflash.target_layers' holds layer-input indices, the "
                        f"authors' ids + 1){hint}")
    d_embd = field_value(dr, "dflash.embedding_length")
    dts = {x.name: [int(v) for v in x.shape] for x in dr.tensors}
    fc = dts.get("fc.weight")
    if fc is not None and layers and fc[0] != len(layers) * t.n_embd:
        problems.append(f"{both}: the draft's fc.weight takes {fc[0]} inputs; {len(layers)} target layers × the "
                        f"target's n_embd {t.n_embd} = {len(layers) * t.n_embd}")
    d_tokens = field_value(dr, "tokenizer.ggml.tokens") or []
    if d_tokens and t.tokens:
        if len(d_tokens) != len(t.tokens):
            problems.append(f"{both}: vocabulary sizes differ: target {len(t.tokens)} tokens, draft {len(d_tokens)}")
        else:
            diff = next((i for i, (a, b) in enumerate(zip(t.tokens, d_tokens)) if a != b), None)
            if diff is not None:
                problems.append(f"{both}: the vocabularies differ from token {diff} on: target {t.tokens[diff]!r}, "
                                f"draft {d_tokens[diff]!r}")
    n_vocab = len(d_tokens) or t.n_vocab
    d_special = _special(dr)
    mask = d_special.get("mask")
    if mask is None:
        problems.append(f"{both}: the draft has no mask token (key 'tokenizer.ggml.mask_token_id')")
    elif not 0 <= mask < min(n_vocab, t.n_vocab):
        problems.append(f"{both}: the draft's mask token {mask} is outside the target's vocabulary ({t.n_vocab})")
    for name in ("bos", "eos"):
        if name in d_special and name in t.special and d_special[name] != t.special[name]:
            problems.append(f"{both}: the {name} tokens differ: target {t.special[name]}, draft {d_special[name]}")
    for own, lent in (("token_embd.weight", "token_embd.weight"), ("output.weight", "output.weight")):
        if own in dts:
            continue
        src = t.tensors.get(lent) or (t.tensors.get("token_embd.weight") if own == "output.weight" else None)
        if src is None:
            problems.append(f"{both}: the draft has no '{own}' and the target has none to lend it")
        elif isinstance(d_embd, int) and src[0] != d_embd:
            problems.append(f"{both}: the draft has no '{own}' and borrows the target's, which is {src[0]} wide; the "
                            f"draft's n_embd is {d_embd}")
    return problems
