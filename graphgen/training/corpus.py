"""The target's side of training: its greedy continuations of the prompts, with every decoded row's
draft-layer inputs (b11739, the features it will hand the draft at run time) and best tokens, and
the target's embedding table and folder as the authors' classes load them."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .common import TOP_KEPT, TrainError, _clock


def authors_layer_ids(n_target_layers: int, n_features: int) -> list[int]:
    """The authors' spread of `n_features` target layers (dflash's build_target_layer_ids), in their
    numbering: feature k is the output of layer ids[k], the input of layer ids[k] + 1."""
    from dflash.model import build_target_layer_ids
    return [int(i) for i in build_target_layer_ids(n_target_layers, n_features)]


@dataclass
class Corpus:
    """The target's continuations: per sequence its tokens (prompt then generated), where the
    generated part starts, and the features of every decoded row (all tokens but the last, which
    the target sampled and never decoded), float16 [n_tokens - 1, len(layers) * n_embd]."""
    layers: list[int]                   # layer-input indices (the GGUF's dflash.target_layers)
    tokens: list[np.ndarray]
    starts: list[int]
    features: list[np.ndarray]
    seconds: float = 0.0
    meta: dict = field(default_factory=dict)
    # the target's best TOP_KEPT tokens and logits at every decoded row (the soft labels of distillation)
    top_ids: list[np.ndarray] = field(default_factory=list)
    top_logits: list[np.ndarray] = field(default_factory=list)

    def save(self, path: Path) -> None:
        lens = np.array([len(t) for t in self.tokens], dtype=np.int64)
        extra = {}
        if self.top_ids:
            extra = {"top_ids": np.concatenate(self.top_ids), "top_logits": np.concatenate(self.top_logits)}
        np.savez(path, layers=np.array(self.layers), lens=lens, starts=np.array(self.starts),
                 tokens=np.concatenate(self.tokens), features=np.concatenate(self.features),
                 meta=json.dumps({**self.meta, "seconds": self.seconds}), **extra)

    @classmethod
    def load(cls, path: Path) -> "Corpus":
        z = np.load(path)
        lens = z["lens"]
        tok_at = np.concatenate([[0], np.cumsum(lens)])
        feat_at = np.concatenate([[0], np.cumsum(lens - 1)])
        meta = json.loads(str(z["meta"]))

        def rows(name):
            if name not in z.files:
                return []
            a = z[name]     # each z[name] reads the whole array again: once per name
            return [a[feat_at[i]:feat_at[i + 1]] for i in range(len(lens))]
        tokens = z["tokens"]
        return cls([int(x) for x in z["layers"]],
                   [tokens[tok_at[i]:tok_at[i + 1]] for i in range(len(lens))],
                   [int(s) for s in z["starts"]], rows("features"),
                   float(meta.get("seconds", 0.0)), meta, rows("top_ids"), rows("top_logits"))

    @property
    def n_generated(self) -> int:
        return int(sum(len(t) - s for t, s in zip(self.tokens, self.starts)))


class _Recorder:
    """Stands in for the target in generate_alone and keeps every decoded row's features, so the
    continuations need no second pass to have them."""

    def __init__(self, target):
        self.target = target
        self.n_batch = target.n_batch
        self.rows: dict[tuple[int, int], tuple] = {}

    def decode(self, rows, full_logits: bool = False):
        ids, top, feats = self.target.decode(rows, full_logits)
        for (seq, _tok, pos), f, i, t in zip(rows, feats, ids, top):
            self.rows[(int(seq), int(pos))] = (f.astype(np.float16), i[:TOP_KEPT].astype(np.int32),
                                               t[:TOP_KEPT].astype(np.float16))
        return ids, top, feats

    def __getattr__(self, name):
        return getattr(self.target, name)


def generate_corpus(target_path, layers: list[int], prompts: list[str], *, n_predict: int, n_seq: int,
                    n_threads: int, log=None) -> Corpus:
    """Greedy continuations of every prompt by the target, `n_seq` sequences per batch."""
    from ..reference.session import ReferenceTarget
    from ..speculative.verifier import generate_alone
    log = log or (lambda s: None)
    t0 = time.perf_counter()
    tokens, starts, feats, top_ids, top_logits = [], [], [], [], []
    with ReferenceTarget(target_path, layers, n_ctx=n_seq * 256, n_batch=512, n_seq=n_seq,
                         n_threads=n_threads) as tg:
        tokenized = [tg.tokenize(p) for p in prompts]
        too_long = [p for p, t in zip(prompts, tokenized) if len(t) + n_predict > 256]
        if too_long:
            raise TrainError(f"prompt {too_long[0]!r}: longer than the 256 cells a sequence has")
        for b in range(0, len(prompts), n_seq):
            chunk = dict(enumerate(tokenized[b:b + n_seq]))
            rec = _Recorder(tg)
            out, _ = generate_alone(rec, chunk, n_predict)
            for seq, toks in out.items():
                tokens.append(np.array(toks, dtype=np.int32))
                starts.append(len(chunk[seq]))
                kept = [rec.rows[(seq, pos)] for pos in range(len(toks) - 1)]
                feats.append(np.stack([k[0] for k in kept]))
                top_ids.append(np.stack([k[1] for k in kept]))
                top_logits.append(np.stack([k[2] for k in kept]))
                tg.seq_rm(seq, -1, -1)
            done = min(b + n_seq, len(prompts))
            el = time.perf_counter() - t0
            n_gen = sum(len(t) - s for t, s in zip(tokens, starts))
            log(f"data: {done}/{len(prompts)} prompts, {n_gen} tokens generated, {n_gen / el:.1f} tokens/s, "
                f"{_clock(el / done * (len(prompts) - done))} left")
    return Corpus(list(layers), tokens, starts, feats, time.perf_counter() - t0, {}, top_ids, top_logits)


def embedding_table(gguf_path) -> np.ndarray:
    """The target's token embeddings, dequantized to float32 [n_vocab, n_embd]."""
    import gguf
    r = gguf.GGUFReader(str(gguf_path))
    t = next((t for t in r.tensors if t.name == "token_embd.weight"), None)
    if t is None:
        raise TrainError(f"{gguf_path}: no token_embd.weight")
    if any(x.name == "output.weight" for x in r.tensors):
        # the draft borrows the target's head; a separate one would have to be trained against too
        raise TrainError(f"{gguf_path}: has its own output.weight; training here ties the head to the embeddings")
    w = gguf.quants.dequantize(t.data, t.tensor_type)
    return np.ascontiguousarray(w.reshape(int(t.shape[1]), int(t.shape[0])), dtype=np.float32)


def _gguf_fields(gguf_path) -> dict:
    import gguf
    r = gguf.GGUFReader(str(gguf_path))
    out = {}
    for k, f in r.fields.items():
        if k.startswith("tokenizer.ggml.") and k not in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"):
            continue
        try:
            out[k] = f.contents()
        except Exception:  # noqa: BLE001  (fields gguf-py cannot render are not needed here)
            pass
    return out


def write_target_folder(gguf_path, out_dir) -> Path:
    """A HuggingFace folder for a llama-architecture target GGUF, holding what llama.cpp's converter
    reads of a draft's target (its config and tokenizer): the tokenizer rebuilt from the GGUF by
    transformers' own GGUF reader."""
    gguf_path, out = Path(gguf_path), Path(out_dir)
    kv = _gguf_fields(gguf_path)
    arch = kv.get("general.architecture")
    if arch != "llama":
        raise TrainError(f"{gguf_path}: architecture {arch!r}; the target folder is written for llama only")
    from transformers import AutoTokenizer
    out.mkdir(parents=True, exist_ok=True)
    n_embd, n_head = int(kv["llama.embedding_length"]), int(kv["llama.attention.head_count"])
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": n_embd, "intermediate_size": int(kv["llama.feed_forward_length"]),
        "num_hidden_layers": int(kv["llama.block_count"]), "num_attention_heads": n_head,
        "num_key_value_heads": int(kv["llama.attention.head_count_kv"]), "head_dim": n_embd // n_head,
        "rms_norm_eps": float(kv["llama.attention.layer_norm_rms_epsilon"]),
        "rope_theta": float(kv["llama.rope.freq_base"]), "max_position_embeddings": int(kv["llama.context_length"]),
        "vocab_size": int(kv.get("llama.vocab_size", 0)) or None, "tie_word_embeddings": True,
        "bos_token_id": int(kv["tokenizer.ggml.bos_token_id"]), "eos_token_id": int(kv["tokenizer.ggml.eos_token_id"]),
        "hidden_act": "silu", "torch_dtype": "float32",
    }
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tok.save_pretrained(str(out))
    return out
