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
# the target's own name, which a speculators draft's config gives as its verifier
SMOLLM2_VERIFIER = "HuggingFaceTB/SmolLM2-135M-Instruct"


# the target's best tokens kept per decoded row: enough of its distribution to distil (the rest of
# the mass is small after 16 for a 135M model's greedy text)
TOP_KEPT = 16


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
    "I have always wondered how {thing} works.",
    "The teacher asked the class to describe {topic}.",
    "Last summer, {person} decided to {action}.",
    "Most people do not know that {topic}",
    "Here is a simple explanation of {thing}:",
    "When I was a child, I loved {food}, and",
    "The museum had a new exhibition about {topic}.",
    "There are many reasons to {action}.",
    "{person_cap} opened the door and saw",
    "According to experts, the future of {topic}",
    "Notes from today's lecture on {topic}:\n\n-",
    "If you want to {action}, you should",
    "The old book on the shelf was about {topic}.",
    "Breaking news: a new study about {topic} shows",
    "My grandmother's recipe for {food} is simple.",
    "Let me tell you a story about {person} {place}.",
    "Pros and cons of {topic}:\n\nPros:\n-",
    "It is easy to confuse {thing} with",
    "Every morning, {person} would",
    "The word \"{topic}\" comes from",
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

# which authors' class each trained variant is (graphgen.authors.checkpoint builds them)
VARIANT_AUTHORS = {"dflash": "zlab", "dflash2": "zlab", "dspark": "speculators"}


@dataclass
class DraftShape:
    variant: str = "dflash"
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
    # DFlash2: the block's grouped dynamic convolutions and the candidate selector
    conv_kernel: int = 3
    conv_group: int = 64
    selector_rank: int = 8
    selector_top_k: int = 8
    # DSpark: the Markov head's rank and the draft vocabulary (the corpus's most frequent tokens)
    markov_rank: int = 8
    draft_vocab: int = 3072

    @property
    def authors(self) -> str:
        return VARIANT_AUTHORS[self.variant]

    @property
    def offset(self) -> int:
        """Block row i predicts the token at anchor + i + offset: z-lab's rows start at the anchor
        (row 0 predicts nothing), speculators' DSpark samples from the anchor (sample_from_anchor)."""
        return 1 if self.variant == "dspark" else 0

    def spec(self):
        """The same draft as graphgen.authors.checkpoint's HFSpec, which builds the authors' classes."""
        from ..authors.checkpoint import HFSpec
        if self.variant not in VARIANT_AUTHORS:
            raise TrainError(f"--variant {self.variant}: trained variants are {', '.join(VARIANT_AUTHORS)}")
        return HFSpec(variant=self.variant, authors=self.authors, n_embd=self.n_embd, n_layer=self.n_layer,
                      n_head=self.n_head, n_head_kv=self.n_head_kv, head_dim=self.head_dim, n_ff=self.n_ff,
                      n_vocab=self.n_vocab, block_size=self.block_size,
                      target_layers=[i + 1 for i in self.target_layer_ids], n_target_layers=self.n_target_layers,
                      mask_token_id=self.mask_token_id, rope_theta=self.rope_theta, rms_eps=self.rms_eps,
                      conv_kernel=self.conv_kernel, conv_group=self.conv_group, selector_rank=self.selector_rank,
                      selector_top_k=self.selector_top_k, markov_rank=self.markov_rank, conf=True,
                      sample_from_anchor=True,
                      d2t_vocab=self.draft_vocab if self.variant == "dspark" else None).resolved()


def draft_vocabulary(corpus: "Corpus", size: int, n_vocab: int) -> np.ndarray:
    """The `size` tokens the corpus holds most often (ties to the lower id), sorted: a DSpark draft
    vocabulary, as speculators builds one from its training data's token counts."""
    counts = np.bincount(np.concatenate(corpus.tokens).astype(np.int64), minlength=n_vocab)
    order = np.lexsort((np.arange(n_vocab), -counts))
    return np.sort(order[:size])


def new_draft(shape: DraftShape, embed_np: np.ndarray, target_folder: Path | None = None, vocab=None):
    """A fresh authors' draft of `shape`: z-lab's DFlashDraftModel / DFlash2DraftModel, or
    speculators' DSparkDraftModel (its verifier config read from `target_folder`, its draft
    vocabulary `vocab`, its embeddings the target's, its own head started from the target's rows)."""
    import torch
    from ..authors import checkpoint as C
    s = shape.spec()
    if shape.authors == "zlab":
        model = C._zlab_model(s)
        for layer in model.layers:
            for conv in (layer.attention_conv, layer.mlp_conv):
                if conv is not None:
                    # z-lab leaves the kernels uninitialized (torch.empty): start both as the identity,
                    # as speculators' reset_parameters does
                    with torch.no_grad():
                        conv.base_kernel.zero_()
                        conv.base_kernel[:, 0].fill_(1.0)
                        conv.kernel_projection.weight.zero_()
        return model
    if target_folder is None or vocab is None:
        raise TrainError("a speculators draft needs its target's folder and a draft vocabulary")
    model = C._speculators_model(s, Path(target_folder))
    ids = torch.as_tensor(np.asarray(vocab), dtype=torch.long)
    if len(ids) != shape.draft_vocab:
        raise TrainError(f"draft vocabulary of {len(ids)} tokens; the shape says {shape.draft_vocab}")
    t2d = torch.zeros(shape.n_vocab, dtype=torch.bool)
    t2d[ids] = True
    model.load_vocab_mappings(t2d, ids - torch.arange(len(ids)))
    embed = torch.from_numpy(embed_np)
    with torch.no_grad():
        model.embed_tokens.weight.copy_(embed)
        model.lm_head.weight.copy_(embed[ids])
        if getattr(model, "verifier_lm_head", None) is not None:
            model.verifier_lm_head.weight.copy_(embed[ids])
    for name in ("embed_tokens", "verifier_lm_head", "verifier_norm"):
        mod = getattr(model, name, None)
        if mod is not None:
            mod.requires_grad_(False)
    return model


class _BlockwiseConvs:
    """DFlash2's convolutions run along a block's rows; a training forward lays many blocks end to
    end, so while it runs each convolution sees one block at a time (as in the authors' loop, where
    a forward holds one block)."""

    def __init__(self, model, block: int):
        self.convs = [c for layer in model.layers for c in (getattr(layer, "attention_conv", None),
                                                          getattr(layer, "mlp_conv", None)) if c is not None]
        self.block = block

    def __enter__(self):
        b = self.block
        for conv in self.convs:
            prepare, finish = type(conv).prepare.__get__(conv), type(conv).finish.__get__(conv)

            def p(h, prepare=prepare):
                n, rows, width = h.shape
                out, dyn = prepare(h.reshape(n * rows // b, b, width))
                return out.reshape(n, rows, width), dyn.reshape(n, rows, *dyn.shape[2:])

            def f(h, dyn, finish=finish):
                n, rows, width = h.shape
                return finish(h.reshape(-1, b, width), dyn.reshape(-1, b, *dyn.shape[2:])).reshape(n, rows, width)
            conv.prepare, conv.finish = p, f
        return self

    def __exit__(self, *exc):
        for conv in self.convs:
            del conv.prepare, conv.finish


@dataclass
class TrainSettings:
    steps: int = 1500
    seqs_per_step: int = 8
    anchors_per_seq: int = 12
    lr: float = 2e-3
    warmup: int = 60
    weight_decay: float = 0.1
    decay: float = 4.0          # the loss weight of drafted token d (0 = the first) is exp(-d / decay)
    negatives: int = 4096       # z-lab: random tokens beyond the data's in each step's softmax (0: the whole vocabulary)
    distill: float = 0.5        # the share of the loss on the target's top-TOP_KEPT distribution (soft labels)
    selector_alpha: float = 1.0  # DFlash2: weight of the selector's K-way loss
    confidence_alpha: float = 0.1  # DSpark: weight of the confidence head's loss
    seed: int = 0
    threads: int = 1            # on a shared 2-core machine one thread ran 4x faster than two (no OpenMP waits)
    val_seqs: int = 24          # sequences held out of training, their loss logged beside the training loss
    feature_dropout: float = 0.1  # dropout on the target features in training
    keep_best: bool = True      # return the weights of the logged step with the lowest held-out CE


def _anchor_pool(corpus: Corpus, offset: int) -> list[np.ndarray]:
    # an anchor is a generated token with at least one generated token to predict after it
    return [np.arange(s, len(t) - 1) for t, s in zip(corpus.tokens, corpus.starts)]


@dataclass
class Batch:
    feats: object      # [n, ctx, width] the target features of every sequence
    noise: object      # [n, k * B] block tokens (anchor, then the mask)
    pos: object        # [n, ctx + k * B]
    visible: object    # [n, 1, k * B, ctx + k * B] the attention mask
    labels: object     # [n, k * B] the target's token each row predicts, -100 where none
    draft_index: object  # [n, k * B] which drafted token a row is (0 = the first), -1 where none
    prev: object       # [n, k * B] the token before each row's label (the selector's and Markov head's input)
    soft_ids: object   # [n, k * B, TOP_KEPT] the target's best tokens at each row's label (or None)
    soft_logits: object


def make_batch(corpus: Corpus, seq_ids, anchors_per_seq: int, block: int, mask_id: int,
               rng: np.random.Generator, pool=None, offset: int = 0) -> Batch:
    """One step's tensors: `anchors_per_seq` blocks per sequence; block row i predicts the token at
    anchor + i + offset (rows that would predict the anchor itself or beyond the sequence get -100)."""
    import torch
    pool = pool or _anchor_pool(corpus, offset)
    n = len(seq_ids)
    ctx_len = max(len(corpus.features[i]) for i in seq_ids)
    k = anchors_per_seq
    width = corpus.features[seq_ids[0]].shape[1]
    soft = bool(corpus.top_ids)
    feats = np.zeros((n, ctx_len, width), dtype=np.float32)
    noise = np.full((n, k, block), mask_id, dtype=np.int64)
    labels = np.full((n, k, block), -100, dtype=np.int64)
    index = np.full((n, k, block), -1, dtype=np.int64)
    prev = np.zeros((n, k, block), dtype=np.int64)
    soft_ids = np.zeros((n, k, block, TOP_KEPT), dtype=np.int64) if soft else None
    soft_logits = np.full((n, k, block, TOP_KEPT), -np.inf, dtype=np.float32) if soft else None
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
                for r in range(block):
                    p = a + r + offset          # the position row r predicts
                    if p <= a or p >= len(toks):
                        continue
                    labels[row, j, r] = toks[p]
                    index[row, j, r] = p - a - 1
                    prev[row, j, r] = toks[p - 1]
                    if soft:
                        # the target's distribution of the token at p: its logits at decoded row p - 1
                        soft_ids[row, j, r] = corpus.top_ids[i][p - 1]
                        soft_logits[row, j, r] = corpus.top_logits[i][p - 1]
                visible[row, j, :, :a] = True           # the context before the anchor
            else:
                a = 0                                   # an unused slot: sees only its own block
            pos[row, ctx_len + j * block: ctx_len + (j + 1) * block] = a + np.arange(block)
            visible[row, j, :, ctx_len + j * block: ctx_len + (j + 1) * block] = True
    t = torch.from_numpy
    return Batch(t(feats), t(noise.reshape(n, k * block)), t(pos),
                 t(visible.reshape(n, 1, k * block, ctx_len + k * block)), t(labels.reshape(n, k * block)),
                 t(index.reshape(n, k * block)), t(prev.reshape(n, k * block)),
                 t(soft_ids.reshape(n, k * block, TOP_KEPT)) if soft else None,
                 t(soft_logits.reshape(n, k * block, TOP_KEPT)) if soft else None)


def block_hidden(model, shape: DraftShape, embed, b: Batch, bf16: bool = True):
    """The block rows after the draft's final norm, [n, k * B, n_embd], through the authors' modules:
    z-lab's forward as dflash_generate calls it; speculators' modules in their _backbone_forward's
    order (fc, hidden_norm, rotary, each layer, norm), with this batch's mask. Each block's rows
    equal what the authors' inference computes for that block alone (tests/accept/test_train.py)."""
    import torch
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        if shape.authors == "zlab":
            with _BlockwiseConvs(model, shape.block_size):
                return model(position_ids=b.pos, attention_mask=b.visible,
                             noise_embedding=embed[b.noise].to(torch.bfloat16 if bf16 else embed.dtype),
                             target_hidden=b.feats)
        m = model
        target = m.hidden_norm(m.fc(b.feats))
        h = m.embed_tokens(b.noise)
        pos_emb = m.rotary_emb(h, b.pos)
        for layer in m.layers:
            h = layer(target_hidden=target, hidden_states=h, position_ids=b.pos, attention_mask=b.visible,
                      use_cache=False, position_embeddings=pos_emb)
        return m.norm(h)


@dataclass
class Columns:
    """The vocabulary a training softmax runs over: `ids` (sorted token ids) and `cmap`, each
    token's column or -1."""
    ids: object
    cmap: object

    @classmethod
    def of(cls, ids, n_vocab: int) -> "Columns":
        import torch
        ids = torch.as_tensor(np.asarray(ids), dtype=torch.long)
        cmap = torch.full((n_vocab,), -1, dtype=torch.long)
        cmap[ids] = torch.arange(len(ids))
        return cls(ids, cmap)


def block_loss(model, shape: DraftShape, embed, b: Batch, st: TrainSettings, cols=None):
    """The weighted loss of the block rows against the target: cross-entropy on its greedy token,
    mixed with its top-TOP_KEPT distribution (distillation); DFlash2 adds its selector's K-way loss
    over the unary top-k (the target's token put in at rank K when missing, as speculators trains
    it), DSpark its Markov bias on the logits and its confidence head's loss. Also the top-1 hits of
    the first drafted token and of all rows (teacher-forced, through the selector / Markov head)."""
    import torch
    import torch.nn.functional as F
    hidden = block_hidden(model, shape, embed, b)
    n, rows = b.labels.shape
    keep = b.labels >= 0
    y = b.labels[keep]
    d = b.draft_index[keep]
    prev = b.prev[keep]
    h = hidden[keep]
    conf_logit = None
    # cols: the vocabulary the softmax runs over (token ids), cmap: a token's column there or -1
    if shape.authors == "zlab":
        table = embed if cols is None else embed[cols.ids]
        logits = (h.to(torch.bfloat16) @ table.T).float()
    else:
        m = model
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = m.lm_head(h).float()
        logits = logits + m.markov_head.block_bias(prev_token_ids=prev[:, None], hidden_states=h[:, None])[:, 0].float()
        if m.confidence_head is not None:
            feats = torch.cat([h.float(), m.markov_head.prev_embeddings(prev).float()], -1) \
                if m.config.confidence_head_with_markov else h.float()
            conf_logit = m.confidence_head(feats)
    yv = y if cols is None else cols.cmap[y]      # the label's column, -1 outside the softmax's vocabulary
    w = torch.exp(-d.float() / st.decay)
    logp = F.log_softmax(logits, -1)
    inside = yv >= 0
    ce = torch.where(inside, -logp.gather(-1, yv.clamp(min=0)[:, None])[:, 0], torch.zeros_like(w))
    loss_rows = ce
    if st.distill and b.soft_ids is not None:
        sid = b.soft_ids[keep]
        slog = b.soft_logits[keep].float()
        if cols is not None:
            sid = cols.cmap[sid]
            slog = torch.where(sid >= 0, slog, torch.full_like(slog, float("-inf")))
        # a row whose whole top lies outside the vocabulary has no soft label (softmax of -inf: NaN)
        p = torch.softmax(slog, -1).nan_to_num(0.0)
        kd = -(p * logp.gather(-1, sid.clamp(min=0))).sum(-1)
        loss_rows = (1 - st.distill) * ce + st.distill * kd
    wi = w * inside.float()
    loss = (loss_rows * wi).sum() / wi.sum().clamp(min=1e-9)
    with torch.no_grad():
        pick = logits.argmax(-1)
    if shape.variant == "dflash2":
        sel = model.candidate_selector
        cand = torch.topk(logits.detach(), sel.top_k, dim=-1).indices
        match = cand.eq(yv[:, None])
        has = match.any(-1)
        tpos = torch.where(has, match.long().argmax(-1), torch.full_like(yv, sel.top_k - 1))
        cand = cand.clone()
        cand[:, -1] = torch.where(has, cand[:, -1], yv.clamp(min=0))
        cand_ids = cand if cols is None else cols.ids[cand]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ctx = sel.predecessor_codebook(prev) * sel.hidden_projection(h)
        scores = logits.gather(-1, cand) + (ctx.float()[:, None, :] * sel.successor_codebook(cand_ids).float()).sum(-1)
        sel_ce = F.cross_entropy(scores, tpos, reduction="none")
        loss = loss + st.selector_alpha * (sel_ce * wi).sum() / wi.sum().clamp(min=1e-9)
        with torch.no_grad():
            pick = cand.gather(-1, scores.argmax(-1)[:, None])[:, 0]   # what the selector drafts
    hit = (pick == yv) & inside
    if conf_logit is not None:
        loss = loss + st.confidence_alpha * (F.binary_cross_entropy_with_logits(
            conf_logit.float(), hit.float(), reduction="none") * w).sum() / w.sum()
    with torch.no_grad():
        first = d == 0
        stats = {"ce": float(ce[inside].mean()) if inside.any() else 0.0,
                 "acc1": float(hit[first].float().mean()) if first.any() else 0.0,
                 "acc": float(hit.float().mean()), "n": int(y.numel())}
    return loss, stats


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}:{seconds % 60:02d}"


def train(corpus: Corpus, embed_np: np.ndarray, shape: DraftShape, st: TrainSettings, log=None,
          target_folder: Path | None = None):
    """Trains a fresh authors' draft of `shape`; returns (model, history of {step, loss, ce, acc1, acc},
    seconds)."""
    import torch
    log = log or (lambda s: None)
    torch.set_num_threads(st.threads)
    torch.manual_seed(st.seed)
    rng = np.random.default_rng(st.seed)
    vocab = draft_vocabulary(corpus, shape.draft_vocab, shape.n_vocab) if shape.authors == "speculators" else None
    model = new_draft(shape, embed_np, target_folder, vocab)
    model.train()
    # DSpark's softmax runs over its draft vocabulary; z-lab's tied head over the tokens the data
    # holds plus a fresh random draw of the rest each step, so that every token is pushed down now
    # and then at a fraction of the whole head's cost (a soft label outside them is left out)
    fixed = Columns.of(vocab, shape.n_vocab) if vocab is not None else None
    seen = np.unique(np.concatenate(corpus.tokens).astype(np.int64))

    def columns():
        if fixed is not None:
            return fixed
        if not st.negatives:
            return None
        return Columns.of(np.union1d(seen, rng.choice(shape.n_vocab, size=st.negatives, replace=False)),
                          shape.n_vocab)
    # a frozen bf16 copy: the block embeddings and the tied head, as the draft borrows them
    embed = torch.from_numpy(embed_np).to(torch.bfloat16)
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay_params = [p for n, p in trained if p.dim() > 1]
    other_params = [p for n, p in trained if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay_params, "weight_decay": st.weight_decay},
                             {"params": other_params, "weight_decay": 0.0}], lr=st.lr, betas=(0.9, 0.95))

    def lr_at(step):
        if step < st.warmup:
            return st.lr * (step + 1) / st.warmup
        frac = (step - st.warmup) / max(1, st.steps - st.warmup)
        return st.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    pool = _anchor_pool(corpus, shape.offset)
    usable = [int(i) for i in rng.permutation([i for i, p in enumerate(pool) if len(p)])]
    val_ids, usable = usable[:st.val_seqs], usable[st.val_seqs:]
    # one fixed batch of the held-out sequences, up to 16 anchors each
    val_batch = make_batch(corpus, val_ids, 16, shape.block_size, shape.mask_token_id,
                           np.random.default_rng(st.seed + 1), pool, shape.offset) if val_ids else None

    def validate():
        if val_batch is None:
            return {}
        with torch.no_grad():
            _, vs = block_loss(model, shape, embed, val_batch, st, fixed)
        return {"val_ce": round(vs["ce"], 4), "val_acc1": round(vs["acc1"], 4), "val_acc": round(vs["acc"], 4)}
    history, window, best = [], [], None
    t0 = last = time.perf_counter()
    c0 = time.process_time()
    order = np.array(usable)
    at = 0
    for step in range(st.steps):
        if at + st.seqs_per_step > len(order):
            order, at = rng.permutation(usable), 0
        seq_ids = [int(i) for i in order[at:at + st.seqs_per_step]]
        at += st.seqs_per_step
        batch = make_batch(corpus, seq_ids, st.anchors_per_seq, shape.block_size, shape.mask_token_id, rng, pool,
                           shape.offset)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        if st.feature_dropout:
            batch.feats = torch.nn.functional.dropout(batch.feats, st.feature_dropout)
        loss, stats = block_loss(model, shape, embed, batch, st, columns())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for _, p in trained], 1.0)
        opt.step()
        window.append({"loss": loss.item(), **stats})
        now = time.perf_counter()
        if now - last > 60 or step + 1 == st.steps:
            last = now
            rate = (step + 1) / (now - t0)
            mean = {k: float(np.mean([w[k] for w in window])) for k in ("loss", "ce", "acc1", "acc")}
            model.eval()
            val = validate()
            model.train()
            if val and (best is None or val["val_ce"] < best[0]):
                best = (val["val_ce"], step + 1, {k: v.detach().clone() for k, v in model.state_dict().items()})
            history.append({"step": step + 1, "seconds": round(now - t0, 1),
                            "cpu_seconds": round(time.process_time() - c0, 1),
                            **{k: round(v, 4) for k, v in mean.items()}, **val})
            window = []
            vtext = f"; held out: CE {val['val_ce']:.3f}, first-token top-1 {val['val_acc1']:.3f}" if val else ""
            log(f"train {shape.variant}: step {step + 1}/{st.steps}, loss {mean['loss']:.3f}, CE {mean['ce']:.3f}, "
                f"first-token top-1 {mean['acc1']:.3f}, all rows {mean['acc']:.3f}{vtext}, {rate:.2f} steps/s, "
                f"{_clock((st.steps - step - 1) / rate)} left")
    model.eval()
    if st.keep_best and best is not None:
        model.load_state_dict(best[2])
        log(f"train: kept step {best[1]}'s weights (held-out CE {best[0]:.3f})")
        history.append({"kept_step": best[1]})
    return model, history, time.perf_counter() - t0


def save_checkpoint(model, out_dir, dtype: str = "bfloat16", verifier: str | None = None) -> Path:
    """The authors' save_pretrained, weights in `dtype` to stay small; a speculators config names
    `verifier` as its verifier (the training's target folder was temporary)."""
    import torch
    from ..authors import quiet_transformers
    quiet_transformers()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.to(getattr(torch, dtype)).save_pretrained(str(out))
    if verifier is not None:
        path = out / "config.json"
        cfg = json.loads(path.read_text())
        ver = cfg.get("speculators_config", {}).get("verifier")
        if ver is None:
            raise TrainError(f"{path}: no speculators_config.verifier to name {verifier!r} in")
        ver["name_or_path"] = verifier
        path.write_text(json.dumps(cfg, indent=2) + "\n")
    return out


def stderr_log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def summary_dict(corpus: Corpus, shape: DraftShape, st: TrainSettings, history, seconds: float) -> dict:
    return {"data": {"sequences": len(corpus.tokens), "generated_tokens": corpus.n_generated,
                     "seconds": round(corpus.seconds, 1), "layers": corpus.layers, **corpus.meta},
            "shape": asdict(shape), "train": asdict(st), "seconds": round(seconds, 1), "history": history}
