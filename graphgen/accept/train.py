"""Training a z-lab DFlash draft for a real target on the target's own greedy continuations.

The target (a GGUF in llama.cpp b11739, ReferenceTarget) continues a few hundred prompts that are
written here from templates and word lists, and every decoded row's draft-layer inputs are kept:
the features b11739 will hand the draft at run time, so training runs no target in torch. The
draft is the authors' own `DFlashDraftModel`; the target's embedding table, dequantized from the
GGUF, is both its block embeddings and its tied lm head, frozen, as the draft borrows both at run
time.

Objective, as the authors' loop uses the model (dflash_generate): for an anchor position a, the
draft sees the target features of positions < a and the block [token a, mask x (B - 1)] at
positions a .. a + B - 1 (attention non-causal inside the block), and block row i predicts the
token at a + i. Many anchors of one sequence share a forward: each block's rows see only the
context before their anchor and their own block, by an explicit attention mask. Only anchors on
generated tokens are drawn, so every label is the target's own greedy choice.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..errors import GraphgenError

# a control token SmolLM2 never emits in text: the mask filling every drafted block
SMOLLM2_MASK_TOKEN = 16  # <empty_output>


class TrainError(GraphgenError):
    """Bad training settings or inputs; the message names them."""


# -- prompts --------------------------------------------------------------------------------------

_TOPICS = [
    "the ocean", "volcanoes", "the Roman Empire", "photosynthesis", "black holes", "honey bees", "the printing press",
    "jazz music", "the human heart", "glaciers", "the stock market", "electric cars", "ancient Egypt", "coffee",
    "the moon", "rain forests", "the internet", "chess", "vaccines", "the French Revolution", "earthquakes",
    "solar panels", "dinosaurs", "the immune system", "bread baking", "climate change", "the Silk Road", "whales",
    "quantum computers", "the Olympic Games", "democracy", "mountains", "rivers", "the brain", "tea", "bicycles",
    "deserts", "trains", "birds", "mathematics", "poetry", "libraries", "robots", "the weather", "gardening",
    "sleep", "friendship", "music theory", "the alphabet", "money", "cities", "farming", "islands", "bridges",
]
_PEOPLE = ["a young doctor", "an old fisherman", "a curious cat", "a lonely robot", "two sisters", "a baker",
           "a schoolteacher", "a detective", "a king", "a farmer", "a student", "an astronaut", "a painter",
           "a small dragon", "a group of friends", "a shy boy", "a brave girl", "a musician"]
_PLACES = ["in a small village", "on a distant planet", "in the mountains", "by the sea", "in a big city",
           "in a dark forest", "on a train", "in an old castle", "at school", "in the desert", "on an island"]
_THINGS = ["a computer", "a rainbow", "gravity", "a cell", "an atom", "a verb", "a volcano", "a budget", "a poem",
           "an algorithm", "a hurricane", "a vitamin", "an election", "a telescope", "a battery", "a fraction"]
_FOODS = ["pancakes", "tomato soup", "apple pie", "fried rice", "lemonade", "banana bread", "pasta salad",
          "vegetable curry", "chocolate cookies", "guacamole", "omelette", "pizza dough"]
_ACTIONS = ["learn a new language", "save money", "sleep better", "write an essay", "start running",
            "plant a tree", "study for an exam", "make friends", "cook rice", "fix a flat tire", "stay focused",
            "prepare for an interview", "clean a kitchen", "train a puppy"]
_LANGS = ["Python", "JavaScript", "C"]
_FUNCS = ["add two numbers", "reverse a string", "find the largest element of a list", "count the vowels in a word",
          "check whether a number is prime", "compute the factorial of n", "sort a list", "sum a list of numbers"]

_TEMPLATES = [
    "The history of {topic} begins",
    "Here are three facts about {topic}:\n1.",
    "Q: What is {thing}?\nA:",
    "Once upon a time, {person} lived {place}.",
    "How to {action}: a step-by-step guide.\n\nStep 1:",
    "Recipe for {food}\n\nIngredients:\n-",
    "{topic_cap} is important because",
    "Write a short poem about {topic}.\n\n",
    "In this essay, I will explain {topic}.",
    "Dear friend,\n\nI am writing to tell you about {topic}.",
    "The main difference between {topic} and {topic2} is",
    "# A {lang} function to {func}\n",
    "A list of tips to {action}:\n\n1.",
    "{person_cap} was walking {place} when",
    "Scientists have discovered that {topic}",
    "Explain {thing} to a five-year-old.\n\n",
    "Chapter 1\n\nIt was a cold morning {place}, and {person}",
    "The best way to learn about {topic} is",
    "Summary: {topic_cap} and its effects on everyday life.\n\n",
    "Question: Why do people enjoy {topic}?\nAnswer:",
]

_CHAT = "<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
_CHAT_QUESTIONS = ["What is {thing}?", "Tell me about {topic}.", "How do I {action}?", "Give me a recipe for {food}.",
                   "Write a story about {person} {place}.", "Why is {topic} interesting?"]


def _fill(template: str, rng: np.random.Generator) -> str:
    def pick(words):
        return words[int(rng.integers(len(words)))]
    topic, topic2 = pick(_TOPICS), pick(_TOPICS)
    person = pick(_PEOPLE)
    return template.format(topic=topic, topic2=topic2, topic_cap=topic[:1].upper() + topic[1:], thing=pick(_THINGS),
                           person=person, person_cap=person[:1].upper() + person[1:], place=pick(_PLACES),
                           food=pick(_FOODS), action=pick(_ACTIONS), lang=pick(_LANGS), func=pick(_FUNCS))


def training_prompts(n: int, seed: int, chat_share: float = 0.2) -> list[str]:
    """`n` distinct prompts drawn from the templates above (a share of them in SmolLM2's chat
    format), deterministic in `seed`; none equals a held-out prompt."""
    rng = np.random.default_rng(seed)
    out, seen = [], set(HELD_OUT_PROMPTS)
    for _ in range(n * 50):
        if len(out) == n:
            break
        if rng.random() < chat_share:
            text = _CHAT.format(q=_fill(_CHAT_QUESTIONS[int(rng.integers(len(_CHAT_QUESTIONS)))], rng))
        else:
            text = _fill(_TEMPLATES[int(rng.integers(len(_TEMPLATES)))], rng)
        if text not in seen:
            seen.add(text)
            out.append(text)
    if len(out) < n:
        raise TrainError(f"the templates give only {len(out)} distinct prompts; asked for {n}")
    return out


# written apart from the templates (no template or word list above makes them): the measurement's
HELD_OUT_PROMPTS = [
    "The capital of France is",
    "My favourite season of the year is autumn, because",
    "A good breakfast should include",
    "The three primary colors are",
    "Yesterday I went to the market and bought",
    "Water boils at 100 degrees Celsius, which means that",
]


# -- the target's side ----------------------------------------------------------------------------

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

    def save(self, path: Path) -> None:
        lens = np.array([len(t) for t in self.tokens], dtype=np.int64)
        np.savez(path, layers=np.array(self.layers), lens=lens, starts=np.array(self.starts),
                 tokens=np.concatenate(self.tokens), features=np.concatenate(self.features),
                 meta=json.dumps({**self.meta, "seconds": self.seconds}))

    @classmethod
    def load(cls, path: Path) -> "Corpus":
        z = np.load(path)
        lens = z["lens"]
        tok_at = np.concatenate([[0], np.cumsum(lens)])
        feat_at = np.concatenate([[0], np.cumsum(lens - 1)])
        meta = json.loads(str(z["meta"]))
        return cls([int(x) for x in z["layers"]],
                   [z["tokens"][tok_at[i]:tok_at[i + 1]] for i in range(len(lens))],
                   [int(s) for s in z["starts"]],
                   [z["features"][feat_at[i]:feat_at[i + 1]] for i in range(len(lens))],
                   float(meta.get("seconds", 0.0)), meta)

    @property
    def n_generated(self) -> int:
        return int(sum(len(t) - s for t, s in zip(self.tokens, self.starts)))


class _Recorder:
    """Stands in for the target in generate_alone and keeps every decoded row's features, so the
    continuations need no second pass to have them."""

    def __init__(self, target):
        self.target = target
        self.n_batch = target.n_batch
        self.rows: dict[tuple[int, int], np.ndarray] = {}

    def decode(self, rows, full_logits: bool = False):
        ids, top, feats = self.target.decode(rows, full_logits)
        for (seq, _tok, pos), f in zip(rows, feats):
            self.rows[(int(seq), int(pos))] = f.astype(np.float16)
        return ids, top, feats

    def __getattr__(self, name):
        return getattr(self.target, name)


def generate_corpus(target_path, layers: list[int], prompts: list[str], *, n_predict: int, n_seq: int,
                    n_threads: int, log=None) -> Corpus:
    """Greedy continuations of every prompt by the target, `n_seq` sequences per batch."""
    from ..reference.session import ReferenceTarget
    from ..verifier import generate_alone
    log = log or (lambda s: None)
    t0 = time.perf_counter()
    tokens, starts, feats = [], [], []
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
                feats.append(np.stack([rec.rows[(seq, pos)] for pos in range(len(toks) - 1)]))
                tg.seq_rm(seq, -1, -1)
            done = min(b + n_seq, len(prompts))
            el = time.perf_counter() - t0
            n_gen = sum(len(t) - s for t, s in zip(tokens, starts))
            log(f"data: {done}/{len(prompts)} prompts, {n_gen} tokens generated, {n_gen / el:.1f} tokens/s, "
                f"{_clock(el / done * (len(prompts) - done))} left")
    return Corpus(list(layers), tokens, starts, feats, time.perf_counter() - t0)


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
    from transformers import AutoTokenizer
    gguf_path, out = Path(gguf_path), Path(out_dir)
    kv = _gguf_fields(gguf_path)
    arch = kv.get("general.architecture")
    if arch != "llama":
        raise TrainError(f"{gguf_path}: architecture {arch!r}; the target folder is written for llama only")
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


# -- the draft ------------------------------------------------------------------------------------

@dataclass
class DraftShape:
    n_embd: int = 576
    n_head: int = 9
    n_head_kv: int = 3
    head_dim: int = 64
    n_ff: int = 320
    n_layer: int = 1
    block_size: int = 8
    n_vocab: int = 49152
    n_target_layers: int = 30
    target_layer_ids: list[int] = field(default_factory=lambda: [1, 14, 27])  # the authors' numbering
    mask_token_id: int = SMOLLM2_MASK_TOKEN
    rope_theta: float = 100000.0
    rms_eps: float = 1e-5
    max_positions: int = 8192


def draft_config(s: DraftShape):
    """A Qwen3Config the authors' DFlashDraftModel takes, carrying z-lab's dflash_config."""
    from transformers import Qwen3Config
    return Qwen3Config(hidden_size=s.n_embd, intermediate_size=s.n_ff, num_hidden_layers=s.n_layer,
                       num_attention_heads=s.n_head, num_key_value_heads=s.n_head_kv, head_dim=s.head_dim,
                       vocab_size=s.n_vocab, rms_norm_eps=s.rms_eps, max_position_embeddings=s.max_positions,
                       rope_parameters={"rope_type": "default", "rope_theta": s.rope_theta},
                       attention_bias=False, hidden_act="silu", tie_word_embeddings=False,
                       num_target_layers=s.n_target_layers,
                       dflash_config={"mask_token_id": s.mask_token_id, "block_size": s.block_size,
                                      "target_layer_ids": list(s.target_layer_ids)},
                       architectures=["DFlashDraftModel"])


@dataclass
class TrainSettings:
    steps: int = 600
    seqs_per_step: int = 8
    anchors_per_seq: int = 12
    lr: float = 2e-3
    warmup: int = 40
    weight_decay: float = 0.01
    negatives: int = 0          # 0: the whole vocabulary in every softmax; else the corpus's tokens + this many random
    decay: float = 4.0          # block row i's loss weight is exp(-(i - 1) / decay)
    seed: int = 0
    threads: int = 1            # on a shared 2-core machine one thread ran 4x faster than two (no OpenMP waits)
    val_seqs: int = 16          # sequences held out of training, their loss logged beside the training loss
    feature_dropout: float = 0.0  # dropout on the target features in training: a few thousand rows overfit fast
    keep_best: bool = True      # return the weights of the logged step with the lowest held-out CE


def _anchor_pool(corpus: Corpus, block: int) -> list[np.ndarray]:
    # an anchor is a generated token with at least one generated token after it to predict
    return [np.arange(s, len(t) - 1) for t, s in zip(corpus.tokens, corpus.starts)]


def make_batch(corpus: Corpus, seq_ids, anchors_per_seq: int, block: int, mask_id: int,
               rng: np.random.Generator, pool=None):
    """One step's tensors: context features, block tokens, positions, the attention mask, labels
    (-100 where nothing is predicted) and each label's block row."""
    import torch
    pool = pool or _anchor_pool(corpus, block)
    n = len(seq_ids)
    ctx_len = max(len(corpus.features[i]) for i in seq_ids)
    k = anchors_per_seq
    width = corpus.features[seq_ids[0]].shape[1]
    feats = np.zeros((n, ctx_len, width), dtype=np.float32)
    noise = np.full((n, k, block), mask_id, dtype=np.int64)
    labels = np.full((n, k, block), -100, dtype=np.int64)
    pos = np.zeros((n, ctx_len + k * block), dtype=np.int64)
    visible = np.zeros((n, k, block, ctx_len + k * block), dtype=bool)
    for row, i in enumerate(seq_ids):
        toks, f = corpus.tokens[i], corpus.features[i]
        feats[row, :len(f)] = f
        pos[row, :ctx_len] = np.arange(ctx_len)
        cand = pool[i]
        chosen = np.sort(rng.choice(cand, size=min(k, len(cand)), replace=False))
        for j in range(k):
            if j < len(chosen):
                a = int(chosen[j])
                noise[row, j, 0] = toks[a]
                end = min(a + block, len(toks))
                labels[row, j, 1:end - a] = toks[a + 1:end]
                visible[row, j, :, :a] = True           # the context before the anchor
            else:
                a = 0                                   # an unused slot: sees only its own block
            pos[row, ctx_len + j * block: ctx_len + (j + 1) * block] = a + np.arange(block)
            visible[row, j, :, ctx_len + j * block: ctx_len + (j + 1) * block] = True
    return (torch.from_numpy(feats), torch.from_numpy(noise.reshape(n, k * block)), torch.from_numpy(pos),
            torch.from_numpy(visible.reshape(n, 1, k * block, ctx_len + k * block)),
            torch.from_numpy(labels.reshape(n, k * block)))


def block_loss(model, embed, feats, noise, pos, visible, labels, block: int, decay: float, vocab=None):
    """Weighted cross-entropy of the block rows against the target's tokens (`embed`: the frozen
    bf16 table, block embeddings and head); also the top-1 hits of the first predicted row (what the
    first drafted token's acceptance rests on) and of all rows. With `vocab` (sorted token ids that
    hold every label) the softmax runs over those tokens only, the head's cost cut to their share."""
    import torch
    import torch.nn.functional as F
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = model(position_ids=pos, attention_mask=visible, noise_embedding=embed[noise].to(torch.bfloat16),
                       target_hidden=feats)
    n, rows = labels.shape
    in_block = torch.arange(rows) % block
    keep = (labels >= 0)
    h = hidden[keep]
    y = labels[keep]
    r = in_block.expand(n, rows)[keep]
    if vocab is not None:
        y = torch.searchsorted(vocab, y)
        logits = (h.to(torch.bfloat16) @ embed[vocab].T).float()
    else:
        logits = (h.to(torch.bfloat16) @ embed.T).float()
    ce = F.cross_entropy(logits, y, reduction="none")
    w = torch.exp(-(r.float() - 1) / decay)
    loss = (ce * w).sum() / w.sum()
    with torch.no_grad():
        hit = logits.argmax(-1) == y
        first = r == 1
        stats = {"ce": float(ce.mean()), "acc1": float(hit[first].float().mean()) if first.any() else 0.0,
                 "acc": float(hit.float().mean()), "n": int(y.numel())}
    return loss, stats


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}:{seconds % 60:02d}"


def train(corpus: Corpus, embed_np: np.ndarray, shape: DraftShape, st: TrainSettings, log=None):
    """Trains a fresh DFlashDraftModel; returns (model, history of {step, loss, ce, acc1, acc})."""
    import torch
    from dflash.model import DFlashDraftModel
    log = log or (lambda s: None)
    torch.set_num_threads(st.threads)
    torch.manual_seed(st.seed)
    rng = np.random.default_rng(st.seed)
    model = DFlashDraftModel(draft_config(shape))
    model.train()
    # a frozen bf16 copy: the block embeddings and the tied head, as the draft borrows them
    embed = torch.from_numpy(embed_np).to(torch.bfloat16)
    decay_params = [p for n, p in model.named_parameters() if p.dim() > 1]
    other_params = [p for n, p in model.named_parameters() if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay_params, "weight_decay": st.weight_decay},
                             {"params": other_params, "weight_decay": 0.0}], lr=st.lr, betas=(0.9, 0.95))

    def lr_at(step):
        if step < st.warmup:
            return st.lr * (step + 1) / st.warmup
        frac = (step - st.warmup) / max(1, st.steps - st.warmup)
        return st.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    pool = _anchor_pool(corpus, shape.block_size)
    seen = torch.unique(torch.from_numpy(np.concatenate(corpus.tokens).astype(np.int64)))
    usable = [int(i) for i in rng.permutation([i for i, p in enumerate(pool) if len(p)])]
    val_ids, usable = usable[:st.val_seqs], usable[st.val_seqs:]
    # one fixed batch of the held-out sequences, up to 32 anchors each
    val_batch = make_batch(corpus, val_ids, 32, shape.block_size, shape.mask_token_id,
                           np.random.default_rng(st.seed + 1), pool) if val_ids else None

    def validate():
        if val_batch is None:
            return {}
        with torch.no_grad():
            _, vs = block_loss(model, embed, *val_batch, block=shape.block_size, decay=st.decay)
        return {"val_ce": round(vs["ce"], 4), "val_acc1": round(vs["acc1"], 4), "val_acc": round(vs["acc"], 4)}
    history, window, best = [], [], None
    t0 = last = time.perf_counter()
    order = np.array(usable)
    at = 0
    for step in range(st.steps):
        if at + st.seqs_per_step > len(order):
            order, at = rng.permutation(usable), 0
        seq_ids = [int(i) for i in order[at:at + st.seqs_per_step]]
        at += st.seqs_per_step
        batch = make_batch(corpus, seq_ids, st.anchors_per_seq, shape.block_size, shape.mask_token_id, rng, pool)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        vocab = None
        if st.negatives:
            # every token of the data, and a fresh random draw of the others, pushed down too
            others = torch.from_numpy(rng.choice(shape.n_vocab, size=st.negatives, replace=False))
            vocab = torch.unique(torch.cat([seen, others]))
        if st.feature_dropout:
            batch = (torch.nn.functional.dropout(batch[0], st.feature_dropout), *batch[1:])
        loss, stats = block_loss(model, embed, *batch, block=shape.block_size, decay=st.decay, vocab=vocab)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        window.append({"loss": loss.item(), **stats})
        now = time.perf_counter()
        if now - last > 15 or step + 1 == st.steps:
            last = now
            rate = (step + 1) / (now - t0)
            mean = {k: float(np.mean([w[k] for w in window])) for k in ("loss", "ce", "acc1", "acc")}
            model.eval()
            val = validate()
            model.train()
            if val and (best is None or val["val_ce"] < best[0]):
                best = (val["val_ce"], step + 1, {k: v.detach().clone() for k, v in model.state_dict().items()})
            history.append({"step": step + 1, "seconds": round(now - t0, 1), **{k: round(v, 4) for k, v in mean.items()},
                            **val})
            window = []
            vtext = f"; held out: CE {val['val_ce']:.3f}, first-row top-1 {val['val_acc1']:.3f}" if val else ""
            log(f"train: step {step + 1}/{st.steps}, loss {mean['loss']:.3f}, CE {mean['ce']:.3f}, first-row top-1 "
                f"{mean['acc1']:.3f}, all rows {mean['acc']:.3f}{vtext}, {rate:.2f} steps/s, "
                f"{_clock((st.steps - step - 1) / rate)} left")
    model.eval()
    if st.keep_best and best is not None:
        model.load_state_dict(best[2])
        log(f"train: kept step {best[1]}'s weights (held-out CE {best[0]:.3f})")
        history.append({"kept_step": best[1]})
    return model, history, time.perf_counter() - t0


def save_checkpoint(model, out_dir, dtype: str = "bfloat16") -> Path:
    """The authors' save_pretrained, weights in `dtype` to stay small."""
    import torch
    from ..authors.forward import quiet_transformers
    quiet_transformers()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.to(getattr(torch, dtype)).save_pretrained(str(out))
    return out


def stderr_log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def summary_dict(corpus: Corpus, shape: DraftShape, st: TrainSettings, history, seconds: float) -> dict:
    return {"data": {"sequences": len(corpus.tokens), "generated_tokens": corpus.n_generated,
                     "seconds": round(corpus.seconds, 1), "layers": corpus.layers, **corpus.meta},
            "shape": asdict(shape), "train": asdict(st), "seconds": round(seconds, 1), "history": history}
