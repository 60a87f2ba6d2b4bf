"""A real target model in b11739's libllama, as common/speculative.cpp's drafts see it.

`TargetContext` runs in the reference child process (graphgen/reference/child.py): a target
GGUF loaded by libllama, a context that publishes the input of each of the draft's target layers
(`llama_set_embeddings_layer_inp`), batched decodes of several sequences whose logits and layer
inputs come back per row, `seq_rm`, and the target's own tokenizer. Its context is also what a
b11739 draft context borrows token embeddings and lm head from (`ctx_other`).

The layer-input calls are C++ symbols of libllama (llama-ext.h declares them without extern "C"),
so they are reached by their mangled names through ctypes.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from ..libload import lib_file, load_llama, reference_label
from ..runtime.mmapfile import llama_model_params

# architectures whose b11739 graph sets t_layer_inp (llama.cpp's models/*.cpp); any other aborts the
# first decode with "layer input tensor is null"
LAYER_INPUT_ARCHS = frozenset((
    "llama", "qwen3", "qwen3moe", "qwen3next", "qwen35", "qwen35moe", "qwen4exp", "gemma4", "openai-moe",
    "deepseek4", "lfm2", "nemotron_h", "nemotron-h", "minimax-01", "minimax-m2", "bailingmoe3", "nanbeige",
    "hunyuan-vl", "mimo2", "muse-glimmer"))


class TargetFailed(RuntimeError):
    """The target could not be loaded or could not run a batch; the message says which and why."""


class TargetContext:
    """A target model and context in b11739 with layer-input extraction for `layers`.

    decode() takes one batch of several sequences' rows and returns, in batch order, the logits
    of every row and the inputs of each extracted layer ([n_rows, len(layers) * n_embd], layer
    after layer within a row, as the driver copies them for the draft)."""

    def __init__(self, path: Path, layers, *, n_ctx: int, n_batch: int, n_seq: int, n_threads: int,
                 flash_attn: int = -1, type_k: int = 1, type_v: int = 1, log=None):
        """`log`: the process's llama.cpp log capture (reference.logcapture._LogCapture), one of its own
        when None; a refusal's message carries llama.cpp's reason from it."""
        ffi, lib, libdir = load_llama()
        self.ffi, self.lib = ffi, lib
        self.mdl, self.ctx = ffi.NULL, ffi.NULL
        if log is None:
            from .logcapture import _LogCapture
            log = _LogCapture(ffi, lib)
        self.log = log
        lib.llama_backend_init()
        log.mark()
        self.mdl = lib.llama_model_load_from_file(str(path).encode(), llama_model_params(lib))
        if self.mdl == ffi.NULL:
            raise TargetFailed(log.explain(f"{reference_label()} could not load the target {path}"))
        try:
            self.vocab = lib.llama_model_get_vocab(self.mdl)
            self.n_vocab = int(lib.llama_vocab_n_tokens(self.vocab))
            self.n_embd = int(lib.llama_model_n_embd(self.mdl))
            self.n_layer = int(lib.llama_model_n_layer(self.mdl))
            self.layers = [int(il) for il in layers]
            cp = lib.llama_context_default_params()
            cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, n_batch, n_batch
            cp.n_seq_max = n_seq
            cp.kv_unified = True  # one stream: a batch's rows keep their order through the ubatches
            cp.n_threads = cp.n_threads_batch = n_threads
            cp.flash_attn_type = flash_attn
            cp.type_k, cp.type_v = type_k, type_v
            log.mark()
            self.ctx = lib.llama_init_from_model(self.mdl, cp)
            if self.ctx == ffi.NULL:
                raise TargetFailed(log.explain(f"{reference_label()} could not create a context for the target {path}"))
            self.n_ctx = int(lib.llama_n_ctx(self.ctx))
            self.n_batch = int(lib.llama_n_batch(self.ctx))
            self.mem = lib.llama_get_memory(self.ctx)
            dl = ctypes.CDLL(str(lib_file(libdir, "llama")))
            set_inp = dl._Z30llama_set_embeddings_layer_inpP13llama_contextjb
            set_inp.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_bool]
            self._get_inp = dl._Z30llama_get_embeddings_layer_inpP13llama_contextj
            self._get_inp.restype = ctypes.POINTER(ctypes.c_float)
            self._get_inp.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
            for il in self.layers:
                set_inp(self.address, il, True)
        except BaseException:
            self.close()
            raise

    @property
    def address(self) -> int:
        return int(self.ffi.cast("uintptr_t", self.ctx))

    # -- vocabulary -------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        raw = text.encode()
        n_max = len(raw) + 16
        buf = self.ffi.new("llama_token[]", n_max)
        n = self.lib.llama_tokenize(self.vocab, raw, len(raw), buf, n_max, add_special, parse_special)
        if n < 0:
            buf = self.ffi.new("llama_token[]", -n)
            n = self.lib.llama_tokenize(self.vocab, raw, len(raw), buf, -n, add_special, parse_special)
        if n < 0:
            raise TargetFailed(f"llama_tokenize failed ({n})")
        return [int(buf[i]) for i in range(n)]

    def piece(self, token: int) -> bytes:
        """The token's bytes as llama.cpp prints it (special tokens rendered as text too)."""
        buf = self.ffi.new("char[]", 256)
        n = self.lib.llama_token_to_piece(self.vocab, int(token), buf, 256, 0, True)
        if n < 0:
            buf = self.ffi.new("char[]", -n)
            n = self.lib.llama_token_to_piece(self.vocab, int(token), buf, -n, 0, True)
        return self.ffi.buffer(buf, max(n, 0))[:]

    def vocab_info(self) -> dict:
        lib, v = self.lib, self.vocab
        eog = [t for t in (lib.llama_vocab_eos(v), lib.llama_vocab_eot(v)) if t >= 0]
        return {"n_vocab": self.n_vocab, "n_embd": self.n_embd, "n_layer": self.n_layer, "n_ctx": self.n_ctx,
                "n_batch": self.n_batch, "bos": int(lib.llama_vocab_bos(v)), "eog": sorted(set(int(t) for t in eog)),
                "add_bos": bool(lib.llama_vocab_get_add_bos(v))}

    def is_eog(self, token: int) -> bool:
        return bool(self.lib.llama_vocab_is_eog(self.vocab, int(token)))

    # -- batches ----------------------------------------------------------------------------
    def decode(self, rows, features: bool = True) -> tuple[int, np.ndarray | None, np.ndarray | None]:
        """rows: [(seq, token, pos), ...] in batch order (at most n_batch). -> (llama_process's return,
        logits [n, n_vocab], features [n, len(layers) * n_embd], or None without `features`)."""
        ffi, lib = self.ffi, self.lib
        batch = lib.llama_batch_ext_init(self.ctx)
        try:
            for i, (seq, tok, pos) in enumerate(rows):
                idx = lib.llama_batch_ext_add_token(batch, int(seq), int(tok))
                if idx < 0:
                    raise TargetFailed(f"llama_batch_ext refused row {i} (error {idx}: the batch is full at "
                                       f"{self.n_batch} rows)")
                p = int(pos)
                lib.llama_batch_ext_set_pos(batch, idx, ffi.new("llama_pos[4]", [p, p, p, 0]))
                lib.llama_batch_ext_set_output_logits(batch, idx, True)
            ret = int(lib.llama_process(self.ctx, lib.LLAMA_PROCESS_TYPE_DECODE, batch))
        finally:
            lib.llama_batch_ext_free(batch)
        if ret != 0:
            return ret, None, None
        n = len(rows)
        # every row is an output, in batch order: the context's logits buffer holds them all, row by row
        p = lib.llama_get_logits(self.ctx)
        if p == ffi.NULL:
            raise TargetFailed("the target has no logits for the batch")
        logits = np.frombuffer(ffi.buffer(p, 4 * n * self.n_vocab), dtype=np.float32).reshape(n, self.n_vocab).copy()
        if not features:
            return 0, logits, None
        feats = np.empty((n, len(self.layers) * self.n_embd), dtype=np.float32)
        for k, il in enumerate(self.layers):
            p = self._get_inp(self.address, il)
            if not p:
                raise TargetFailed(f"the target published no input of layer {il}")
            feats[:, k * self.n_embd:(k + 1) * self.n_embd] = np.ctypeslib.as_array(p, shape=(n, self.n_embd))
        return 0, logits, feats

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        return bool(self.lib.llama_memory_seq_rm(self.mem, int(seq), int(p0), int(p1)))

    def seq_pos_max(self, seq: int) -> int:
        return int(self.lib.llama_memory_seq_pos_max(self.mem, int(seq)))

    def close(self) -> None:
        if self.ctx != self.ffi.NULL:
            self.lib.llama_free(self.ctx)
            self.ctx = self.ffi.NULL
        if self.mdl != self.ffi.NULL:
            self.lib.llama_model_free(self.mdl)
            self.mdl = self.ffi.NULL
