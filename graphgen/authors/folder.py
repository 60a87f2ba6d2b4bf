"""A draft checkpoint folder, checked once before anything reads it.

`inspect(path)` is what every command that takes an authors' checkpoint runs first (`convert`,
`check`, `dump --engine torch`, `info`), so the same bad folder gets the same one-line error
wherever it is given, naming the user's own path: a missing or unreadable folder or file, a
config.json that is no JSON object, an architecture no DFlash-family format has, a safetensors file
whose header or data is cut short, and (with the authors' classes installed) a tensor whose shape
the config contradicts. Reading headers only: no weight is loaded here.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from ..models.arch import HEADS
from . import AuthorsError

AUTHORS = ("zlab", "speculators")
# the heads an authors' format holds, as the head registry declares them (z-lab has no DSpark)
HF_VARIANTS = tuple(sorted(h.name for h in HEADS.values() if h.authors))
# the authors' classes per (authors, variant)
CLASSES = {(a, v): f"{HEADS[v].title}DraftModel" for v in HF_VARIANTS for a in HEADS[v].authors}

# DFlash-family architectures: those the authors' PyPI packages hold a class for, and the DSpark
# variants only llama.cpp's converter knows
ZLAB_ARCHS = {"DFlashDraftModel": "dflash", "DFlash2DraftModel": "dflash2"}
SPECULATORS_TYPES = ("dflash", "dflash2", "dspark")
CONVERTER_ONLY_ARCHS = ("Qwen3DSparkModel", "DSparkDraftModel", "DSparkSpeculator", "Lfm2DSparkDraftModel",
                        "LingDSparkModel")


@dataclass
class Checkpoint:
    path: Path                      # as the user gave it
    config: dict
    authors: str | None             # zlab | speculators | None (a format only the converter reads)
    variant: str                    # dflash | dflash2 | dspark
    weights: list[Path] = field(default_factory=list)
    tensors: dict[str, list[int]] = field(default_factory=dict)   # name -> shape, from the headers


def _denied(path: Path, what: str) -> AuthorsError:
    return AuthorsError(f"{path}: permission denied ({what})")


def read_config(path: Path) -> dict:
    cfg_path = path / "config.json"
    try:
        text = cfg_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AuthorsError(f"{path}: no config.json: not a HuggingFace checkpoint folder") from None
    except PermissionError:
        raise _denied(cfg_path, "cannot read it") from None
    except (OSError, UnicodeDecodeError) as e:
        raise AuthorsError(f"{cfg_path}: not readable ({' '.join(str(e).split())})") from None
    try:
        cfg = json.loads(text)
    except ValueError as e:
        raise AuthorsError(f"{cfg_path}: not JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise AuthorsError(f"{cfg_path}: expected a JSON object")
    return cfg


def detect(path: Path, cfg: dict) -> tuple[str | None, str]:
    """(authors, variant) from a config; authors None for the DSpark formats only the converter reads."""
    cfg_path = path / "config.json"
    if "speculators_model_type" in cfg:
        kind = cfg["speculators_model_type"]
        if kind not in SPECULATORS_TYPES:
            raise AuthorsError(f"{cfg_path}: key 'speculators_model_type' = {kind!r} is not a DFlash-family draft "
                               f"({', '.join(SPECULATORS_TYPES)})")
        for key in ("transformer_layer_config", "aux_hidden_state_layer_ids"):
            if key not in cfg:
                raise AuthorsError(f"{cfg_path}: missing key '{key}' of a speculators {kind} config")
        return "speculators", kind
    arch = cfg.get("architectures")
    if not isinstance(arch, list) or not arch or not isinstance(arch[0], str):
        raise AuthorsError(f"{cfg_path}: missing key 'architectures'; not a DFlash-family draft checkpoint")
    if arch[0] in ZLAB_ARCHS:
        if "dflash_config" not in cfg:
            raise AuthorsError(f"{cfg_path}: missing key 'dflash_config' of a z-lab {arch[0]}")
        return "zlab", ZLAB_ARCHS[arch[0]]
    if arch[0] in CONVERTER_ONLY_ARCHS:
        return None, "dspark"
    raise AuthorsError(f"{cfg_path}: key 'architectures' = {arch!r} is not a DFlash-family draft (known: "
                       f"{', '.join([*ZLAB_ARCHS, *CONVERTER_ONLY_ARCHS])}, or a speculators config)")


def weight_files(path: Path) -> list[Path]:
    """The weight files, as llama.cpp's converter picks them (an index's files, else model*.safetensors,
    else pytorch_model*.bin)."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text()).get("weight_map") or {}
        except (OSError, ValueError) as e:
            raise AuthorsError(f"{index}: not readable JSON ({' '.join(str(e).split())})") from None
        files = [path / p for p in sorted(set(weight_map.values()))]
        missing = [f for f in files if not f.is_file()]
        if missing:
            raise AuthorsError(f"{missing[0]}: named by {index.name}, no such file")
        return files
    names = sorted(os.listdir(path))
    parts = [path / n for n in names if n.startswith("model") and n.endswith(".safetensors")]
    return parts or [path / n for n in names if n.startswith("pytorch_model") and n.endswith(".bin")]


def safetensors_header(f: Path) -> dict[str, dict]:
    """The tensors a safetensors file declares, checked against the file's size: a file cut short
    is named here, before any reader maps it."""
    try:
        size = f.stat().st_size
        with open(f, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise AuthorsError(f"{f}: truncated safetensors file ({size} bytes, no header)")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise AuthorsError(f"{f}: truncated safetensors file: its header is {n} bytes, the file holds "
                                   f"{size - 8} after the length")
            header = json.loads(fh.read(n))
    except PermissionError:
        raise _denied(f, "cannot read it") from None
    except AuthorsError:
        raise   # a file cut short, named above (AuthorsError is a ValueError)
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise AuthorsError(f"{f}: not a readable safetensors file ({' '.join(str(e).split())})") from None
    if not isinstance(header, dict):
        raise AuthorsError(f"{f}: not a safetensors file (its header is no JSON object)")
    header.pop("__metadata__", None)
    end = max((int(t.get("data_offsets", [0, 0])[1]) for t in header.values() if isinstance(t, dict)), default=0)
    if 8 + n + end > size:
        raise AuthorsError(f"{f}: truncated safetensors file: its tensors need {8 + n + end} bytes, the file holds "
                           f"{size}")
    return header


def inspect(path, *, shapes: bool = True) -> Checkpoint:
    """Check a checkpoint folder as every command reads it; raise AuthorsError naming the path."""
    path = Path(path)
    if not path.exists():
        raise AuthorsError(f"{path}: no such file or folder")
    if not path.is_dir():
        raise AuthorsError(f"{path}: is a file, not a checkpoint folder (config.json and safetensors)")
    if not os.access(path, os.R_OK | os.X_OK):
        raise _denied(path, "cannot list the folder")
    cfg = read_config(path)
    authors, variant = detect(path, cfg)
    ck = Checkpoint(path, cfg, authors, variant, weight_files(path))
    if not ck.weights:
        raise AuthorsError(f"{path}: no model*.safetensors (nor pytorch_model*.bin) weights")
    for f in ck.weights:
        if f.suffix == ".safetensors":
            ck.tensors.update({k: list(v.get("shape", [])) for k, v in safetensors_header(f).items()})
    if shapes and authors is not None:
        bad = shape_mismatch(ck)
        if bad:
            raise AuthorsError(bad)
    return ck


def authors_class(authors: str, variant: str):
    """The authors' class of a checkpoint: z-lab's in dflash.model, speculators' in
    speculators.models.<variant>.core, named as CLASSES names it."""
    import importlib
    name = CLASSES[(authors, variant)]
    module = "dflash.model" if authors == "zlab" else f"speculators.models.{variant}.core"
    return getattr(importlib.import_module(module), name)


def shape_mismatch(ck: Checkpoint) -> str | None:
    """The first tensor whose shape the config contradicts, named with its file, or None; built on
    the meta device by the authors' own class (None when their packages are absent)."""
    try:
        import torch
        cls = authors_class(ck.authors, ck.variant)
        cfg = cls.config_class.from_pretrained(str(ck.path))
        # shapes only: speculators' guess at the verifier's norm, from a config path that may name
        # where the checkpoint was made, changes no shape, and its warning would mislead
        quiet = logging.getLogger("speculators.models.utils")
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            with torch.device("meta"):
                expected = {k: list(v.shape) for k, v in cls(cfg).state_dict().items()}
        finally:
            quiet.setLevel(level)
    except Exception:  # noqa: BLE001 - the authors' loader, run later, reports what this cannot
        return None
    for f in ck.weights:
        if f.suffix != ".safetensors":
            continue
        for name, t in safetensors_header(f).items():
            shape = list(t.get("shape", []))
            want = expected.get(name, expected.get(name + ".weight"))
            if want is not None and want != shape:
                return f"{f}: tensor '{name}' has shape {shape}, {ck.path / 'config.json'} makes it {want}"
    return None
