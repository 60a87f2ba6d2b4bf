"""Checks of a batch before the session builds its graph: positions, sequences, features, blocks and
their sizes, refused with BatchError naming the field (a ggml assert would kill the interpreter)."""

from __future__ import annotations

import numpy as np

from ..errors import BatchError
from ..models.head import BlockRules

POS_MAX = 2**31 - 1          # llama_pos is int32


def _int(v, what: str) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise BatchError(f"{what} must be an integer, got {v!r}")
    return int(v)


def check_positions(pos0, n: int, what: str = "batch") -> int:
    """pos0 .. pos0 + n - 1 fit llama_pos (int32) and are not negative."""
    p = _int(pos0, f"{what}: position pos0")
    if p < 0:
        raise BatchError(f"{what}: negative position {p} in the batch")
    if p + max(n, 1) - 1 > POS_MAX:
        raise BatchError(f"{what}: position {p + n - 1} is past the largest position {POS_MAX}")
    return p


def check_seq(seq, n_seq: int, what: str = "batch") -> int:
    """A sequence id in [0, n_seq), checked before it is cast to int32."""
    s = _int(seq, f"{what}: sequence id")
    if not 0 <= s < n_seq:
        raise BatchError(f"sequence id {s} is outside [0, {n_seq})")
    return s


def check_batch(pos: np.ndarray, seq: np.ndarray, n_ubatch: int, n_seq: int, limit: str = "") -> None:
    """The checks of every batch: size, positions, sequence ids.

    A position may repeat within a sequence: llama.cpp accepts that as long as the positions
    neither decrease nor leave a gap (check_seq_positions)."""
    if pos.ndim != 1 or pos.shape[0] == 0:
        raise BatchError("a batch needs at least one token")
    if pos.shape[0] > n_ubatch:
        raise BatchError(f"batch of {pos.shape[0]} tokens is larger than {limit or f'n_ubatch {n_ubatch}'}")
    if (pos < 0).any():
        raise BatchError(f"negative position {int(pos.min())} in the batch")
    bad = (seq < 0) | (seq >= n_seq)
    if bad.any():
        raise BatchError(f"sequence id {int(seq[bad][0])} is outside [0, {n_seq})")


def _positions_ok(pos: np.ndarray, seq: np.ndarray, cache_pos_max, mrope: bool, is_embd: bool) -> bool:
    """True when the batch passes every rule of check_seq_positions, in O(tokens) numpy work.

    Any doubt returns False, and the rule-by-rule walk finds the first rule broken and says so."""
    if pos.size == 0:
        return False
    if seq[0] == seq[-1] and (seq == seq[0]).all():
        groups = [(int(seq[0]), pos)]
    else:
        order = np.argsort(seq, kind="stable")
        ss, ps = seq[order], pos[order]
        cuts = np.flatnonzero(np.diff(ss)) + 1
        groups = [(int(g[0]), p) for g, p in zip(np.split(ss, cuts), np.split(ps, cuts))]
    for s, p in groups:
        d = np.diff(p)
        if (d < 0).any():
            return False  # decreasing: the walk names the row
        y, x = int(p[0]), int(cache_pos_max(s))
        if mrope:
            if x >= 0 and (x > y if is_embd else x >= y):
                return False
            continue
        if x >= 0 and y != x + 1:
            return False
        # non-decreasing, so the distinct positions are the first one and every increase
        if int(p[-1]) - y + 1 > 1 + int(np.count_nonzero(d)):
            return False
    return True


def check_seq_positions(pos: np.ndarray, seq: np.ndarray, cache_pos_max, mrope: bool, is_embd: bool) -> None:
    """The position rules llama.cpp's batch allocator applies before a batch runs, in its order.

    `cache_pos_max(s)` is the last position the KV cache holds for sequence s (-1: none). Per
    sequence of the batch, lowest id first: without M-RoPE its first position Y must follow the
    cache's last one X (Y = X + 1) and its positions must leave no gap; with M-RoPE positions may
    jump forward, but a token batch must start after X (X < Y) and an embedding batch at or after
    it (X <= Y). Then, in batch order, no sequence's positions may decrease. llama.cpp refuses a
    batch that breaks one of these (llama_process returns -1), so graphgen does too."""
    pos = np.asarray(pos, dtype=np.int64)
    seq = np.asarray(seq, dtype=np.int64)
    if _positions_ok(pos, seq, cache_pos_max, mrope, is_embd):
        return
    for s in sorted(set(seq.tolist())):
        p = pos[seq == s]
        y, x = int(p.min()), int(cache_pos_max(s))
        if mrope:
            if x >= 0 and (x > y if is_embd else x >= y):
                rule = "X <= Y for an embedding batch" if is_embd else "X < Y for a token batch"
                raise BatchError(f"sequence {s}: inconsistent sequence positions: the KV cache's last position "
                                 f"for sequence {s} is X = {x} and the batch starts at position Y = {y}; "
                                 f"with M-RoPE llama.cpp requires {rule}")
            continue
        if x >= 0 and y != x + 1:
            raise BatchError(f"sequence {s}: inconsistent sequence positions: the KV cache's last position for "
                             f"sequence {s} is X = {x} and the batch starts at position Y = {y}; llama.cpp "
                             "requires the sequence positions to remain consecutive: Y = X + 1 (remove the "
                             "cache's later positions with seq_rm first)")
        n_distinct = len(set(p.tolist()))
        if int(p.max()) - y + 1 > n_distinct:
            raise BatchError(f"sequence {s} positions are not continuous: the batch holds {n_distinct} distinct "
                             f"positions between {y} and {int(p.max())} for sequence {s}")
    last: dict[int, int] = {}
    for i, (s, p) in enumerate(zip(seq.tolist(), pos.tolist())):
        if p < last.get(s, -1):
            raise BatchError(f"sequence {s} positions are decreasing (not allowed): batch row {i} has "
                             f"position {p} after position {last[s]}")
        last[s] = p


def check_features(x, width: int) -> np.ndarray:
    """Target features: a finite float32 [n_tokens, width] array."""
    try:
        a = np.asarray(x, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise BatchError(f"target features are not a numeric array ({e})") from None
    if a.ndim != 2 or a.shape[1] != width:
        raise BatchError(f"target features must be [n_tokens, {width}] (len(target_layers) * n_embd), "
                         f"got shape {list(a.shape)}")
    if not np.isfinite(a).all():
        raise BatchError("target features contain NaN or Inf")
    return np.ascontiguousarray(a)


def _rules(rules) -> BlockRules:
    """A head's BlockRules, or those of a head that asks nothing."""
    return rules if rules is not None else _NO_RULES


_NO_RULES = BlockRules("dflash")


def _blocks_fit(rules, n: int, n_blocks: int) -> bool:
    """The head's rules hold for n tokens in n_blocks blocks."""
    if not rules.equal_blocks or not n_blocks:
        return True
    return not n % n_blocks and not (rules.max_block > 0 and n // n_blocks > rules.max_block)


def quick_blocks(blocks, rules, n_vocab: int, n_ubatch: int, n_seq: int):
    """(tokens, positions, sequence ids, runs) for a batch of plainly valid blocks of distinct
    sequences, checked in Python at the cost of a few comparisons per block; None for anything
    else, which block_arrays and check_batch then check one rule at a time (naming the problem).
    Covers block_arrays' and check_batch's rules; the positions against the cache are
    runs_follow_cache's."""
    if type(blocks) not in (list, tuple) or not blocks:
        return None
    runs, toks, seen, n = [], [], set(), 0
    for b in blocks:
        if type(b) not in (list, tuple) or len(b) != 3:
            return None
        s, t, p0 = b
        if type(s) is not int or type(p0) is not int or type(t) not in (list, tuple) or not t:
            return None
        if s in seen or not 0 <= s < n_seq or p0 < 0 or p0 + len(t) - 1 > POS_MAX:
            return None
        if not all(type(x) is int for x in t) or min(t) < 0 or max(t) >= n_vocab:
            return None
        seen.add(s)
        runs.append((s, p0, len(t)))
        toks.extend(t)
        n += len(t)
    if n > n_ubatch:
        return None
    if not _blocks_fit(_rules(rules), n, len(runs)):
        return None
    if len(runs) == 1:
        s, p0, k = runs[0]
        pos, seq = np.arange(p0, p0 + k, dtype=np.int32), np.full(k, s, dtype=np.int32)
    else:
        pos = np.concatenate([np.arange(p0, p0 + k, dtype=np.int32) for _, p0, k in runs])
        seq = np.repeat(np.array([s for s, _, _ in runs], dtype=np.int32), [k for _, _, k in runs])
    return np.array(toks, dtype=np.int32), pos, seq, runs


def runs_follow_cache(runs, cache_pos_max, mrope: bool, is_embd: bool) -> bool:
    """check_seq_positions' rules for runs of consecutive positions of distinct sequences: each
    run must follow its sequence's last cached position. False: let check_seq_positions say why."""
    for s, p0, _ in runs:
        x = cache_pos_max(s)
        if mrope:
            if x >= 0 and (x > p0 if is_embd else x >= p0):
                return False
        elif x >= 0 and p0 != x + 1:
            return False
    return True


def _block_arrays_fast(blocks, n_vocab: int):
    """block_arrays' result in a few numpy calls when every entry is plainly valid, else None
    (and the entry-by-entry walk names the first problem)."""
    toks, pos, seq = [], [], []
    for b in blocks:
        if type(b) not in (list, tuple) or len(b) != 3 or type(b[0]) is not int or type(b[2]) is not int:
            return None
        s, t, p0 = b
        if isinstance(t, np.ndarray):
            if t.ndim != 1 or t.dtype.kind not in "iu":
                return None
        elif type(t) not in (list, tuple) or not all(type(x) is int for x in t):
            return None
        n = len(t)
        if not 0 <= s <= POS_MAX or p0 < 0 or p0 + max(n, 1) - 1 > POS_MAX:
            return None
        toks.append(np.asarray(t, dtype=np.int64))
        pos.append(np.arange(p0, p0 + n, dtype=np.int32))
        seq.append(np.full(n, s, dtype=np.int32))
    t = np.concatenate(toks) if len(toks) > 1 else toks[0]
    if t.size and (t.min() < 0 or t.max() >= n_vocab):
        return None
    return (t.astype(np.int32), np.concatenate(pos) if len(pos) > 1 else pos[0],
            np.concatenate(seq) if len(seq) > 1 else seq[0])


def _blocks_divide(seq: np.ndarray, rules) -> bool:
    """The head's block rules hold for these sequence ids (or do not apply)."""
    if not rules.equal_blocks or seq.size == 0:
        return True
    n_blocks = len(np.unique(seq)) if seq[0] != seq[-1] or not (seq == seq[0]).all() else 1
    return _blocks_fit(rules, int(seq.size), n_blocks)


def block_arrays(blocks, rules, n_vocab: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[(seq, tokens, pos0), ...] -> int32 tokens, positions, sequence ids, checked before any cast.

    A sequence may come twice (llama.cpp accepts it when its positions stay continuous; the
    positions are checked against the cache in check_seq_positions). A head whose rules ask for
    equal blocks (graphgen.models.head.BlockRules) takes one block per distinct sequence: the
    batch must divide into equal blocks, and a lattice that keeps max_block rows per block (DFlash2)
    must cover every token, since llama.cpp reads one lattice row per token and aborts otherwise."""
    rules = _rules(rules)
    if not isinstance(blocks, (list, tuple)) or not blocks:
        raise BatchError("a block batch needs at least one (seq, tokens, pos0) entry")
    fast = _block_arrays_fast(blocks, n_vocab)
    if fast is not None and _blocks_divide(fast[2], rules):
        return fast
    toks, pos, seq = [], [], []
    for k, b in enumerate(blocks):
        if not isinstance(b, (list, tuple)) or len(b) != 3:
            raise BatchError(f"block {k} must be (seq, tokens, pos0), got {b!r}")
        s = _int(b[0], f"block {k}: sequence id")
        t = [_int(x, f"block {k}: token") for x in b[1]]
        p0 = check_positions(b[2], len(t), f"block {k}")
        for x in t:
            if not 0 <= x < n_vocab:
                raise BatchError(f"token id {x} is outside the vocabulary [0, {n_vocab})")
        if not -2**31 <= s <= POS_MAX:
            raise BatchError(f"sequence id {s} is outside [0, {POS_MAX}]")
        toks += t
        pos += range(p0, p0 + len(t))
        seq += [s] * len(t)
    n, n_blocks = len(toks), len(set(seq))
    if rules.equal_blocks and n_blocks and n % n_blocks:
        sizes = [seq.count(s) for s in sorted(set(seq))]
        raise BatchError(f"a block batch of {n} tokens over {n_blocks} sequences (tokens per sequence {sizes}) "
                         f"does not divide into equal blocks, which the {rules.head} head needs "
                         "(llama.cpp asserts n_tokens % n_seqs == 0)")
    if rules.equal_blocks and rules.max_block > 0 and n_blocks and n // n_blocks > rules.max_block:
        raise BatchError(f"blocks of {n // n_blocks} tokens are longer than the trained block size {rules.max_block} "
                         f"(key 'dflash.block_size'): the {rules.head} lattice has block_size rows per block and "
                         "llama.cpp aborts reading one row per token")
    return (np.asarray(toks, dtype=np.int32), np.asarray(pos, dtype=np.int32), np.asarray(seq, dtype=np.int32))


def check_embd_state(st, n_tokens: int, n_embd: int) -> np.ndarray | None:
    """LiliCorr's per-token state rows: float32 [n_tokens, n_embd], finite."""
    if st is None:
        return None
    try:
        a = np.asarray(st, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise BatchError(f"embd_state is not a numeric array ({e})") from None
    if a.shape != (n_tokens, n_embd):
        raise BatchError(f"embd_state must be [{n_tokens}, {n_embd}], got {list(a.shape)}")
    return np.ascontiguousarray(a)
