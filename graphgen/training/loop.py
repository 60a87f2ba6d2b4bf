"""The training loop: batches of anchored blocks from the corpus, the loss, the steps, the
checkpoint and the summary."""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .common import TOP_KEPT, TrainError, _clock
from .corpus import Corpus
from ..models.arch import HEADS
from .draft import DraftShape, _BlockwiseConvs, draft_vocabulary, new_draft


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
    equal what the authors' inference computes for that block alone (tests/training/test_loop.py)."""
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
    if HEADS[shape.variant].selector:
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
