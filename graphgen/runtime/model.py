"""GGUF -> hparams + weights on a backend: the loading every draft shares.

`load(path)` reads the metadata with gguf-py (memory-mapped), checks key types, reads the keys
every draft has, detects the head (variant, from tensors) and the backbone (from keys) as the
seed's load_arch_hparams does, and leaves the rest to the model files through
graphgen/models/arch.py: each head's and backbone's hparams, tensor shapes and checks sit beside
its graph (load_hparams_dsv4 in models/dspark.py, load_tensors_lilicorr in models/lilicorr.py...).
Every key and shape is validated before ggml sees it.

Weights, as llama.cpp places them with mmap: on a host backend (the CPU) they are computed on in
place, a read-only mapping of the file wrapped in a CPU buffer, each tensor pointing at its bytes
(no weight needs converting: every type is ggml's own, the 2-D wo_a is a reshape, and a tensor off
ggml's alignment is refused with the file, as upstream refuses it); on a device backend they are
uploaded from the mapping, which is then released. `use_mmap=False` (the command line's --no-mmap) reads them into a backend
buffer instead. A file changed in place while mapped is refused, naming it, before the next
compute reads it (`check_file`).
"""

from __future__ import annotations

import ctypes
import math
import os
import re
from pathlib import Path


from ..errors import GGUFModelError
from ..models import arch
from ..models.arch import BACKBONE_BASE, BACKBONE_DSV4, BACKBONE_DSV41, BACKBONE_MISTRAL_LARGE4
from ..models.tensors import bind
from .mmapfile import MappedFile, mmap_default
from ..models.arch import HParams
from ..models.loader import (ARCH, GGUFMeta, read_base_hparams, read_loader_keys, read_rope_scaling,
                             read_rope_sections, read_vocab)
from ..ggufile import N_DIMS_MAX, open_reader
from ..ops import ggml as G

# gguf-py GGMLQuantizationType values graphgen can hold as weights
SUPPORTED_WEIGHT_TYPES = {0: "f32", 1: "f16", 8: "q8_0", 30: "bf16", 26: "i32", 27: "i64"}

class Layer:
    """A layer's tensors under upstream's llama_layer field names (None when absent), bound from
    the declarations of every backbone's loader (models/arch.LAYER_TENSORS)."""

    def __init__(self, il: int, tensors: dict):
        self.il = il
        bind(self, arch.LAYER_TENSORS, tensors, il=il)
        # the rope frequency factors are one tensor without a layer index; upstream's loader
        # creates it for layer 0 and shares it with the other layers (TENSOR_DUPLICATED)
        self.rope_freqs = tensors.get(arch.ROPE_FREQS.name)


def read_hparams(reader, path) -> tuple[HParams, str, str]:
    m = GGUFMeta(reader, path)
    read_loader_keys(m, path)
    k = lambda s: f"{ARCH}.{s}"  # noqa: E731
    hp = HParams()
    read_base_hparams(m, hp, path)
    hp.rope_freq_base = m.get(k("rope.freq_base"), 10000.0, kind="float")
    read_rope_scaling(m, hp, path)
    default_head = hp.n_embd // hp.n_head
    hp.n_embd_head_k = m.get(k("attention.key_length"), default_head, kind="int")
    hp.n_embd_head_v = m.get(k("attention.value_length"), default_head, kind="int")
    if hp.n_embd_head_k <= 0 or hp.n_embd_head_v <= 0:
        raise GGUFModelError(f"{path}: head dimension must be positive (key '{k('attention.key_length')}')")
    hp.n_rot = m.get(k("rope.dimension_count"), hp.n_embd_head_k, kind="int")
    if hp.n_rot <= 0 or hp.n_rot > hp.n_embd_head_k or hp.n_rot % 2:
        raise GGUFModelError(f"{path}: key '{k('rope.dimension_count')}' = {hp.n_rot} must be even and "
                             f"<= the head dimension {hp.n_embd_head_k}")
    for key in ("attention.key_length_swa", "attention.value_length_swa", "rope.dimension_count_swa",
                "classifier.output_labels"):
        m.read(k(key))
    # llama_model_dflash::load_arch_hparams
    hp.f_embedding_scale = m.get(k("embedding_scale"), 0.0, kind="float")
    hp.f_attention_scale = m.get(k("attention.scale"), 0.0, kind="float")
    hp.f_attn_value_scale = m.get(k("attention.value_scale"), 0.0, kind="float")
    act = m.get(k("hidden_activation"), "silu")
    if act in ("gelu", "gelu_pytorch_tanh"):
        hp.ffn_op = "gelu"
    elif act != "silu":
        raise GGUFModelError(f"{path}: unsupported DFlash hidden activation '{act}' (key '{k('hidden_activation')}')")
    hp.f_norm_rms_eps = m.get(k("attention.layer_norm_rms_epsilon"), required=True, kind="float")
    # ggml's norms assert eps >= 0: a negative or NaN epsilon would abort the interpreter
    if not (math.isfinite(hp.f_norm_rms_eps) and hp.f_norm_rms_eps >= 0.0):
        raise GGUFModelError(f"{path}: key '{k('attention.layer_norm_rms_epsilon')}' = {hp.f_norm_rms_eps} "
                             "must be a finite number >= 0")
    hp.f_logit_scale = m.get(k("logit_scale"), 0.0, kind="float")
    hp.f_final_logit_softcapping = m.get(k("final_logit_softcapping"), 0.0, kind="float")
    read_rope_sections(m, hp, path)
    hp.block_size = m.get(k("block_size"), 0, kind="int")
    hp.conv_kernel_size = m.get(k("conv_kernel_size"), 0, kind="int")
    hp.conv_group_size = m.get(k("conv_group_size"), 0, kind="int")
    if hp.conv_kernel_size <= 0:
        # a group size configures the conv only together with a kernel size: alone llama.cpp
        # (b11739 and the seed) neither builds a conv nor checks that the groups tile n_embd
        hp.conv_group_size = 0
    hp.selector_rank = m.get(k("selector_rank"), 0, kind="int")
    hp.selector_top_k = m.get(k("selector_top_k"), 0, kind="int")
    # b11739 reads the LiliCorr keys of every draft (required once lilicorr.hidden_size is there)
    has_lilicorr = m.read("lilicorr.hidden_size") is not None
    for key in ("lilicorr.candidate_topk", "lilicorr.num_heads", "lilicorr.num_layers", "lilicorr.vector_eps",
                "lilicorr.logit_scale"):
        m.read(key, required=has_lilicorr)
    tl = m.get(k("target_layers"), None, kind="array")
    if tl is None:
        raise GGUFModelError(f"{path}: DFlash model requires 'target_layers' in GGUF metadata "
                             f"(key '{k('target_layers')}', an integer array)")
    if not tl or any(not isinstance(x, int) for x in tl):
        raise GGUFModelError(f"{path}: key '{k('target_layers')}' must be a non-empty integer array")
    hp.target_layers = list(tl)
    hp.hc_mult = m.get(k("hyper_connection.count"), 0, kind="int")
    # the seed's DSpark graph reads the key from the model's string map: absent or "true" means
    # slot 0 is a prediction slot
    anchor = m.read(k("sample_from_anchor"))
    hp.sample_from_anchor = anchor is None or anchor == "true"
    hp.n_lora_kv = m.get(k("attention.kv_lora_rank"), 0, kind="int") if hp.hc_mult <= 0 else 0
    read_vocab(m, hp, path)
    n_lili_layers = m.read("lilicorr.num_layers") or 0
    if n_lili_layers > 0 and not has_lilicorr:
        # llama.cpp loads the scorer's tensors whenever lilicorr.num_layers is set, with a hidden
        # size of 0 when lilicorr.hidden_size is absent: no file can hold such tensors
        m.read("lilicorr.factor_dim", required=True)
        m.read("lilicorr.mlp_hidden_size", required=True)
        raise GGUFModelError(f"{path}: key 'lilicorr.num_layers' = {n_lili_layers} without 'lilicorr.hidden_size': "
                             "llama.cpp loads the LiliCorr scorer tensors with a hidden size of 0")

    # head: read from tensors and keys, as the seed does
    variant = arch.detect_head({t.name for t in reader.tensors}, set(reader.fields)).name
    # backbone: read from keys, as the seed does
    if hp.hc_mult > 0:
        single_pass = bool(m.get(k("hyper_connection.single_pass"), False))
        backbone = BACKBONE_DSV41 if single_pass else BACKBONE_DSV4
    elif hp.n_lora_kv > 0:
        backbone = BACKBONE_MISTRAL_LARGE4
    else:
        backbone = BACKBONE_BASE
    arch.load_hparams(m, hp, variant, backbone, path)
    return hp, variant, backbone


# ---- checks of a draft's tensors and of the memory they need, before ggml sees them ----

def check_tensor_data(reader, path, file_size: int) -> int:
    """Every tensor's dims and data range are sane; returns the bytes the weights need."""
    total = 0
    for t in reader.tensors:
        shape = [int(x) for x in t.shape]
        if not 1 <= len(shape) <= N_DIMS_MAX or any(d <= 0 for d in shape):
            raise GGUFModelError(f"{path}: tensor '{t.name}' has shape {shape}; ggml takes 1 to "
                                 f"{N_DIMS_MAX} positive dims")
        n = int(t.n_bytes)
        off = int(t.data_offset)
        if off < 0 or n < 0 or off + n > file_size:
            raise GGUFModelError(f"{path}: tensor '{t.name}' data lies past the end of the file "
                                 f"(offset {off} + {n} bytes > {file_size})")
        total += n
    return total


INT_TENSORS = {"d2t"}        # the only integer tensor a draft holds (read by ggml_get_rows)
_INT_TYPES = {24: "i8", 25: "i16", 26: "i32", 27: "i64"}


# tensors that only enter elementwise ops (ggml_add/ggml_mul with f32 operands)
_ELEMENTWISE = re.compile(r"(norm\.|_norm$|\.bias$|\.scale$|_sinks|rope_freqs|_conv_base$|_embedding\.weight$|"
                          r"exp_probs_b|_base\.weight$|_scale\.weight$|attention_bias)")
# ggml_type -> values per block, for the quantized types a weight may have
_QUANT_BLOCK = {2: 32, 3: 32, 6: 32, 7: 32, 8: 32, 9: 32, 10: 256, 11: 256, 12: 256, 13: 256, 14: 256, 15: 256}


def check_tensor_types(reader, path) -> None:
    """Weights are float (f32/f16/bf16/q8_0): an integer weight in a matmul or an add makes ggml
    abort or read out of bounds."""
    for t in reader.tensors:
        tt = int(t.tensor_type)
        if tt in _INT_TYPES and t.name not in INT_TENSORS:
            raise GGUFModelError(f"{path}: tensor '{t.name}' has integer type {_INT_TYPES[tt]}; "
                                 "weights must be f32, f16, bf16 or q8_0")
        # norms, biases and scales enter ggml_mul/ggml_add with f32 activations, which need f32
        if len(t.shape) == 1 and tt != 0 and t.name not in INT_TENSORS:
            raise GGUFModelError(f"{path}: tensor '{t.name}' (1-D: a norm, bias or scale) has type "
                                 f"{t.tensor_type.name}; it must be F32")
        # so do the many-dimensional tensors that only meet activations elementwise
        if tt != 0 and _ELEMENTWISE.search(t.name):
            raise GGUFModelError(f"{path}: tensor '{t.name}' is used elementwise with f32 activations and "
                                 f"has type {t.tensor_type.name}; it must be F32")
        # a quantized row is made of whole blocks
        blk = _QUANT_BLOCK.get(tt)
        if blk and len(t.shape) and int(t.shape[0]) % blk:
            raise GGUFModelError(f"{path}: tensor '{t.name}' has {int(t.shape[0])} values per row, not a "
                                 f"multiple of its {t.tensor_type.name} block of {blk}")


def available_memory() -> int | None:
    """Bytes of memory available for new allocations (MemAvailable), None when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**27 else f"{n / 2**20:.1f} MiB"


def check_memory(need: int, path, what: str = "its tensors") -> None:
    """Refuse before allocating when `need` bytes would not fit in available memory."""
    have = available_memory()
    if have is not None and need > have:
        raise GGUFModelError(f"{path}: {what} need {_gib(need)} ({need} bytes), only {_gib(have)} "
                             "of memory is available")


class Model:
    """A loaded draft: hparams, variant, backbone and its weights in a backend buffer."""

    def __init__(self, path, backend=None, use_mmap: bool | None = None, target=None):
        self.path = Path(path)
        self.target = None if target is None else Path(target)
        self.lender = None
        self.use_mmap = mmap_default() if use_mmap is None else bool(use_mmap)
        self._map = None
        if self.path.is_dir():
            raise GGUFModelError(f"{self.path}: is a folder, not a GGUF file")
        if not self.path.is_file():
            raise GGUFModelError(f"{self.path}: no such file")
        st = self.path.stat()
        self._stamp = (st.st_size, st.st_mtime_ns)
        reader = open_reader(self.path)
        self.hparams, self.variant, self.backbone = read_hparams(reader, self.path)
        self.head = arch.HEADS[self.variant]
        self._reader = reader
        self._check_tensors(reader)
        self.backend = backend
        self.tensors: dict = {}
        self._ctx = None
        self._buf = None
        self.n_mapped = 0             # tensors computed on in place from the mapping
        if backend is not None:
            self.upload(backend)

    # -- validation -------------------------------------------------------------------------
    def _check_tensors(self, reader):
        hp = self.hparams
        seen = {}
        for t in reader.tensors:
            if t.name in seen:
                raise GGUFModelError(f"{self.path}: duplicated tensor '{t.name}'")
            seen[t.name] = t
            if int(t.tensor_type) not in SUPPORTED_WEIGHT_TYPES:
                raise GGUFModelError(f"{self.path}: tensor '{t.name}' has unsupported type {t.tensor_type.name}")
        check_tensor_types(reader, self.path)
        w1 = seen.get("markov_w1.weight")
        self._dspark_rank = int(w1.shape[0]) if w1 is not None else 0
        d2t = seen.get("d2t")
        self._n_vocab_draft = int(d2t.shape[0]) if d2t is not None else hp.n_vocab
        if d2t is not None and int(d2t.tensor_type) != 27:
            raise GGUFModelError(f"{self.path}: tensor 'd2t' must be i64")
        want, required = arch.load_tensors(hp, self.variant, self.backbone, self._dspark_rank, self._n_vocab_draft)
        for name in required:
            if name not in seen:
                raise GGUFModelError(f"{self.path}: missing tensor '{name}'")
        # llama.cpp creates the tensors its loader asks for and refuses a file holding any other
        # (done_getting_tensors: wrong number of tensors)
        dsv4 = self.backbone in (BACKBONE_DSV4, BACKBONE_DSV41)
        unused = [n for n in seen
                  if n not in want and not (dsv4 and n.endswith(".attn_output_a.weight"))]
        if unused:
            raise GGUFModelError(f"{self.path}: tensor '{unused[0]}' is not one this {self.variant} draft "
                                 f"({self.backbone} backbone) loads; llama.cpp refuses a file with tensors it does not "
                                 f"load (wrong number of tensors; expected {len(seen)}, got {len(seen) - len(unused)})")
        for name, t in seen.items():
            shape = tuple(int(x) for x in t.shape)
            if name.endswith(".attn_output_a.weight") and self.backbone in (BACKBONE_DSV4, BACKBONE_DSV41):
                # TENSOR_ALLOW_RESHAPE: {H*D/G, R, G}, or written 2-D as {H*D/G, R*G}
                G_, R = hp.dsv4_o_group_count, hp.dsv4_o_lora_rank
                exp3 = (hp.n_head * hp.n_embd_head_k // G_, R, G_)
                if shape not in (exp3, (exp3[0], R * G_)):
                    raise GGUFModelError(f"{self.path}: tensor '{name}' has shape {list(shape)}, expected "
                                         f"{list(exp3)}")
                continue
            exp = want.get(name)
            if exp is None:
                continue
            if len(shape) != len(exp) or any(w is not None and w != s for w, s in zip(exp, shape)):
                raise GGUFModelError(f"{self.path}: tensor '{name}' has shape {list(shape)}, expected "
                                     f"{[w if w is not None else '*' for w in exp]}")
        # b11739's context takes a draft without either from the target model (ctx_other) and
        # asserts without one; graphgen borrows them from the target GGUF the same way
        missing = [n for n in ("token_embd.weight", "output.weight") if n not in seen]
        self.borrows = missing    # what the draft takes from its target (its metadata reads without one)
        if missing and self.target is not None:
            from .lender import Lender
            d2t = "d2t" in seen
            self.lender = Lender(self.target, self.path, hp.n_embd, missing,
                                 self._n_vocab_draft if d2t else (hp.n_vocab or None))
        if hp.n_vocab == 0 and ("token_embd.weight" in seen or self.lender is not None):
            hp.n_vocab = int(seen["token_embd.weight"].shape[1]) if "token_embd.weight" in seen else self.lender.n_vocab
            if "d2t" not in seen:
                self._n_vocab_draft = hp.n_vocab
        if hp.n_vocab and hp.mask_token_id >= hp.n_vocab:
            raise GGUFModelError(f"{self.path}: key 'tokenizer.ggml.mask_token_id' = {hp.mask_token_id} "
                                 f"is outside the vocabulary ({hp.n_vocab})")
        self._weight_bytes = check_tensor_data(reader, self.path, self.path.stat().st_size)
        # graph_dspark calls the Markov head without a hidden state, so upstream asserts on an RNN
        # head there; only the Mistral Large 4 backbone feeds it
        if "joint_proj.weight" in seen and self.backbone != BACKBONE_MISTRAL_LARGE4:
            raise GGUFModelError(f"{self.path}: tensor 'joint_proj.weight' (the DSpark RNN joint head) needs "
                                 f"the Mistral Large 4 backbone's hidden state; this draft's backbone is {self.backbone}")

    # -- upload -----------------------------------------------------------------------------
    def _new_tensors(self, ts: list):
        """A no-alloc context holding a ggml tensor for each of `ts`: (ctx, [(ggml tensor, reader tensor)])."""
        params = G.ggml_init_params(mem_size=G.ggml_tensor_overhead() * (len(ts) + 8), mem_buffer=None,
                                    no_alloc=True)
        ctx = G.ggml_init(params)
        self._ctx = ctx
        created = []
        for t in ts:
            shape = [int(x) for x in t.shape] + [1] * (4 - len(t.shape))
            n_dims = len(t.shape)
            if t.name.endswith(".attn_output_a.weight") and n_dims == 2 and self.hparams.dsv4_o_group_count:
                # a 2-D wo_a is the 3-D one with its last two dims merged
                g_ = self.hparams.dsv4_o_group_count
                shape, n_dims = [shape[0], shape[1] // g_, g_, 1], 3
            gt = G.ggml_new_tensor(ctx, int(t.tensor_type), n_dims, (ctypes.c_int64 * 4)(*shape))
            G.set_name(gt, t.name)
            if G.ggml_nbytes(gt) != int(t.n_bytes):
                raise GGUFModelError(f"{self.path}: tensor '{t.name}' holds {int(t.n_bytes)} bytes, ggml "
                                     f"expects {G.ggml_nbytes(gt)} for its type and shape")
            created.append((gt, t))
        return ctx, created

    def upload(self, backend):
        if self.borrows and self.lender is None:
            raise GGUFModelError(f"{self.path}: the draft has no '{self.borrows[0]}': it borrows the target model's "
                                 "(llama.cpp's ctx_other); give the target too (-m TARGET.gguf -md DRAFT.gguf)")
        reader = self._reader
        n = len(reader.tensors)
        host = bool(G.ggml_backend_is_cpu(backend))
        if host:
            # a refusal beats the OOM killer; device memory is the device backend's to refuse
            check_memory(self._weight_bytes, self.path, f"the {n} weight tensors")
        if self.use_mmap:
            self._map = MappedFile(self.path)
            if self._map.stamp != self._stamp:
                self._map.close()
                self._map = None
                raise GGUFModelError(f"{self.path}: the file changed on disk since its metadata was read; load it again")
        in_place = self.use_mmap and host
        try:
            ctx, created = self._new_tensors(reader.tensors)
            if in_place:
                buf = self._map_buffer(created)
            else:
                buf = G.ggml_backend_alloc_ctx_tensors(ctx, backend)
                if not buf:
                    raise GGUFModelError(f"{self.path}: could not allocate the weights on the backend")
                self._buf = buf
                if self._map is not None:
                    # uploaded from the mapping, which goes once the device holds the weights
                    # (upstream unmaps what it uploaded)
                    for gt, t in created:
                        G.ggml_backend_tensor_set(gt, self._map.addr + int(t.data_offset), 0, int(t.n_bytes))
                    self._map.close()
                    self._map = None
                else:
                    self._read_into(created, bool(G.ggml_backend_buffer_is_host(buf)))
        except BaseException:
            self.close()
            raise
        self._buf = buf
        self.tensors = {t.name: gt for gt, t in created}
        self.n_mapped = len(created) if in_place else 0
        self.backend = backend
        t = self.tensors
        bind(self, arch.MODEL_TENSORS, t)
        if self.lender is not None:
            try:
                self.lender.upload(backend, self.use_mmap)
            except BaseException:
                self.close()
                raise
            self.tok_embd = self.tok_embd if self.tok_embd is not None else self.lender.tok_embd
            self.output = self.output if self.output is not None else self.lender.output
        self.layers = [Layer(il, t) for il in range(self.hparams.n_layer)]
        # every head's tensors; those of another head than the draft's stay None
        for head in arch.HEADS.values():
            mine = t if head is self.head else {}
            bind(self, head.tensors, mine)
            if head.bind is not None:
                head.bind(self, mine)

    def _map_buffer(self, created: list):
        """A CPU buffer over the whole mapped file, each tensor pointed at its bytes in it."""
        m = self._map
        # ggml asserts the buffer's alignment; the GGUF's own check (ggufile.check_layout)
        # refused any tensor off it, as llama.cpp does, so a failure here is a bug, said in a line
        align = G.ggml_backend_buft_get_alignment(G.ggml_backend_cpu_buffer_type())
        bad = [t.name for _, t in created if (m.addr + int(t.data_offset)) % align]
        if m.addr % align or bad:
            raise GGUFModelError(f"{self.path}: cannot compute in place on the mapped file: "
                                 f"{'tensor ' + repr(bad[0]) if bad else 'the mapping'} is not {align}-byte aligned; "
                                 "run with --no-mmap")
        buf = G.ggml_backend_cpu_buffer_from_ptr(m.addr, m.size)
        if not buf:
            raise GGUFModelError(f"{self.path}: ggml could not wrap the mapped file in a buffer")
        self._buf = buf
        for gt, t in created:
            if G.ggml_backend_tensor_alloc(buf, gt, m.addr + int(t.data_offset)) != 0:
                raise GGUFModelError(f"{self.path}: ggml could not place tensor '{t.name}' in the mapped file")
        return buf

    def _read_into(self, created: list, host: bool):
        """--no-mmap: read each tensor from the file into its buffer (straight into host memory,
        through a bounded staging buffer for a device)."""
        chunk = bytearray(min(64 << 20, max(int(t.n_bytes) for _, t in created)))
        with open(self.path, "rb", buffering=0) as f:
            st = os.fstat(f.fileno())
            if (st.st_size, st.st_mtime_ns) != self._stamp:
                raise GGUFModelError(f"{self.path}: the file changed on disk since its metadata was read; "
                                     "load it again")
            for gt, t in created:
                off, n = int(t.data_offset), int(t.n_bytes)
                done = 0
                while done < n:
                    if host:
                        view = memoryview((ctypes.c_char * (n - done)).from_address(gt.contents.data + done)).cast("B")
                    else:
                        view = memoryview(chunk)[:min(len(chunk), n - done)]
                    got = os.preadv(f.fileno(), [view], off + done)
                    if got <= 0:
                        raise GGUFModelError(f"{self.path}: tensor '{t.name}' could not be read whole "
                                             "(the file shrank while loading)")
                    if not host:
                        G.ggml_backend_tensor_set(gt, (ctypes.c_char * got).from_buffer(chunk), done, got)
                    done += got

    def check_file(self):
        """Refuse to compute on mapped weights whose file changed in place since it was mapped."""
        if self.lender is not None:
            self.lender.check_file()
        m = self._map
        if m is not None:
            why = m.changed()
            if why is not None:
                raise GGUFModelError(f"{self.path}: the file changed on disk while its weights were mapped "
                                     f"({why}); load it again, or run with --no-mmap to hold a copy")

    @property
    def buffer(self):
        """The backend buffer holding the weights (None before upload): on the CPU with mmap, a
        buffer over the mapped file."""
        return self._buf

    @property
    def mapping(self):
        """(address, size) of the mapped file while weights are used in place, else None."""
        return None if self._map is None else (self._map.addr, self._map.size)

    @property
    def weight_bytes(self) -> int:
        return sum(int(t.n_bytes) for t in self._reader.tensors)

    def tensor_table(self) -> list[tuple[str, str, list]]:
        return [(t.name, t.tensor_type.name, [int(x) for x in t.shape]) for t in self._reader.tensors]

    def close(self):
        if getattr(self, "lender", None) is not None:
            self.lender.close()
        # the buffer before the mapping it points into
        if getattr(self, "_buf", None):
            G.ggml_backend_buffer_free(self._buf)
            self._buf = None
        if getattr(self, "_ctx", None):
            G.ggml_free(self._ctx)
            self._ctx = None
        if getattr(self, "_map", None) is not None:
            self._map.close()
            self._map = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def load(path, backend=None, use_mmap: bool | None = None, target=None) -> Model:
    """Read a draft GGUF; with a backend the weights are placed on it (mapped, or copied with
    use_mmap=False; None: the process's default, mmap unless a command runs with --no-mmap).
    `target`: the target GGUF that lends a draft without them its token embeddings and lm head."""
    return Model(path, backend, use_mmap, target)
