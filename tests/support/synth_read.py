"""A draft graphgen.synth wrote, read back with gguf-py: its keys, their types, its tensors' shapes
(ggml order) and values."""

import numpy as np
from gguf import GGUFReader


def read(path):
    r = GGUFReader(str(path))
    keys = {name: f.contents() for name, f in r.fields.items() if not name.startswith("GGUF.")}
    types = {name: f.types for name, f in r.fields.items()}
    tensors = {t.name: tuple(int(n) for n in t.shape) for t in r.tensors}
    data = {t.name: np.array(t.data) for t in r.tensors}
    return keys, types, tensors, data
