"""The authors' own speculative loop as an acceptance engine beside graphgen's.

`authors_accept(target_gguf, draft_dir, prompts_tokens, n_predict)` runs the authors' loop once per
prompt, the target transformers' model of the GGUF (its weights dequantized to float32,
features.transformers_model):

- a z-lab DFlash or DFlash2 checkpoint: z-lab's `dflash_generate` itself, unchanged, the draft
  `DFlashDraftModel` or `DFlash2DraftModel.from_pretrained` of the folder in float32 (the class
  its config's architectures name), reading the target's embeddings and head as dflash_generate
  does; DFlash2 drafts through its candidate selector (`propose`), which dflash_generate picks by
  the class;
- a speculators DSpark (or DFlash) checkpoint: speculators ships no loop, so
  graphgen.accept.speculators_loop runs dflash_generate's loop with speculators' own modules
  (graphgen.authors.forward.AuthorsDraft), the Markov head chained slot by slot, the verifier's
  embeddings the GGUF's.

Block size, mask token and target layers are the checkpoint config's, read by the authors' class.

What each round counts. dflash_generate's own statistic (`acceptance_lengths`, kept here as
"authors_lengths") is the tokens a round appended to the output: the drafted tokens the target
agreed with plus the target's own next token, cut at n_predict and at a stop token. graphgen's
rounds (speculate.RoundRecord.n_accepted, like llama.cpp's) count only the agreed drafted tokens.
So per round n_accepted = authors_length - 1, except:

- the last round of a sequence that reaches n_predict on an agreed drafted token: the target's token
  after it is dropped (dflash_generate clips the round, graphgen cuts its run the same way), so
  there n_accepted = authors_length;
- a round ended by a stop token: it is counted like the target's own token (graphgen never accepts
  an end-of-generation token, it ends the round instead), so n_accepted = authors_length - 1.

Both cases need what the round drafted and how much of it the target agreed with, which the
returned tokens alone do not tell; they are observed, not recomputed from the output: a forward
hook on the target sees every verification batch (the anchor token and the drafted tokens) and its
logits, from which greedy agreement is dflash_generate's own rule (the longest prefix of drafted
tokens equal to the target's argmax at the row before); at temp > 0 the count returned by dflash's
`_rejection_sample` is recorded by a wrapper. Then per sequence, without a stop token,

    generated tokens = 1 + sum(n_accepted) + rounds - (1 if the last round's own token was dropped)

(1 the token of the prefill), the same identity as graphgen's loop, and mean acceptance length =
1 + sum(n_accepted) / rounds, as dflash_generate reports it and graphgen's
`EngineRun.mean_acceptance_length` counts it (every round drafts).

Drafted per round: verify_size - 1 tokens, where dflash_generate shrinks the last blocks to what
n_predict leaves (min(block_size, room + 1)); graphgen drafts a full block every round.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

from ..errors import AuthorsLoopError


# -- input ----------------------------------------------------------------------------------------

def _draft_config(draft_dir) -> tuple[Path, dict, str, str]:
    """(folder, config, authors, variant) of a checkpoint the authors' loop runs: z-lab's DFlash and
    DFlash2 (dflash_generate), speculators' DSpark and DFlash (speculators_loop)."""
    from ..authors import AuthorsError
    from ..authors.folder import detect
    path = Path(draft_dir)
    if not path.exists():
        raise AuthorsLoopError(f"draft {path}: no such folder (the authors' checkpoint: config.json + "
                               "model.safetensors)")
    if not path.is_dir():
        with open(path, "rb") as f:
            gguf = f.read(4) == b"GGUF"
        raise AuthorsLoopError(f"draft {path}: {'a GGUF file' if gguf else 'a file'}, not a checkpoint folder: "
                               "the authors' loop loads the checkpoint (config.json + model.safetensors) "
                               "with the authors' from_pretrained")
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise AuthorsLoopError(f"draft {path}: no config.json (not a save_pretrained checkpoint)")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as e:
        raise AuthorsLoopError(f"draft {cfg_path}: not JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise AuthorsLoopError(f"draft {cfg_path}: not a JSON object")
    try:
        authors, variant = detect(path, cfg)
    except AuthorsError as e:
        raise AuthorsLoopError(f"draft {e}") from None
    if authors is None or (authors, variant) not in LOOPS:
        raise AuthorsLoopError(f"draft {cfg_path}: architectures {cfg.get('architectures')!r} "
                               f"({authors or 'no authors'}' {variant}); the authors' loop here runs "
                               f"{', '.join(f'{a} {v}' for a, v in LOOPS)}")
    if authors == "zlab" and "mask_token_id" not in (cfg.get("dflash_config") or {}):
        raise AuthorsLoopError(f"draft {cfg_path}: missing key 'dflash_config.mask_token_id' "
                               "(dflash_generate fills the blocks with it)")
    if authors == "speculators" and cfg.get("mask_token_id") is None:
        raise AuthorsLoopError(f"draft {cfg_path}: missing key 'mask_token_id' (the blocks are filled with it)")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise AuthorsLoopError(f"draft {path}: no weights (model.safetensors)")
    return path, cfg, authors, variant


# the checkpoints each loop runs: z-lab's with its own dflash_generate, speculators' with speculators_loop
LOOPS = (("zlab", "dflash"), ("zlab", "dflash2"), ("speculators", "dspark"), ("speculators", "dflash"))


def _prompts(prompts_tokens, n_vocab: int) -> list[list[int]]:
    if isinstance(prompts_tokens, (str, bytes)) or not hasattr(prompts_tokens, "__iter__"):
        raise AuthorsLoopError("prompts_tokens: a list of token-id lists, one per prompt")
    out = []
    for i, p in enumerate(prompts_tokens):
        if isinstance(p, (str, bytes)) or not hasattr(p, "__iter__"):
            raise AuthorsLoopError(f"prompts_tokens[{i}]: token ids, not {type(p).__name__}")
        ids = [int(t) for t in p]
        if not ids:
            raise AuthorsLoopError(f"prompts_tokens[{i}]: empty")
        bad = [t for t in ids if not 0 <= t < n_vocab]
        if bad:
            raise AuthorsLoopError(f"prompts_tokens[{i}]: id {bad[0]} out of range 0..{n_vocab - 1}")
        out.append(ids)
    if not out:
        raise AuthorsLoopError("prompts_tokens: no prompts")
    return out


# -- models ---------------------------------------------------------------------------------------

def _load(target_gguf, draft_dir):
    from .features import FeaturesError, target_shape, transformers_model
    try:
        import torch
        import dflash.model  # noqa: F401
    except ImportError as e:
        raise AuthorsLoopError(f"the authors' loop needs torch, transformers and dflash (graphgen[torch]): "
                               f"missing {e.name or e}") from None
    path, cfg, authors, variant = _draft_config(draft_dir)
    try:
        tpath, _, n_layer, n_embd, n_vocab = target_shape(target_gguf)
    except FeaturesError as e:
        raise AuthorsLoopError(str(e)) from None
    width = (cfg.get("transformer_layer_config") or {}) if authors == "speculators" else cfg
    if int(width.get("hidden_size", -1)) != n_embd:
        key = "transformer_layer_config.hidden_size" if authors == "speculators" else "hidden_size"
        raise AuthorsLoopError(f"draft {path}/config.json: {key} {width.get('hidden_size')}, the target "
                               f"{tpath.name} is {n_embd} wide")
    from ..authors.folder import authors_class
    from ..authors import quiet_transformers
    quiet_transformers()
    target = transformers_model(tpath, torch.float32)
    if authors == "zlab":
        # DFlashDraftModel or DFlash2DraftModel: dflash_generate takes DFlash2's selector path by its class
        draft = authors_class(authors, variant).from_pretrained(str(path), dtype=torch.float32).eval()
    else:
        from .speculators_loop import load_draft
        try:
            import speculators  # noqa: F401
        except ImportError as e:
            raise AuthorsLoopError(f"draft {path}: a speculators checkpoint needs speculators (graphgen[torch]): "
                                   f"missing {e.name or e}") from None
        draft = load_draft(target, path)
    if authors == "zlab":
        # dflash_generate reads hidden_states[id + 1]: the output of target layer `id`
        bad = [i for i in draft.target_layer_ids if not 0 <= int(i) < n_layer]
        if bad:
            raise AuthorsLoopError(f"draft {path}/config.json: target layer id {bad[0]} out of range "
                                   f"0..{n_layer - 1} of the target {tpath.name}")
    else:
        # speculators' aux_hidden_state_layer_ids index hidden_states: layer id's input
        bad = [i for i in draft.target_layers if not 0 <= int(i) <= n_layer]
        if bad:
            raise AuthorsLoopError(f"draft {path}/config.json: aux_hidden_state_layer_ids {bad[0]} out of range "
                                   f"0..{n_layer} of the target {tpath.name}")
    if not 0 <= int(draft.mask_token_id) < n_vocab:
        raise AuthorsLoopError(f"draft {path}/config.json: mask_token_id {draft.mask_token_id} out of the "
                               f"target's vocabulary ({n_vocab})")
    return target, draft, n_vocab


# -- the loop -------------------------------------------------------------------------------------

def authors_rule(draft, posterior) -> int:
    """dflash_generate's greedy verification: the longest prefix of the drafted tokens equal to the
    target's argmax at the row before each (posterior: the target's argmax per row of the block, the
    anchor's first)."""
    import torch
    draft = torch.as_tensor(list(draft), dtype=torch.long)
    posterior = torch.as_tensor(list(posterior), dtype=torch.long)
    n = min(draft.numel(), posterior.numel())
    return int((draft[:n] == posterior[:n]).to(torch.int64).cumprod(0).sum())


@contextlib.contextmanager
def _observed(target, temp: float):
    """Record, per verification batch of dflash_generate, (anchor, drafted tokens, the target's argmax
    per row, agreed drafted tokens).

    The prefill is the target's first call (logits of its last row only, logits_to_keep=1); every
    later call verifies one block: the anchor then the drafted tokens."""
    import torch
    import dflash.model as zm
    calls, sampled = [], []

    def hook(module, args, kwargs, output):
        ids = args[0] if args else kwargs["input_ids"]
        calls.append((ids[0].clone(), output.logits[0].argmax(dim=-1)))

    def rejection(*args, **kwargs):
        n_acc, bonus = real_rejection(*args, **kwargs)
        sampled.append(int(n_acc))
        return n_acc, bonus

    real_rejection, real_clock = zm._rejection_sample, zm._cuda_time
    handle = target.register_forward_hook(hook, with_kwargs=True)
    zm._rejection_sample = rejection
    if not torch.cuda.is_available():
        # its stats timer synchronizes CUDA; on CPU a plain clock times the same thing
        zm._cuda_time = time.perf_counter
    rounds: list = []
    try:
        yield rounds
    finally:
        handle.remove()
        zm._rejection_sample, zm._cuda_time = real_rejection, real_clock
    for k, (ids, best) in enumerate(calls[1:]):
        drafted = [int(t) for t in ids[1:]]
        agreed = sampled[k] if temp > 0 else authors_rule(drafted, best[:-1])
        rounds.append((int(ids[0]), drafted, [int(t) for t in best], agreed))
    if temp > 0 and len(sampled) != len(rounds):
        raise AuthorsLoopError(f"dflash_generate verified {len(rounds)} blocks but rejection-sampled "
                               f"{len(sampled)}: its loop no longer matches what this module reads")


def _one(target, draft, prompt: list[int], n_predict: int, temp: float, seed: int,
         stop_token_ids, p_min: float = 0.0) -> dict:
    import torch
    from dflash.model import dflash_generate
    confidences = None
    if _is_speculators(draft):
        from .speculators_loop import generate
        tokens, lengths, observed, confidences, seconds = generate(target, draft, prompt, n_predict,
                                                                   stop_token_ids, p_min=p_min)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            with _observed(target, temp) as observed:
                t0 = time.perf_counter()
                res = dflash_generate(draft, target, torch.tensor([prompt], dtype=torch.long), n_predict,
                                      stop_token_ids, temperature=float(temp), return_stats=True)
                seconds = time.perf_counter() - t0
        tokens = [int(t) for t in res.output_ids[0]]
        lengths = [int(n) for n in res.acceptance_lengths]
    if len(lengths) != len(observed):
        raise AuthorsLoopError(f"dflash_generate reported {len(lengths)} rounds, its target verified "
                               f"{len(observed)} blocks: its loop no longer matches what this module reads")
    stops = set(int(t) for t in stop_token_ids or ())
    rounds, blocks, at = [], [], len(prompt) + 1  # the prefill's token comes first
    for (anchor, drafted, best, agreed), produced in zip(observed, lengths):
        if not produced <= agreed + 1:
            raise AuthorsLoopError(f"a round appended {produced} tokens after {agreed} agreed drafted "
                                   "ones: dflash_generate's count is not what this module documents")
        stopped = tokens[at + produced - 1] in stops
        # the round's last appended token is the target's own unless the round was cut at
        # n_predict right after an agreed drafted token; a stop token always ends like the target's
        n_acc = min(agreed, produced - 1) if stopped else min(agreed, produced)
        rounds.append((len(drafted), n_acc))
        # as graphgen records a round: the anchor's position, the draft, the target's token after the
        # accepted ones (-1 where the round was cut before it) and the target's argmax per row
        blocks.append({"pos0": at - 1, "id_last": anchor, "draft": drafted, "n_drafted": len(drafted),
                       "n_accepted": n_acc, "bonus": tokens[at + produced - 1] if produced > n_acc else -1,
                       "target": best})
        at += produced
    if confidences is not None:
        # the confidence head's score of each drafted token, as a p_min cut would read it
        for b, c in zip(blocks, confidences):
            b["confidence"] = c
    return {"rounds": rounds, "blocks": blocks, "tokens": tokens, "seconds": seconds, "authors_lengths": lengths}


def authors_accept(target_gguf, draft_dir, prompts_tokens, n_predict: int, temp: float = 0.0, seed: int = 0,
                   *, stop_token_ids=None, p_min: float = 0.0) -> list[dict]:
    """The authors' loop on each prompt (batch 1, one after another), instrumented: z-lab's
    `dflash_generate` for a z-lab DFlash or DFlash2 checkpoint (DFlash2 drafting through its
    selector), speculators_loop.generate for a speculators DSpark or DFlash one.

    target_gguf: the target GGUF (or a name graphgen knows, e.g. "smollm2"), run in transformers with
    float32 weights dequantized from it; draft_dir: the authors' checkpoint folder (save_pretrained);
    prompts_tokens: one list of token ids per prompt (tokenized as the target's tokenizer does, BOS
    included where it adds one); n_predict: tokens to generate per prompt, the prefill's included
    (as llama.cpp's -n); temp 0 is greedy, above it dflash's rejection sampling with torch's
    generator seeded `seed` for every prompt (z-lab's checkpoints only: speculators ships no
    sampling loop); stop_token_ids: the tokens that end a sequence, None to generate exactly
    n_predict; p_min: a speculators DSpark's draft ends before the first token its confidence head
    scores below it, as llama.cpp's --spec-draft-p-min (0: never).

    Returns per prompt {"rounds": [(n_drafted, n_accepted), ...] (n_accepted excluding the target's
    own token, as graphgen and llama.cpp count), "blocks": each round as graphgen records it,
    "tokens": prompt + generated, "seconds": wall time of the loop, "authors_lengths": the tokens
    each round appended (dflash_generate's own acceptance_lengths), "layers": read_layers}.
    """
    if int(n_predict) < 1:
        raise AuthorsLoopError(f"n_predict: {n_predict}; at least 1")
    if float(temp) < 0:
        raise AuthorsLoopError(f"temp: {temp}; 0 (greedy) or more")
    if not 0 <= float(p_min) <= 1:
        raise AuthorsLoopError(f"p_min: {p_min}; a probability, 0 to 1")
    target, draft, n_vocab = load(target_gguf, draft_dir)
    if _is_speculators(draft) and float(temp) > 0:
        raise AuthorsLoopError(f"temp {temp}: the speculators loop here is greedy only (speculators ships no "
                               f"sampling loop); draft {draft_dir} runs at temp 0")
    if not _is_speculators(draft) and float(p_min) > 0:
        raise AuthorsLoopError(f"p_min {p_min}: only a DSpark draft's confidence head reads it")
    prompts = _prompts(prompts_tokens, n_vocab)
    stops = None if stop_token_ids is None else [int(t) for t in stop_token_ids]
    out = [_one(target, draft, p, int(n_predict), float(temp), int(seed), stops, float(p_min)) for p in prompts]
    for r in out:
        r["layers"] = read_layers(draft)
    return out


def _is_speculators(draft) -> bool:
    # speculators' checkpoints run as graphgen.authors.forward.AuthorsDraft; z-lab's as their own class
    return hasattr(draft, "backbone")


def load(target_gguf, draft_dir):
    """(the target in transformers, the authors' draft, n_vocab) as authors_accept runs them."""
    return _load(target_gguf, draft_dir)


def read_layers(draft) -> list[int]:
    """The target layer inputs the draft reads in the authors' loop, in graphgen's numbering (layer
    il's input, dflash.target_layers): dflash_generate's extract_context_feature takes
    hidden_states[id + 1], speculators_loop hidden_states[id] of aux_hidden_state_layer_ids."""
    if _is_speculators(draft):
        return [int(i) for i in draft.target_layers]
    return [int(i) + 1 for i in draft.target_layer_ids]


def replay(target, draft, features, anchor: int, pos0: int, n_draft: int, logits: bool = False):
    """The n_draft tokens the authors' loop drafts after `anchor` at pos0 from the context features
    [pos0, ...] of positions 0..pos0-1, from scratch (draft_block, or speculators_loop.draft_block);
    with `logits`, (tokens, their rows' logits [n_draft, n_vocab]: DSpark's with the Markov bias)."""
    if _is_speculators(draft):
        from . import speculators_loop
        tokens, lg, _ = speculators_loop.draft_block(draft, features, anchor, pos0, n_draft)
    else:
        tokens, lg = draft_block(target, draft, features, anchor, pos0, n_draft + 1)
        if logits and hasattr(draft, "propose"):
            lg = _selector_scores(target, draft, features, anchor, pos0, n_draft, tokens)
    return (tokens, lg) if logits else tokens


def _selector_forward(target, draft, features, anchor, pos0, n_draft):
    """The draft's block rows as its selector reads them: (unary logits [1, n_draft, n_vocab], the
    hidden projection [1, n_draft, rank])."""
    import numpy as np
    import torch
    from dflash.model import _draft_value, _output_head, _raw_input_embeddings
    feats = torch.as_tensor(np.ascontiguousarray(features, dtype=np.float32)).reshape(1, int(pos0), -1)
    block = torch.full((1, int(n_draft) + 1), int(draft.mask_token_id), dtype=torch.long)
    block[0, 0] = int(anchor)
    with torch.inference_mode():
        noise = _raw_input_embeddings(target, block, float(_draft_value(draft.config, "input_embedding_scale", 1.0)))
        hidden = draft(target_hidden=feats, noise_embedding=noise,
                       position_ids=torch.arange(int(pos0) + int(n_draft) + 1)[None], use_cache=False)[:, 1:]
        return draft.compute_logits(hidden, _output_head(target)), draft.candidate_selector.hidden_projection(hidden)


def _selector_scores(target, draft, features, anchor, pos0, n_draft, path):
    """DFlash2's rows as its selector ranks them: at each position, the scores of the row's top-k
    candidates after the walk's previous token (the anchor first), -inf elsewhere; the walk's token
    is each row's best."""
    import numpy as np
    import torch
    sel = draft.candidate_selector
    logits, proj = _selector_forward(target, draft, features, anchor, pos0, n_draft)
    with torch.inference_mode():
        unary, cands = torch.topk(logits, sel.top_k, dim=-1)
        out = np.full((int(n_draft), int(draft.config.vocab_size)), -np.inf, dtype=np.float32)
        for j, prev in enumerate([int(anchor)] + [int(t) for t in path[:-1]]):
            pair = (sel.predecessor_codebook(torch.tensor([prev])) * proj[:, j]) @ sel.successor_codebook(cands[0, j]).T
            out[j, cands[0, j].numpy()] = (unary[0, j] + pair[0]).float().numpy()
    return out


def selector_rows(target, draft, features, anchor: int, pos0: int, n_draft: int, path):
    """DFlash2's rows for every token, candidate or not: (unary logits [n_draft, n_vocab], the score
    the selector gives each token after the walk's previous token in `path` (the anchor first)
    [n_draft, n_vocab], top_k). A token's score does not depend on which others are candidates, so
    these score any top-k set the unary logits could pick."""
    import torch
    sel = draft.candidate_selector
    logits, proj = _selector_forward(target, draft, features, anchor, pos0, n_draft)
    with torch.inference_mode():
        prev = torch.tensor([int(anchor)] + [int(t) for t in path[:n_draft - 1]], dtype=torch.long)
        pair = (sel.predecessor_codebook(prev) * proj[0]) @ sel.successor_codebook.weight.T
        return logits[0].float().numpy(), (logits[0] + pair).float().numpy(), int(sel.top_k)


def draft_block(target, draft, features, anchor: int, pos0: int, size: int):
    """The authors' draft forward for one block as dflash_generate runs it, from scratch: context
    features [pos0, n_layers * n_embd or n_layers, n_embd] of positions 0..pos0-1, the block
    [anchor, mask x (size - 1)] at pos0.. -> (drafted tokens [size - 1], their logits float32
    [size - 1, n_vocab]); a DFlash2 draft's tokens are its selector's greedy walk, as
    dflash_generate's `propose`, the logits its unary ones. dflash_generate feeds the same rows in
    pieces through the draft's cache; its attention over them is the same."""
    import numpy as np
    import torch
    from dflash.model import _draft_value, _output_head, _raw_input_embeddings
    feats = torch.as_tensor(np.ascontiguousarray(features, dtype=np.float32)).reshape(1, int(pos0), -1)
    if size < 2:
        raise AuthorsLoopError(f"draft_block: size {size}; a block holds the anchor and at least one token")
    block = torch.full((1, int(size)), int(draft.mask_token_id), dtype=torch.long)
    block[0, 0] = int(anchor)
    with torch.inference_mode():
        noise = _raw_input_embeddings(target, block, float(_draft_value(draft.config, "input_embedding_scale", 1.0)))
        hidden = draft(target_hidden=feats, noise_embedding=noise,
                       position_ids=torch.arange(int(pos0) + int(size))[None], use_cache=False)[:, 1:, :]
        logits = draft.compute_logits(hidden, _output_head(target))[0].float()
        if hasattr(draft, "propose"):
            path, _, _ = draft.propose(hidden, block[:, 0], _output_head(target), 0.0)
            return [int(t) for t in path[0]], logits.numpy()
    return [int(t) for t in logits.argmax(dim=-1)], logits.numpy()


def mean_acceptance_length(results) -> float:
    """1 + agreed drafted tokens per round over every prompt's rounds: the field's figure, the
    target's own token counted (a draft that never hits scores 1.0)."""
    rounds = [r for res in results for r in res["rounds"]]
    return 1.0 + sum(a for _, a in rounds) / len(rounds) if rounds else 1.0
