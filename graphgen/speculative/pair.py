"""A target and a draft: can they run together, before b11739 could abort on them?

`target_info` reads what a draft needs of its target from the target GGUF: architecture, width,
depth, vocabulary. `draft_info` reads what the draft expects of it. `check_pair` says, one line per
problem naming both files and the key or tensor at fault, what keeps the pair from running: an
architecture that publishes no layer inputs (b11739 asserts "layer input tensor is null" on the
first decode), a target layer out of range, an fc input width that is not the target layers times
the target's width, a vocabulary, mask token or special token that differs, a draft without
embeddings or lm head facing a target whose own do not fit.

Target layers are layer-input indices as llama.cpp's converter writes them (`dflash.target_layers`
= the authors' `target_layer_ids` + 1: the input of layer il is the output of layer il - 1); b11739
publishes the inputs of layers 0..n_layer-1, so the authors' ids run from -1 to n_layer - 2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import GGUFModelError
from ..ggufile import field_value, open_reader
from ..reference.target import LAYER_INPUT_ARCHS

TOKENIZER_PREFIX = "tokenizer."
ARCH_KEY = "general.architecture"
TOKENS_KEY = "tokenizer.ggml.tokens"
LAYERS_KEY = "dflash.target_layers"
EMBD_KEY = "dflash.embedding_length"
# what a draft converted by llama.cpp's converter leaves out and borrows from the target (ctx_other)
LENT = ("token_embd.weight", "output.weight")


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
    tokenizer_model: str | None = None

    @property
    def publishes_layer_inputs(self) -> bool:
        return self.arch in LAYER_INPUT_ARCHS


@dataclass
class DraftInfo:
    path: Path
    head: str                  # the variant, as graphgen's loader detects it
    n_embd: int | None
    n_layer: int | None
    block_size: int | None
    target_layers: list        # layer-input indices (the authors' ids + 1)
    fc_width: int | None       # fc.weight's input width (ne0); None without fc.weight
    n_vocab: int               # tokens in its vocabulary (0: it has none)
    n_vocab_head: int | None   # rows of a reduced (d2t) lm head; None: the full vocabulary
    borrows: list              # tensors it takes from the target (LENT it lacks)
    tokens: list = field(repr=False, default_factory=list)
    special: dict = field(default_factory=dict)
    tensors: dict = field(repr=False, default_factory=dict)
    tokenizer_model: str | None = None


SPECIAL_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id",
                "pad": "padding_token_id", "mask": "mask_token_id"}


def _special(reader) -> dict:
    out = {}
    for name, key in SPECIAL_KEYS.items():
        v = field_value(reader, f"tokenizer.ggml.{key}")
        if v is not None:
            out[name] = int(v)
    return out


def _open(path: Path, what: str):
    if not path.is_file():
        raise GGUFModelError(f"{path}: no such {what} file")
    try:
        return open_reader(path)
    except OSError as e:
        raise GGUFModelError(f"{path}: cannot be read ({e.strerror or e})") from None


def target_info(path) -> TargetInfo:
    """What a draft needs of the target GGUF at `path`; GGUFModelError names what is missing."""
    path = Path(path)
    reader = _open(path, "target model")
    arch = field_value(reader, ARCH_KEY)
    if arch is None:
        raise GGUFModelError(f"{path}: key '{ARCH_KEY}' is missing; not a model GGUF")
    if arch == "dflash":
        raise GGUFModelError(f"{path}: is a DFlash draft ({ARCH_KEY} = 'dflash'), not a target model")
    n_embd = field_value(reader, f"{arch}.embedding_length")
    n_layer = field_value(reader, f"{arch}.block_count")
    for key, v in ((f"{arch}.embedding_length", n_embd), (f"{arch}.block_count", n_layer)):
        if not isinstance(v, int) or v <= 0:
            raise GGUFModelError(f"{path}: key '{key}' is missing or not a positive integer")
    tokens = field_value(reader, TOKENS_KEY) or []
    tensors = {t.name: [int(x) for x in t.shape] for t in reader.tensors}
    n_vocab = len(tokens) or (tensors.get("token_embd.weight", [0, 0])[1])
    return TargetInfo(path, arch, int(n_embd), int(n_layer), int(n_vocab), tokens, _special(reader), tensors,
                      field_value(reader, "tokenizer.ggml.model"))


def _draft_info(path: Path, reader) -> DraftInfo:
    from ..models.arch import detect_head
    tensors = {t.name: [int(x) for x in t.shape] for t in reader.tensors}
    head = detect_head(set(tensors), set(reader.fields)).name

    def count(key):
        v = field_value(reader, key)
        return v if isinstance(v, int) else None
    layers = field_value(reader, LAYERS_KEY)
    tokens = field_value(reader, TOKENS_KEY) or []
    fc = tensors.get("fc.weight")
    d2t = tensors.get("d2t")
    return DraftInfo(path, head, count(EMBD_KEY), count("dflash.block_count"), count("dflash.block_size"),
                     layers if isinstance(layers, list) else [], fc[0] if fc else None, len(tokens),
                     d2t[0] if d2t else None, [n for n in LENT if n not in tensors], tokens, _special(reader),
                     tensors, field_value(reader, "tokenizer.ggml.model"))


def draft_info(path) -> DraftInfo:
    """What the draft GGUF at `path` expects of its target; GGUFModelError when it is no DFlash draft."""
    path = Path(path)
    reader = _open(path, "draft model")
    arch = field_value(reader, ARCH_KEY)
    if arch != "dflash":
        raise GGUFModelError(f"{path}: {ARCH_KEY} is {arch!r}, not a DFlash family draft ('dflash')")
    return _draft_info(path, reader)


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


def layers_problem(layers, n_layer: int) -> str | None:
    """Why target layers `layers` (layer-input indices) do not fit a target of n_layer layers, or None."""
    bad = [il for il in layers if type(il) is not int or il < 0 or il >= n_layer]
    if not bad:
        return None
    text = (f"target layer {bad[0]} of {list(layers)} is out of range: the target publishes the inputs of layers "
            f"0..{n_layer - 1} (layer-input indices, the authors' target_layer_ids + 1)")
    if bad[0] == n_layer:
        # the usual mistake: the authors' ids shifted by one once too often, or a draft for a deeper target
        text += (f"; layer-input index {n_layer} is the final output (of layer {n_layer - 1}), which b11739 does not "
                 f"publish: the authors' ids run to {n_layer - 2} here, were they shifted by one twice, or is the "
                 "draft for a deeper target?")
    elif bad[0] == -1:
        text += "; authors' id -1 (the embeddings) is layer-input index 0"
    return text


def _arch_of(path: Path) -> str | None:
    try:
        return field_value(_open(path, "model"), ARCH_KEY)
    except GGUFModelError:
        return None


def pair_label(target, draft) -> str:
    """How a problem line names the two files: their names, or their paths when the names are alike."""
    target, draft = Path(target), Path(draft)
    t, d = (target.name, draft.name) if target.name != draft.name else (str(target), str(draft))
    return f"target {t} + draft {d}"


def check_pair(target, draft) -> list[str]:
    """Every problem keeping `draft` from running on `target`, one line each naming both files."""
    target, draft = Path(target), Path(draft)
    both = pair_label(target, draft)
    try:
        t = target_info(target)
    except GGUFModelError as e:
        swapped = _arch_of(target) == "dflash" and _arch_of(draft) not in (None, "dflash")
        if swapped:
            return [f"{both}: swapped: {target} is a DFlash draft and {draft} a '{_arch_of(draft)}' model "
                    f"({ARCH_KEY}); give the target with -m, the draft with -md"]
        return [f"{both}: the target: {e}"]
    try:
        d = draft_info(draft)
    except GGUFModelError as e:
        return [f"{both}: the draft: {e}"]
    problems = []
    if not t.publishes_layer_inputs:
        problems.append(f"{both}: the target's architecture ({ARCH_KEY} = '{t.arch}') publishes no layer inputs in "
                        "llama.cpp b11739 (its decode would abort: \"layer input tensor is null\"); targets that "
                        "do: " + ", ".join(sorted(LAYER_INPUT_ARCHS)))
    layers = d.target_layers
    if not layers:
        problems.append(f"{both}: the draft has no target layers (key '{LAYERS_KEY}' missing or empty)")
    else:
        why = layers_problem(layers, t.n_layer)
        if why:
            problems.append(f"{both}: key '{LAYERS_KEY}': {why}")
    if d.fc_width is None:
        problems.append(f"{both}: the draft has no 'fc.weight' tensor (the projection of the target's features)")
    elif layers and d.fc_width != len(layers) * t.n_embd:
        problems.append(f"{both}: the draft's 'fc.weight' takes {d.fc_width} inputs; {len(layers)} target layers "
                        f"(key '{LAYERS_KEY}') × the target's n_embd {t.n_embd} ('{t.arch}.embedding_length') = "
                        f"{len(layers) * t.n_embd}")
    if d.tokens and t.tokens:
        if len(d.tokens) != len(t.tokens):
            problems.append(f"{both}: vocabulary sizes differ (key '{TOKENS_KEY}'): target {len(t.tokens)} "
                            f"tokens, draft {len(d.tokens)}")
        else:
            diff = next((i for i, (a, b) in enumerate(zip(t.tokens, d.tokens)) if a != b), None)
            if diff is not None:
                problems.append(f"{both}: the vocabularies differ from token {diff} on (key '{TOKENS_KEY}'): "
                                f"target {t.tokens[diff]!r}, draft {d.tokens[diff]!r}")
    if d.tokenizer_model and t.tokenizer_model and d.tokenizer_model != t.tokenizer_model:
        problems.append(f"{both}: the tokenizers differ (key 'tokenizer.ggml.model'): target "
                        f"'{t.tokenizer_model}', draft '{d.tokenizer_model}'")
    n_vocab = d.n_vocab or t.n_vocab
    mask = d.special.get("mask")
    if mask is None:
        problems.append(f"{both}: the draft has no mask token (key 'tokenizer.ggml.mask_token_id')")
    elif not 0 <= mask < min(n_vocab, t.n_vocab):
        problems.append(f"{both}: the draft's mask token {mask} (key 'tokenizer.ggml.mask_token_id') is outside "
                        f"the target's vocabulary (ids 0..{t.n_vocab - 1})")
    for name in ("bos", "eos"):
        if name in d.special and name in t.special and d.special[name] != t.special[name]:
            problems.append(f"{both}: the {name} tokens differ (key 'tokenizer.ggml.{SPECIAL_KEYS[name]}'): target "
                            f"{t.special[name]}, draft {d.special[name]}")
    for own in d.borrows:
        # a target without output.weight ties its lm head to its embeddings
        src_name = own if own in t.tensors else "token_embd.weight"
        src = t.tensors.get(src_name)
        if src is None:
            problems.append(f"{both}: the draft has no '{own}' and the target has no '{src_name}' to lend it")
        elif d.n_embd is not None and src[0] != d.n_embd:
            problems.append(f"{both}: the draft has no '{own}' and borrows the target's '{src_name}', which is "
                            f"{src[0]} wide; the draft's n_embd is {d.n_embd} (key '{EMBD_KEY}')")
    return problems
