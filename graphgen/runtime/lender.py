"""The target's token embeddings and lm head, lent to a draft that has none (llama.cpp's ctx_other).

A DFlash draft converted by llama.cpp's converter carries neither `token_embd.weight` nor
`output.weight`: b11739 takes them from the target model's context (dflash.cpp's get_tok_embd /
get_lm_head). `Lender` gives graphgen's draft the same two tensors from the target GGUF: checked
against the draft's shapes, then computed on in place from a read-only mapping of the target file on
the CPU (uploaded from it on a device backend, or read into a buffer with --no-mmap). A target
without `output.weight` ties its lm head to its embeddings, as llama.cpp's loader does
(TENSOR_DUPLICATED): one tensor, named token_embd.weight, serves both.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from ..errors import GGUFModelError
from ..ggufile import field_value, open_reader
from ..ops import ggml as G
from .mmapfile import MappedFile

EMBD, OUTPUT = "token_embd.weight", "output.weight"


class Lender:
    """The target tensors a draft borrows: `tok_embd` and `output` (None for what the draft has)."""

    def __init__(self, target, draft_path: Path, n_embd: int, need: list[str], n_vocab_head: int | None):
        self.path = Path(target)
        if not self.path.is_file():
            raise GGUFModelError(f"{self.path}: no such target model file")
        try:
            reader = open_reader(self.path)
        except GGUFModelError as e:
            raise GGUFModelError(f"the target model: {e}") from None
        arch = field_value(reader, "general.architecture")
        if arch == "dflash":
            raise GGUFModelError(f"{self.path}: is a DFlash draft, not a target model; give the target with -m and "
                                 "the draft with -md")
        by_name = {t.name: t for t in reader.tensors}
        if EMBD not in by_name:
            raise GGUFModelError(f"{self.path}: the target has no '{EMBD}' to lend the draft {draft_path.name}")
        self._reader = reader
        st = self.path.stat()
        self._stamp = (st.st_size, st.st_mtime_ns)
        # lm head: the target's own, else its embeddings (a tied head)
        picks = {}
        if EMBD in need:
            picks["tok_embd"] = by_name[EMBD]
        if OUTPUT in need:
            picks["output"] = by_name.get(OUTPUT, by_name[EMBD])
        for attr, t in picks.items():
            shape = [int(x) for x in t.shape]
            if len(shape) != 2 or shape[0] != n_embd:
                raise GGUFModelError(f"{self.path}: the target's '{t.name}' has shape {shape}; the draft "
                                     f"{draft_path.name} has n_embd {n_embd} and needs [{n_embd}, n_vocab]")
            if attr == "output" and n_vocab_head is not None and shape[1] != n_vocab_head:
                raise GGUFModelError(f"{self.path}: the target's lm head '{t.name}' has {shape[1]} rows; the draft "
                                     f"{draft_path.name} predicts over {n_vocab_head} tokens")
            if G.ggml_type_size(int(t.tensor_type)) == 0:
                raise GGUFModelError(f"{self.path}: tensor '{t.name}' has a type ggml cannot compute with "
                                     f"({t.tensor_type.name})")
        self.picks = picks
        self.n_vocab = int(by_name[EMBD].shape[1])
        self.tok_embd = self.output = None
        self._ctx = self._buf = self._map = None

    def upload(self, backend, use_mmap: bool) -> None:
        """Create the borrowed tensors on `backend`: in place on the mapped target file (CPU with
        mmap), else in a buffer of their own."""
        uniq = {}
        for attr, t in self.picks.items():
            uniq.setdefault(t.name, t)
        params = G.ggml_init_params(mem_size=G.ggml_tensor_overhead() * (len(uniq) + 2), mem_buffer=None,
                                    no_alloc=True)
        self._ctx = G.ggml_init(params)
        made = {}
        for name, t in uniq.items():
            gt = G.ggml_new_tensor(self._ctx, int(t.tensor_type), 2,
                                   (ctypes.c_int64 * 4)(int(t.shape[0]), int(t.shape[1]), 1, 1))
            G.set_name(gt, name)
            if G.ggml_nbytes(gt) != int(t.n_bytes):
                raise GGUFModelError(f"{self.path}: tensor '{name}' holds {int(t.n_bytes)} bytes, ggml expects "
                                     f"{G.ggml_nbytes(gt)} for its type and shape")
            made[name] = gt
        host = bool(G.ggml_backend_is_cpu(backend))
        if use_mmap:
            self._map = MappedFile(self.path)
            if self._map.stamp != self._stamp:
                raise GGUFModelError(f"{self.path}: the target changed on disk since its metadata was read")
        if use_mmap and host:
            m = self._map
            align = G.ggml_backend_buft_get_alignment(G.ggml_backend_cpu_buffer_type())
            if m.addr % align or any((m.addr + int(t.data_offset)) % align for t in uniq.values()):
                raise GGUFModelError(f"{self.path}: the target's tensors are not {align}-byte aligned in the "
                                     "mapped file; run with --no-mmap")
            self._buf = G.ggml_backend_cpu_buffer_from_ptr(m.addr, m.size)
            for name, t in uniq.items():
                if G.ggml_backend_tensor_alloc(self._buf, made[name], m.addr + int(t.data_offset)) != 0:
                    raise GGUFModelError(f"{self.path}: ggml could not place tensor '{name}' in the mapped file")
        else:
            self._buf = G.ggml_backend_alloc_ctx_tensors(self._ctx, backend)
            if not self._buf:
                raise GGUFModelError(f"{self.path}: could not allocate the borrowed tensors on the backend")
            with open(self.path, "rb") as f:
                for name, t in uniq.items():
                    f.seek(int(t.data_offset))
                    data = f.read(int(t.n_bytes))
                    if len(data) != int(t.n_bytes):
                        raise GGUFModelError(f"{self.path}: tensor '{name}' could not be read whole")
                    G.ggml_backend_tensor_set(made[name], ctypes.c_char_p(data), 0, len(data))
            if self._map is not None:
                self._map.close()
                self._map = None
        for attr, t in self.picks.items():
            setattr(self, attr, made[t.name])

    def check_file(self) -> None:
        if self._map is not None:
            why = self._map.changed()
            if why is not None:
                raise GGUFModelError(f"{self.path}: the target changed on disk while its tensors were mapped ({why})")

    @property
    def weight_bytes(self) -> int:
        return sum(int(t.n_bytes) for t in {t.name: t for t in self.picks.values()}.values())

    def close(self) -> None:
        if self._buf:
            G.ggml_backend_buffer_free(self._buf)
            self._buf = None
        if self._ctx:
            G.ggml_free(self._ctx)
            self._ctx = None
        if self._map is not None:
            self._map.close()
            self._map = None
        self.tok_embd = self.output = None
