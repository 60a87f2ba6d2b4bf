"""The authors' forward over a scenario, recorded under llama.cpp's node names.

`run_scenario_torch(hf_dir, scenario, out)` loads a checkpoint with its authors' own class
(`from_pretrained` of z-lab's `dflash` or vLLM's `speculators`) and runs the scenario's steps the
way the authors' code carries a drafting session:

- injected target features wait, as in the authors' loop, until the next block of their sequence:
  the draft projects them (`fc`, `hidden_norm`) and writes their K/V into the cache in the same
  forward as the block, so an inject graph's tensors are taken from that forward's context rows;
- each sequence has its own `DynamicCache` (the authors run batch 1); `seq_rm` crops it, which the
  authors' cache can only do from a position to the end;
- z-lab's model is called as `dflash_generate` calls it (`model(target_hidden, noise_embedding,
  position_ids, past_key_values)`) with the target's embeddings and head; speculators' models have
  no inference entry, so their own modules are called in their `_backbone_forward`'s order
  (`fc`, `hidden_norm`, `rotary_emb`, each layer with the cache, `norm`, `lm_head`), and DSpark's
  Markov and confidence heads are chained greedily slot by slot, as llama.cpp's graph does;
- tensors are taken through forward hooks on the authors' modules and a wrapper around their
  module's `apply_rotary_pos_emb` (q and k after rope are no module's output), never recomputed.

Values are written as `graphgen-dump/1` with `source.engine = "torch"`, node names from
`tensormap.TENSOR_MAP`, in llama.cpp's layout (numpy order ne3..ne0). A value the authors have no
counterpart for (the pad confidence of a bonus-anchor slot) is NaN and left out of comparisons.

Long because it runs two authors' code bases (z-lab, speculators) through one interface, hooks
included, and the scenario runner over both.
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import __version__
from ..dump.format import Node, provenance, write_dump
from ..models.arch import HEADS
from ..play.scenario import Scenario
from ..play.player import Engine, play
from . import AuthorsError, quiet_transformers, require_torch
from .folder import authors_class, inspect, shape_mismatch
from .tensormap import entries

ENGINE = "torch"


def detect_format(hf_dir: str | Path) -> tuple[str, str]:
    """(authors, variant) of a checkpoint folder the authors' packages can run."""
    ck = inspect(hf_dir, shapes=False)
    _require_authors(ck)
    return ck.authors, ck.variant


def _require_authors(ck) -> None:
    if ck.authors is None:
        raise AuthorsError(f"{ck.path / 'config.json'}: key 'architectures' = {ck.config.get('architectures')!r} has no "
                           "authors' class on PyPI: graphgen convert converts it, check and dump --engine torch "
                           "run z-lab's and speculators' formats only")


class AuthorsDraft:
    """A checkpoint loaded with its authors' class, plus the target's embeddings and head."""

    def __init__(self, hf_dir: str | Path, target_dir: str | Path | None = None, dtype: str = "float32"):
        """`dtype` float64 runs the authors' model in double precision: `graphgen check`'s arbiter
        (their rotary tables stay float32: transformers builds cos/sin in float32 whatever the
        model's type)."""
        require_torch()
        import torch
        quiet_transformers()
        if dtype not in ("float32", "float64"):
            raise AuthorsError(f"dtype {dtype!r}: float32 or float64")
        self.dtype = getattr(torch, dtype)
        self.hf_dir = Path(hf_dir)
        ck = inspect(self.hf_dir)
        _require_authors(ck)
        self.authors, self.variant, self.config = ck.authors, ck.variant, ck.config
        self.head = HEADS[self.variant]
        self._checkpoint = ck
        target = Path(target_dir) if target_dir is not None else self.hf_dir / "target"
        try:
            if self.authors == "zlab":
                self._load_zlab(target)
            else:
                self._load_speculators(None if target_dir is None else target)
                if target_dir is not None:
                    # the target named here wins over the config's verifier path, as it does for
                    # the converter
                    self._use_target_tables(target)
        except AuthorsError:
            raise
        except (OSError, ValueError, RuntimeError, KeyError, TypeError) as e:
            raise AuthorsError(shape_mismatch(self._checkpoint) or f"{self.hf_dir}: the authors' loader refused the checkpoint: "
                               f"{' '.join(str(e).split())[:300]}") from e
        self.model.eval()
        self.package = "dflash" if self.authors == "zlab" else "speculators"
        self.class_name = type(self.model).__name__
        from .checkpoint import label
        self.label = label(self.authors, self.variant)
        self.n_layer = len(self.model.layers)
        self.n_embd = int(self.model.norm.weight.shape[0])
        if self.embed.shape[1] != self.n_embd:
            raise AuthorsError(f"{target}: the target's embeddings are {self.embed.shape[1]} wide, the draft's "
                               f"hidden size is {self.n_embd}")
        self.n_embd_inp = int(self.model.fc.weight.shape[1])
        self.torch = torch
        layer_cfg = self.model.config if self.authors == "zlab" else self.model.config.transformer_layer_config
        self.sliding_layers = list(getattr(layer_cfg, "layer_types", None) or []).count("sliding_attention")

    # ---- loading ----
    def _load_zlab(self, target: Path) -> None:
        import torch
        self.model = authors_class(self.authors, self.variant).from_pretrained(str(self.hf_dir), dtype=self.dtype)
        dc = self.config["dflash_config"]
        for key in ("mask_token_id", "target_layer_ids"):
            if key not in dc:
                raise AuthorsError(f"{self.hf_dir}/config.json: missing key 'dflash_config.{key}'")
        self.mask_token_id = int(dc["mask_token_id"])
        self.target_layers = [int(i) + 1 for i in self.model.target_layer_ids]
        self.block_size = int(self.model.block_size)
        self.sample_from_anchor = False
        # z-lab drafts share the target's embeddings and head (dflash_generate reads them off the target)
        embed, head = _target_tables(target)
        self.embed = embed.to(self.dtype)
        self.head_module = torch.nn.Linear(head.shape[1], head.shape[0], bias=False, dtype=self.dtype)
        with torch.no_grad():
            self.head_module.weight.copy_(head)
        self.n_vocab = int(self.embed.shape[0])
        self.d2t = None

    def _load_speculators(self, target: Path | None) -> None:
        import torch
        cls = authors_class(self.authors, self.variant)
        kw = {}
        if target is not None:
            # the target named here is also the verifier speculators loads its tables from: the
            # config's path may name where the checkpoint was made, not where it is now
            cfg = cls.config_class.from_pretrained(str(self.hf_dir))
            cfg.speculators_config.verifier.name_or_path = str(target.resolve())
            kw["config"] = cfg
        self.model = cls.from_pretrained(str(self.hf_dir), dtype=self.dtype, **kw)
        m, cfg = self.model, self.model.config
        # the authors' inference attention without flex's compiled masks
        cfg.transformer_layer_config._attn_implementation = "sdpa"
        for layer in m.layers:
            layer.self_attn.config._attn_implementation = "sdpa"
        if cfg.mask_token_id is None:
            raise AuthorsError(f"{self.hf_dir}/config.json: missing key 'mask_token_id'")
        self.mask_token_id = int(cfg.mask_token_id)
        self.target_layers = [int(i) for i in cfg.aux_hidden_state_layer_ids]
        self.block_size = int(cfg.block_size)
        self.sample_from_anchor = bool(getattr(cfg, "sample_from_anchor", False))
        self.embed = m.embed_tokens.weight.detach()
        if torch.isnan(self.embed).any() or torch.isnan(m.lm_head.weight).any():
            raise AuthorsError(f"{self.hf_dir}: the verifier's embeddings or head did not load (speculators "
                               "reads them from speculators_config.verifier.name_or_path)")
        self.head_module = m.lm_head
        self.n_vocab = int(self.embed.shape[0])
        self.d2t = None
        if m.use_draft_vocab:
            self.d2t = (m.d2t.long() + torch.arange(m.d2t.shape[0])).numpy()
        if self.head.markov and m.markov_head is not None and m.markov_head.head_type != "vanilla":
            raise AuthorsError(f"{self.hf_dir}/config.json: 'markov_head_type' {m.markov_head.head_type!r}: "
                               "llama.cpp reads only the vanilla Markov head")

    def _use_target_tables(self, target: Path) -> None:
        import torch
        embed, head = _target_tables(target)
        m = self.model
        if tuple(embed.shape) != tuple(m.embed_tokens.weight.shape):
            raise AuthorsError(f"{target}: the target's embeddings are {list(embed.shape)}, the draft takes "
                               f"{list(m.embed_tokens.weight.shape)}")
        with torch.no_grad():
            m.embed_tokens.weight.copy_(embed)
            if not m.use_draft_vocab:
                m.lm_head.weight.copy_(head)
        self.embed = m.embed_tokens.weight.detach()

    # ---- the pieces of a forward ----
    def embed_tokens(self, tokens):
        torch = self.torch
        ids = torch.tensor([tokens], dtype=torch.long)
        if self.authors == "zlab":
            import dflash.model as zm
            from types import SimpleNamespace
            scale = float(zm._draft_value(self.model.config, "input_embedding_scale", 1.0))
            emb = torch.nn.Embedding.from_pretrained(self.embed, freeze=True)
            return zm._raw_input_embeddings(SimpleNamespace(get_input_embeddings=lambda: emb), ids, scale)
        return self.model.embed_tokens(ids)

    def new_cache(self):
        from transformers import DynamicCache
        cfg = self.model.config if self.authors == "zlab" else self.model.config.transformer_layer_config
        return DynamicCache(config=cfg)

    def backbone(self, cache, target_hidden, noise, position_ids, key_positions):
        """[1, n_block, n_embd] after the final norm; the cache gains the context and block rows.
        `key_positions`: the positions of every key the block will see (the cache's, then the new)."""
        m = self.model
        if self.authors == "zlab":
            # z-lab builds its own masks (sliding layers: causal, a window per query)
            return m(position_ids=position_ids, noise_embedding=noise, target_hidden=target_hidden,
                     past_key_values=cache, use_cache=True)
        target = m.hidden_norm(m.fc(target_hidden))
        pos_emb = m.rotary_emb(noise, position_ids)
        h = noise
        for layer in m.layers:
            h = layer(target_hidden=target, hidden_states=h, position_ids=position_ids,
                      attention_mask=self._speculators_mask(layer, key_positions, noise.shape[1]),
                      past_key_value=cache, use_cache=True, position_embeddings=pos_emb)
        return m.norm(h)

    def _speculators_mask(self, layer, key_positions, n_block):
        """speculators' training mask (create_anchor_block_mask_mod) for one block: full layers see
        every context row before the anchor and the whole block (None: sdpa then masks nothing);
        sliding layers see the context rows at most `sliding_window` before the anchor, and the block
        bidirectionally only with `sliding_window_non_causal`."""
        window = layer.self_attn.sliding_window
        if window is None:
            return None
        torch = self.torch
        keys = torch.tensor(key_positions)
        n_ctx = len(key_positions) - n_block
        anchor = int(keys[n_ctx])
        ctx = (keys[:n_ctx] >= anchor - window) & (keys[:n_ctx] < anchor)
        block = torch.ones((n_block, n_block), dtype=torch.bool)
        if not self.model.config.sliding_window_non_causal:
            block = torch.tril(block)
        return torch.cat([ctx[None, :].expand(n_block, n_ctx), block], dim=1)[None, None]

    def logits(self, hidden):
        """[n, n_vocab] over the target's ids (a draft vocabulary scattered through d2t, -inf elsewhere),
        and the raw draft-vocabulary logits."""
        torch = self.torch
        if self.authors == "zlab":
            raw = self.model.compute_logits(hidden, self.head_module)
        else:
            raw = self.head_module(hidden)
        if self.d2t is None:
            return raw, raw
        full = torch.full((*raw.shape[:-1], self.n_vocab), float("-inf"), dtype=raw.dtype)
        full[..., torch.as_tensor(self.d2t)] = raw
        return full, raw


def _target_tables(target: Path):
    """The target's token embeddings and output head (the embeddings when it ties them)."""
    from safetensors import safe_open
    tcfg_path = target / "config.json"
    if not tcfg_path.is_file():
        raise AuthorsError(f"{target}: no config.json: the draft reads its target's embeddings (--target DIR)")
    tcfg = json.loads(tcfg_path.read_text())
    tcfg = {**tcfg, **tcfg.get("text_config", {})}
    files = sorted(target.glob("*.safetensors"))
    if not files:
        raise AuthorsError(f"{target}: no *.safetensors with the target's embeddings")
    tensors = {}
    for f in files:
        with safe_open(str(f), "pt") as st:
            for name in ("model.embed_tokens.weight", "lm_head.weight"):
                if name in st.keys():
                    tensors[name] = st.get_tensor(name).float()
    if "model.embed_tokens.weight" not in tensors:
        raise AuthorsError(f"{target}: no tensor 'model.embed_tokens.weight'")
    head = tensors.get("lm_head.weight")
    if head is None:
        if not tcfg.get("tie_word_embeddings", False):
            raise AuthorsError(f"{target}: no tensor 'lm_head.weight' and {tcfg_path.name} does not tie embeddings")
        head = tensors["model.embed_tokens.weight"]
    return tensors["model.embed_tokens.weight"], head


class _Taps:
    """Forward hooks on the authors' modules; each forward's tensors land in `self.got`."""

    def __init__(self, draft: AuthorsDraft):
        self.draft = draft
        self.got: dict[str, object] = {}
        self.il = -1
        self.handles = []
        self.calls: dict[tuple[int, str], int] = {}
        self._wrapped: list[tuple[object, str]] = []   # (object, method) wrapped for this forward

    def _put(self, name, t):
        self.got[name] = t.detach().clone()

    @contextlib.contextmanager
    def installed(self):
        m = self.draft.model
        hs = self.handles

        def on(module, name, pre=False):
            if pre:
                hs.append(module.register_forward_pre_hook(lambda mod, args: self._put(name.format(il=self.il), args[0])))
            else:
                def hook(mod, args, out):
                    self._put(name.format(il=self.il), out[0] if isinstance(out, tuple) else out)
                hs.append(module.register_forward_hook(hook))

        for il, layer in enumerate(m.layers):
            hs.append(layer.register_forward_pre_hook(lambda mod, args, il=il: setattr(self, "il", il)))
            on(layer.input_layernorm, "noise_norm-{il}")
            on(layer.post_attention_layernorm, "ffn_inp-{il}", pre=True)
            on(layer.post_attention_layernorm, "ffn_norm-{il}")
            on(layer.mlp, "ffn_out-{il}")
            on(layer.self_attn.o_proj, "kqv_out-{il}", pre=True)
            on(layer, "l_out-{il}")

            def v_hook(mod, args, out, il=il):
                # the authors' attention projects the context first, then the block
                k = self.calls[(il, "v")] = self.calls.get((il, "v"), 0) + 1
                self._put(f"Vcur_injected-{il}" if k == 1 else f"Vcur-{il}", out)
            hs.append(layer.self_attn.v_proj.register_forward_hook(v_hook))
            for conv, stem in ((getattr(layer, "attention_conv", None), "attn_conv"),
                               (getattr(layer, "mlp_conv", None), "ffn_conv")):
                if conv is not None:
                    self._wrap_method(conv, "prepare", f"{stem}_in-{il}", first=True)
                    self._wrap_method(conv, "finish", f"{stem}_out-{il}")
        on(m.hidden_norm, "inp_g_embeddings")
        on(m.norm, "result_norm")
        patched = self._patch_rope()
        try:
            yield self
        finally:
            for h in hs:
                h.remove()
            hs.clear()
            for obj, attr, orig in patched:
                setattr(obj, attr, orig)
            for conv, meth in self._wrapped:
                conv.__dict__.pop(meth, None)
            self._wrapped.clear()

    def _wrap_method(self, obj, meth, name, first=False):
        orig = getattr(obj, meth)

        def wrapper(*args, **kw):
            out = orig(*args, **kw)
            self._put(name, out[0] if first else out)
            return out
        setattr(obj, meth, wrapper)
        self._wrapped.append((obj, meth))

    def _patch_rope(self):
        # q and k after rope are no module's output: wrap the function the authors' attention calls
        import importlib
        mod_name = "dflash.model" if self.draft.authors == "zlab" else "speculators.models.dflash.model_definitions"
        mod = importlib.import_module(mod_name)
        orig = mod.apply_rotary_pos_emb

        def rope(q, k, cos, sin, *args, **kw):
            q2, k2 = orig(q, k, cos, sin, *args, **kw)
            self._put(f"Qcur-{self.il}", q2)
            self._put(f"Krope-{self.il}", k2)
            return q2, k2
        mod.apply_rotary_pos_emb = rope
        return [(mod, "apply_rotary_pos_emb", orig)]


@dataclass
class _SeqState:
    cache: object
    positions: list[int] = field(default_factory=list)      # of the cache's rows, in order
    pending: list[tuple[int, np.ndarray, list[int]]] = field(default_factory=list)  # (dump index, rows, positions)


def _rows(t) -> np.ndarray:
    """A [1, n, ...] torch tensor as numpy [n, ...], float32 (float64 from the arbiter)."""
    return _np(t)[0]


def _np(t) -> np.ndarray:
    import torch
    t = t.detach()
    return (t if t.dtype == torch.float64 else t.float()).numpy()


def _heads(t) -> np.ndarray:
    """q/k as the authors hold them after rope, [1, heads, n, hd], in llama.cpp's [n, heads, hd]."""
    return np.ascontiguousarray(_np(t)[0].transpose(1, 0, 2))


def dspark_heads(draft: AuthorsDraft, hidden, full, raw, anchor: int):
    """A DSpark block's drafted logits and confidences, as llama.cpp's graph computes them: the base
    logits plus the Markov bias slot by slot (previous token: the argmax of the slot before, the
    anchor for the first drafting slot), and the confidence head on [hidden, prev embedding].
    -> (logits [n, n_vocab] over the target's ids, confidences [n] (NaN at slots that draft
    nothing), or None without a confidence head)."""
    torch = draft.torch
    m = draft.model
    n = hidden.shape[1]
    logits = full[0].clone()
    conf = torch.full((n,), float("nan"), dtype=hidden.dtype)
    first = 0 if draft.sample_from_anchor else 1
    prev = int(anchor)
    if m.markov_head is not None:
        for k in range(first, n):
            prev_ids = torch.tensor([[prev]])
            prev_emb = m.markov_head.prev_embeddings(prev_ids)
            bias = m.markov_head.block_bias(prev_token_ids=prev_ids, hidden_states=hidden[:, k:k + 1],
                                            prev_emb=prev_emb)[0, 0]
            col = raw[0, k] + bias
            if draft.d2t is not None:
                row = torch.full((draft.n_vocab,), float("-inf"), dtype=col.dtype)
                row[torch.as_tensor(draft.d2t)] = col
                col = row
            logits[k] = col
            if m.confidence_head is not None:
                feats = torch.cat([hidden[0, k], prev_emb[0, 0].to(hidden.dtype)], dim=-1) \
                    if m.config.confidence_head_with_markov else hidden[0, k]
                conf[k] = torch.sigmoid(m.confidence_head(feats[None, None]))[0, 0]
            prev = int(torch.argmax(col))
    return logits.numpy(), (conf.numpy() if m.confidence_head is not None else None)


def drafted_logits(draft: AuthorsDraft, hidden, anchor: int):
    """What llama.cpp's graph hands a driver for a block of the draft's final hidden rows
    [1, rows, n_embd] starting with `anchor`: the rows' logits over the target's ids (DSpark's
    chained by its Markov head) and their confidences (NaN without a confidence head)."""
    full, raw = draft.logits(hidden)
    logits, conf = full[0].float().numpy(), None
    if draft.head.markov:
        logits, conf = dspark_heads(draft, hidden, full, raw, int(anchor))
    if conf is None:
        conf = np.full(len(logits), np.nan, np.float32)
    return logits, conf


class TorchEngine:
    """Runs a scenario's steps through an `AuthorsDraft`; collects per-graph recorded values."""

    def __init__(self, draft: AuthorsDraft, scenario: Scenario):
        self.draft = draft
        self.scenario = scenario
        self.seqs: dict[int, _SeqState] = {}
        self.graphs: dict[int, dict] = {}  # dump index -> {"graph": kind, "values": {name: array}}
        self.taps = _Taps(draft)

    def _seq(self, seq: int) -> _SeqState:
        if seq not in self.seqs:
            self.seqs[seq] = _SeqState(self.draft.new_cache())
        return self.seqs[seq]

    def inject(self, index: int, seq: int, feats: np.ndarray, pos0: int) -> None:
        if feats.shape[1] != self.draft.n_embd_inp:
            raise AuthorsError(f"target features are {feats.shape[1]} wide; the draft's fc takes {self.draft.n_embd_inp}")
        self.graphs[index] = {"graph": "inject", "values": {}}
        self._seq(seq).pending.append((index, feats, list(range(pos0, pos0 + len(feats)))))

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        st = self._seq(seq)
        self.flush(seq)
        p1 = math.inf if p1 < 0 else p1
        keep = [i for i, p in enumerate(st.positions) if not (p0 <= p < p1)]
        if keep != list(range(len(keep))):
            raise AuthorsError(f"seq_rm seq {seq} [{p0}, {p1}): the authors' cache (DynamicCache) drops only a "
                               "tail of a sequence's rows")
        if len(keep) < len(st.positions):
            st.cache.crop(len(keep))
            del st.positions[len(keep):]

    def flush(self, seq: int | None = None, last: bool = False) -> None:
        """Project waiting injected rows through a forward with one mask token (cropped after, but
        for the `last` flush, after which nothing runs): their K/V and fc output do not depend on the
        block that follows."""
        for s in ([seq] if seq is not None else sorted(self.seqs)):
            st = self.seqs.get(s)
            if st is not None and st.pending:
                pos = max(p for _, _, ps in st.pending for p in ps) + 1
                self._forward(s, [self.draft.mask_token_id], pos)
                if not last:
                    st.cache.crop(len(st.positions) - 1)
                    st.positions.pop()

    def _forward(self, seq: int, tokens: list[int], pos0: int) -> dict:
        torch = self.draft.torch
        st = self._seq(seq)
        ctx = [(i, f, p) for i, f, p in st.pending]
        st.pending = []
        feats = np.concatenate([f for _, f, _ in ctx]) if ctx else np.zeros((0, self.draft.n_embd_inp), np.float32)
        ctx_pos = [p for _, _, ps in ctx for p in ps]
        positions = ctx_pos + list(range(pos0, pos0 + len(tokens)))
        self.taps.got = {}
        self.taps.calls = {}
        with torch.no_grad(), self.taps.installed():
            noise = self.draft.embed_tokens(tokens)
            hidden = self.draft.backbone(st.cache, torch.from_numpy(feats)[None].to(self.draft.dtype), noise,
                                         torch.tensor([positions], dtype=torch.long), st.positions + positions)
        got = dict(self.taps.got)
        got["inp_noise_embd"] = noise
        got["result_norm"] = hidden
        st.positions.extend(positions)
        # the context rows belong to the inject graphs they came from
        n_ctx, at = len(ctx_pos), 0
        for index, f, ps in ctx:
            vals = self.graphs[index]["values"]
            lo, hi = at, at + len(ps)
            if "inp_g_embeddings" in got:
                vals["inp_g_embeddings"] = _rows(got["inp_g_embeddings"])[lo:hi]
            for il in range(self.draft.n_layer):
                vals[f"Kcur_injected-{il}"] = _heads(got[f"Krope-{il}"])[lo:hi]
                hd = vals[f"Kcur_injected-{il}"].shape[-1]
                v = _rows(got[f"Vcur_injected-{il}"])
                vals[f"Vcur_injected-{il}"] = v.reshape(v.shape[0], -1, hd)[lo:hi]
            at = hi
        got["_n_ctx"] = n_ctx
        return got

    def block(self, index: int, blocks: list[tuple[int, list[int], int]]) -> None:
        torch = self.draft.torch
        d = self.draft
        per_seq = []
        for seq, tokens, pos0 in blocks:
            got = self._forward(seq, tokens, pos0)
            n_ctx = got["_n_ctx"]
            vals: dict[str, np.ndarray] = {"inp_noise_embd": _rows(got["inp_noise_embd"])}
            for il in range(d.n_layer):
                for name in ("noise_norm", "attn_conv_in", "kqv_out", "attn_conv_out", "ffn_inp", "ffn_norm",
                             "ffn_conv_in", "ffn_out", "ffn_conv_out", "l_out"):
                    key = f"{name}-{il}"
                    if key in got:
                        vals[key] = _rows(got[key])
                vals[f"Qcur-{il}"] = _heads(got[f"Qcur-{il}"])
                k = _heads(got[f"Krope-{il}"])
                vals[f"Kcur-{il}"] = k[n_ctx:]
                v = _rows(got[f"Vcur-{il}"])
                vals[f"Vcur-{il}"] = v.reshape(v.shape[0], -1, k.shape[-1])
            hidden = got["result_norm"]
            vals["result_norm"] = _rows(hidden)
            with torch.no_grad():
                full, raw = d.logits(hidden)
                vals["result_output"] = _rows(full)
                if d.head.markov:
                    self._dspark_heads(vals, hidden, full, raw, tokens)
                elif d.head.selector:
                    vals["[selector path]"] = self._selector_path(hidden, full, raw, tokens)
            per_seq.append(vals)
        merged = {k: np.concatenate([v[k] for v in per_seq]) for k in per_seq[0]}
        self.graphs[index] = {"graph": "block", "values": merged}

    def _dspark_heads(self, vals, hidden, full, raw, tokens) -> None:
        logits, conf = dspark_heads(self.draft, hidden, full, raw, int(tokens[0]))
        vals["[drafted logits]"] = logits
        if conf is not None:
            # llama.cpp hands the confidences to the driver as rows as wide as the hidden state
            vals["[confidences]"] = np.repeat(conf[:, None], self.draft.n_embd, axis=1)

    def _selector_path(self, hidden, full, raw, tokens) -> np.ndarray:
        """The authors' selector, greedy, over the block's positions after the anchor."""
        torch = self.draft.torch
        m = self.draft.model
        anchor = torch.tensor([int(tokens[0])])
        if hidden.shape[1] < 2:
            return np.zeros(0, np.int64)
        if self.draft.authors == "zlab":
            path, _, _ = m.propose(hidden[:, 1:], anchor, self.draft.head_module, 0.0)
            return path[0].numpy().astype(np.int64)
        sel = m.candidate_selector
        unary = raw[0]
        pred, path = anchor, []
        for k in range(1, hidden.shape[1]):
            cands = unary[k].topk(sel.top_k).indices
            scores = sel.score_candidates(unary[k][None], hidden[0, k][None], pred, cands[None])
            pred = cands[int(torch.argmax(scores[0]))][None]
            path.append(int(pred[0]))
        return np.array(path, np.int64)


def graph_order(ents, n_layer: int) -> list[str]:
    """Mapped names in the order the graph computes them: what comes before the layers, each
    layer's tensors, then the rest, so that the first failing node is where an error starts."""
    per_layer = [e for e in ents if "{il}" in e.node]
    first = ents.index(per_layer[0]) if per_layer else len(ents)
    before = [e.node for e in ents[:first] if "{il}" not in e.node]
    after = [e.node for e in ents[first:] if "{il}" not in e.node]
    return before + [e.node.format(il=il) for il in range(n_layer) for e in per_layer] + after


def _ne(arr: np.ndarray) -> list[int]:
    shape = list(arr.shape)[::-1]
    return (shape + [1] * 4)[:4]


def torch_header(draft: AuthorsDraft, scenario: Scenario, scenario_path=None) -> dict:
    import importlib.metadata as md
    torch = draft.torch
    versions = {p: md.version(p) for p in (draft.package, "transformers") if _has_dist(p)}
    return {"source": {"engine": ENGINE, "version": __version__,
                       "authors": f"{draft.package} {versions.get(draft.package, '?')} {draft.class_name}",
                       "torch": torch.__version__, "transformers": versions.get("transformers", "?"),
                       "dtype": str(draft.dtype).removeprefix("torch.")},
            "model": draft.hf_dir.name, "cpu_features": {},
            "settings": {"flash_attn": False, "type_k": "f32", "type_v": "f32", "n_ctx": scenario.n_ctx,
                         "n_ubatch": scenario.n_ubatch, "n_kv": None, "causal": False},
            **provenance(None, scenario, scenario_path)}


def _has_dist(name: str) -> bool:
    import importlib.metadata as md
    try:
        md.version(name)
        return True
    except md.PackageNotFoundError:
        return False


class _Played(Engine):
    """The torch engine as the scenario player drives it (graphgen/play/player.py)."""

    def __init__(self, eng: TorchEngine):
        self.eng, self.draft = eng, eng.draft
        self.n_embd_inp, self.n_embd = self.draft.n_embd_inp, self.draft.n_embd
        self.index = 0

    def at(self, index: int, step) -> None:
        self.index = index

    def seq_rm(self, step, inputs) -> None:
        if self.draft.sliding_layers:
            raise AuthorsError(f"the authors' {self.draft.sliding_layers} sliding-window layer(s) keep a transformers "
                               "sliding cache, which cannot crop; run the rounds before the first removal (graphgen "
                               "check cuts the scenario there)")
        self.eng.seq_rm(step.seq, step.pos0, step.p1)

    def encoder(self, step, features):
        raise AuthorsError("the authors' models have no encoder graph")

    def inject(self, step, features):
        self.eng.inject(self.index, step.seq, features, step.pos0)

    def block(self, step, states):
        d = self.draft
        for b in step.blocks:
            if max(b.tokens) >= d.n_vocab:
                raise AuthorsError(f"token {max(b.tokens)} is outside the vocabulary of {d.n_vocab}")
        if d.head.equal_blocks and len({len(b.tokens) for b in step.blocks}) > 1:
            raise AuthorsError(f"the {d.variant} heads need equal-size blocks")
        self.eng.block(self.index, [(b.seq, b.tokens, b.pos0) for b in step.blocks])


def run_scenario_torch(hf_dir, scenario: Scenario, out=None, target_dir=None, progress=None,
                       scenario_path=None, draft: AuthorsDraft | None = None) -> dict[int, dict]:
    """Run the scenario in the authors' model; write dumps into `out` when given. Returns the
    recorded values per dump index ({"graph", "values"})."""
    draft = draft or AuthorsDraft(hf_dir, target_dir)
    eng = TorchEngine(draft, scenario)
    played = _Played(eng)
    play(scenario, played, progress=progress, before=played.at)
    eng.flush(last=True)
    if out is not None:
        header = torch_header(draft, scenario, scenario_path)
        header["source"]["hf_dir"] = str(draft.hf_dir.resolve())
        if draft.head.selector:
            # the lattice's row layout on the ggml side depends on it
            sel = draft.model.candidate_selector
            header["source"]["selector_top_k"] = int(sel.top_k)
        for i in sorted(eng.graphs):
            g = eng.graphs[i]
            nodes, values = [], {}
            order = graph_order(entries(draft.variant, g["graph"]), draft.n_layer)
            for name in order:
                if name not in g["values"]:
                    continue
                arr = g["values"][name]
                is_int = arr.dtype.kind in "iu"
                nodes.append(Node(len(nodes), name, "TORCH", "i32" if is_int else "f32", _ne(arr)))
                values[len(nodes) - 1] = arr.astype(np.int32) if is_int else arr.astype(np.float32, copy=False)
            write_dump(out, i, g["graph"], header, nodes, values)
    return eng.graphs


def default_check_scenario(block_size: int, mask_token_id: int, f16: bool = False) -> dict:
    """Two drafting rounds at the draft's trained block size: inject 5 rows, a block, drop it,
    inject 3 accepted rows, a block again."""
    block = [7] + [mask_token_id] * (block_size - 1)
    return {"n_ctx": max(256, 2 * (8 + block_size)), "n_ubatch": max(64, block_size), "flash_attn": "off",
            "type_kv": "f16" if f16 else "f32", "seed": 1,
            "steps": [{"inject": {"n_tokens": 5, "pos0": 0}},
                      {"block": {"tokens": block, "pos0": 5}},
                      {"seq_rm": {"seq": 0, "p0": 5, "p1": -1}},
                      {"inject": {"n_tokens": 3, "pos0": 5}},
                      {"block": {"tokens": [11] + block[1:], "pos0": 8}}]}


def croppable(doc: dict, draft: AuthorsDraft) -> tuple[dict, str | None]:
    """The scenario cut before its first removal the authors' cache cannot make: transformers'
    sliding-window cache layers keep no history to crop back to (their authors' own loops cannot
    run a second drafting round either). Returns (the scenario to run, what was left out or None)."""
    if not draft.sliding_layers:
        return doc, None
    steps = doc.get("steps") or []
    for i, step in enumerate(steps):
        if isinstance(step, dict) and "seq_rm" in step:
            kept = steps[:i]
            note = (f"scenario cut before step {i} (seq_rm) and the {len(steps) - i - 1} after it: the authors' "
                    f"{draft.sliding_layers} sliding-window layer(s) keep a transformers sliding cache, which "
                    "cannot crop, so only the rounds before the first removal ran (in all three engines)")
            return {**doc, "steps": kept}, note
    return doc, None
