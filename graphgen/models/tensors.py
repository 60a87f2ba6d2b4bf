"""One declaration per tensor, as upstream's create_tensor binds a field, a GGUF name, a shape and
a required flag in one statement: a model file lists its tensors as `T` entries beside the graph
that reads them, and the loader's shape checks (`shapes_of`) and the attributes the graphs read
(`bind`) both come from that list."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class T:
    attr: str                  # the Model (or layer) attribute the graphs read
    name: str                  # the GGUF name; "{il}" stands for the layer index
    shape: Callable            # (hparams, what the tensors say) -> shape in ggml order (None: any size)
    required: bool | Callable = True   # or hparams -> bool

    @property
    def per_layer(self) -> bool:
        return "{il}" in self.name


def shapes_of(decls, hp, info=None, **names) -> tuple[dict, list]:
    """({GGUF name: shape}, [required names]) of a list of declarations; per-layer ones for every
    layer of hp (or the layers `layers=` names), `names` filling other placeholders; `info` is
    what the tensors themselves say (arch.TensorInfo), for shapes that depend on it."""
    shapes, required = {}, []
    layers = names.pop("layers", range(hp.n_layer))
    # layer by layer, as the loaders create them, then the tensors without a layer
    order = [(d, il) for il in layers for d in decls if d.per_layer] + [(d, None) for d in decls if not d.per_layer]
    for d, il in order:
        name = d.name.format(il=il, **names) if il is not None or names else d.name
        shapes[name] = tuple(d.shape(hp, info))
        if d.required(hp) if callable(d.required) else d.required:
            required.append(name)
    return shapes, required


def bind(obj, decls, tensors: dict, il: int | None = None, **names) -> None:
    """Set each declared attribute on obj to its tensor (None when the file has none)."""
    for d in decls:
        if d.per_layer != (il is not None):
            continue
        name = d.name.format(il=il, **names) if il is not None or names else d.name
        setattr(obj, d.attr, tensors.get(name))
