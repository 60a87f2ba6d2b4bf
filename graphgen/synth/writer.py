"""The draft writer: a draft's keys and tensors, held in creation order, written as one GGUF file.

A tensor's values are drawn only as it is written, block by block from the draft's one generator:
the bytes are those of drawing every tensor up front in creation order, while memory stays near
the largest tensor whatever the file's size. The writers of keys and tensors (base, head_writers,
dspark_backbones) add to a `Draft`; `write` puts it in a file.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np


ARCH = "dflash"


def kv(name: str) -> str:
    return f"{ARCH}.{name}"


# the matmul weights a real draft ships in f16/bf16 or quantized; norms, biases and scales stay f32
_QUANTIZABLE = re.compile(r"^(token_embd|output|fc|blk\.\d+\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down))\.weight$")

# rows of a tensor drawn at a time: a big draft is written without ever holding a whole tensor in float64
_CHUNK_ELEMENTS = 1 << 18


class _Tensor:
    """A tensor of the draft: its numpy shape and dtype now, its values only when it is written.

    `rows(rng)` yields it in blocks of whole rows (last numpy axis), drawn from the draft's one
    generator; the tensors are drawn in creation order, so the bytes equal drawing them all up front."""

    def __init__(self, shape: tuple, dtype, rows):
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        self.rows = rows

    @property
    def ndim(self) -> int:
        return len(self.shape)


class Draft:
    """Keys and tensors of one draft, in creation order, drawn from one generator when written."""

    def __init__(self, seed: int, weight_scales: bool):
        self.rng = np.random.default_rng(seed)
        self.weight_scales = weight_scales
        self.keys: dict[str, tuple[str, object]] = {}
        self.tensors: dict[str, _Tensor] = {}

    def key(self, name: str, kind: str, value) -> None:
        self.keys[name] = (kind, value)

    def add(self, name: str, shape, dtype, rows) -> None:
        if name in self.tensors:
            raise AssertionError(f"tensor {name} written twice")
        self.tensors[name] = _Tensor(shape, dtype, rows)

    def normal(self, name: str, ne, std: float, mean: float = 0.0) -> None:
        shape = tuple(reversed(ne))
        row = shape[-1]
        n_rows = int(np.prod(shape[:-1], dtype=np.int64))
        step = max(1, _CHUNK_ELEMENTS // max(row, 1))

        def rows(rng):
            # chunks of a standard_normal draw continue one another, so this equals one draw of `shape`
            for r0 in range(0, n_rows, step):
                n = min(step, n_rows - r0)
                yield (mean + std * rng.standard_normal((n, row))).astype(np.float32)
        self.add(name, shape, np.float32, rows)

    # a tensor the loader declares (models/tensors.T): its name and shape come from the
    # declaration, `dims` standing in for the hparams its shape reads and `at` filling the
    # name's placeholders (il, or LiliCorr's bid, i, fb)
    def normal_t(self, decl, dims, std: float = 0.1, mean: float = 0.0, **at) -> None:
        self.normal(decl.name.format(**at), decl.shape(dims, dims), std, mean)

    def norm_t(self, decl, dims, **at) -> None:
        self.normal_t(decl, dims, 0.1, 1.0, **at)

    def bias_t(self, decl, dims, **at) -> None:
        self.normal_t(decl, dims, 0.02, **at)

    def linear_t(self, decl, scale_decl, dims, **at) -> None:
        """A matmul weight {n_in, n_out} (1/sqrt(n_in) keeps activations O(1)); with weight_scales
        also its optional scale {1}, where upstream loads one (scale_decl; None where it does not)."""
        n_in, n_out = decl.shape(dims, dims)
        self.normal(decl.name.format(**at), (n_in, n_out), 1.0 / np.sqrt(n_in))
        if scale_decl is not None and self.weight_scales:
            self.normal_t(scale_decl, dims, 0.1, 1.0, **at)


@dataclass(frozen=True)
class Output:
    """How a draft's tensors are written: the matmul weights' type, and who hears of progress."""
    wtype: str = "f32"
    progress: Callable[[str], None] | None = None


def by_attr(decls) -> dict:
    return {t.attr: t for t in decls}


def write(path: Path, d: Draft, output: Output) -> None:
    import gguf

    # gguf logs its endianness on every writer at INFO
    logging.getLogger("gguf.gguf_writer").setLevel(logging.WARNING)
    w = gguf.GGUFWriter(str(path), ARCH)
    scalar = {"u32": w.add_uint32, "f32": w.add_float32, "bool": w.add_bool, "str": w.add_string}
    array_type = {"i32[]": gguf.GGUFValueType.INT32, "f32[]": gguf.GGUFValueType.FLOAT32,
                  "bool[]": gguf.GGUFValueType.BOOL, "str[]": gguf.GGUFValueType.STRING}
    for name, (kind, value) in d.keys.items():
        if kind in scalar:
            scalar[kind](name, value)
        else:
            w.add_key_value(name, list(value), gguf.GGUFValueType.ARRAY, sub_type=array_type[kind])
    # every tensor's info goes first, so the header is written before any value is drawn
    plan = []
    for name, t in d.tensors.items():
        kind = t.dtype.name
        if output.wtype != "f32" and t.dtype == np.float32 and t.ndim == 2 and _QUANTIZABLE.match(name):
            if output.wtype == "f16":
                kind = "f16"
            elif t.shape[-1] % 32 == 0:  # q8_0 blocks hold 32 values of a row
                kind = "q8_0"
        if kind == "f16":
            shape, dtype = t.shape, np.dtype(np.float16)
        elif kind == "q8_0":
            q8 = gguf.GGMLQuantizationType.Q8_0
            block, type_size = gguf.GGML_QUANT_SIZES[q8]
            shape, dtype = (*t.shape[:-1], t.shape[-1] // block * type_size), np.dtype(np.uint8)
        else:
            shape, dtype = t.shape, t.dtype
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        w.add_tensor_info(name, shape, dtype, nbytes, raw_dtype=q8 if kind == "q8_0" else None)
        plan.append((name, t, kind, shape, dtype))
    total = sum(int(np.prod(sh, dtype=np.int64)) * dt.itemsize for _, _, _, sh, dt in plan)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        done = 0
        for name, t, kind, shape, dtype in plan:
            # one tensor at a time, in its file type: the largest tensor bounds the memory, not the file
            out = np.empty(shape, dtype=dtype)
            flat = out.reshape(-1, shape[-1]) if out.ndim > 1 else out.reshape(1, -1)
            r0 = 0
            for block in t.rows(d.rng):
                block = block.reshape(-1, t.shape[-1])
                if kind == "q8_0":
                    block = gguf.quants.quantize(block, gguf.GGMLQuantizationType.Q8_0)
                flat[r0:r0 + block.shape[0]] = block
                r0 += block.shape[0]
                if output.progress is not None:
                    digits = 0 if total >= 100e6 else 2
                    output.progress(f"writing {name}, {(done + r0 * flat.shape[1] * dtype.itemsize) / 1e6:.{digits}f} of "
                              f"{total / 1e6:.{digits}f} MB")
            w.write_tensor_data(out)
            done += out.nbytes
            del out, flat
    finally:
        w.close()
