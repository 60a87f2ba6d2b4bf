"""A draft GGUF read with the `gguf` package only: hparams under the `dflash.` prefix and every
tensor as a float64 array in numpy order (ggml's ne reversed)."""

from __future__ import annotations

import gguf
import numpy as np

ARCH = "dflash"


class Draft:
    def __init__(self, path):
        r = gguf.GGUFReader(str(path))
        self.kv = {}
        for name, field in r.fields.items():
            if name.startswith(ARCH + "."):
                self.kv[name[len(ARCH) + 1:]] = field.contents()
        self.w = {}
        for t in r.tensors:
            if t.tensor_type not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
                raise ValueError(f"{path}: tensor {t.name} is {t.tensor_type.name}; the reference reads f32/f16 only")
            self.w[t.name] = np.array(t.data, dtype=np.float64).reshape(tuple(int(n) for n in reversed(t.shape)))

    def get(self, key, default=None):
        return self.kv.get(key, default)

    def __getitem__(self, key):
        if key not in self.kv:
            raise KeyError(f"GGUF key {ARCH}.{key} is missing")
        return self.kv[key]

    @property
    def backbone(self) -> str:
        if "attention.kv_lora_rank" in self.kv and "attention.key_length_mla" in self.kv:
            return "mistral-large4"
        if self.get("hyper_connection.single_pass", False):
            return "dsv41"
        if "hyper_connection.count" in self.kv:
            return "dsv4"
        return "base"
