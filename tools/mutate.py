#!/usr/bin/env python3
"""Mutation check: plant one plausible one-line bug at a time and see whether the tests notice.

Each mutation names where it goes: a function or method by its qualified name
(`KVCache.seq_rm`, `GraphBase.build_layers`, a nested `outer.inner`), found by parsing every
module of graphgen/ (`path.py:name` when a name is not unique; a bare `path.py` for module-level
code), then a piece of code that must occur exactly once there, matched whatever the spaces and
line breaks around its tokens, the code that replaces it, and the tests that should catch the
change. A mutation thus follows its function when the function moves to another file, or the
file is reformatted. The tree is copied (the files git tracks, plus untracked ones it does not
ignore) into a temporary folder; each mutation is applied there, the tests run against that copy
(PYTHONPATH points at it, so the editable install of the real tree is not used), and the file is
restored. A mutation is

  caught    the tests failed (pytest exit 1),
  SURVIVED  they passed: the tests do not see this bug,
  ERROR     its place or its code is not found, or pytest could not run (exit 2-5): fix the list.

    python tools/mutate.py              # every mutation; exit 1 if any survived or errored
    python tools/mutate.py --list       # names and places
    python tools/mutate.py --check      # every place and code found (no tests run)
    python tools/mutate.py -k sinkhorn  # those whose name contains the word (-k again: or another)
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutation:
    name: str
    where: str   # a function's qualified name, "file.py:qualified name", or "file.py" (module level)
    old: str
    new: str
    tests: tuple[str, ...]


def _defs(source: str) -> list[tuple[str, int, int]]:
    """(qualified name, first line, last line) of every function and method of a module."""
    out = []

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    out.append((name, child.lineno, child.end_lineno))
                walk(child, name + ".")
            else:
                walk(child, prefix)
    walk(ast.parse(source), "")
    return out


def _loose(code: str) -> re.Pattern:
    """`code` as a pattern that any spacing and line breaking of its tokens also matches: words
    stay apart, anything else may gain or lose spaces and line breaks around it."""
    toks = re.findall(r"\w+|\S", code)
    out = [re.escape(toks[0])] if toks else []
    for prev, tok in zip(toks, toks[1:]):
        word = (prev[-1].isalnum() or prev[-1] == "_") and (tok[0].isalnum() or tok[0] == "_")
        out.append(r"\s+" if word else r"\s*")
        out.append(re.escape(tok))
    return re.compile("".join(out))


_DEFS: dict[str, list] = {}


def _defs_of(text: str) -> list[tuple[str, int, int]]:
    if text not in _DEFS:
        _DEFS[text] = _defs(text)
    return _DEFS[text]


def locate(tree: Path, m: Mutation) -> tuple[Path, int, int]:
    """The file and character span the mutation replaces; ValueError saying why when it cannot."""
    if ":" in m.where or m.where.endswith(".py"):
        rel, _, name = m.where.partition(":")
        files = [tree / rel]
    else:
        rel, name = None, m.where
        files = sorted((tree / "graphgen").rglob("*.py"))
    spans = []
    for f in files:
        text = f.read_text()
        if not name:
            spans.append((f, text, 0, len(text)))
            continue
        starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]
        if name.rsplit(".", 1)[-1] not in text:
            continue  # a function this file does not hold: no need to parse it
        for q, a, b in _defs_of(text):
            if q == name:
                spans.append((f, text, starts[a - 1], starts[b] if b < len(starts) else len(text)))
    if len(spans) != 1:
        raise ValueError(f"{m.where}: {'no' if not spans else len(spans)} such function" + ("" if not spans else
                         f"s ({', '.join(str(s[0].relative_to(tree)) for s in spans)}); name the file"))
    f, text, a, b = spans[0]
    hits = list(_loose(m.old).finditer(text, a, b))
    if len(hits) != 1:
        raise ValueError(f"the code occurs {len(hits)} times in {m.where} ({f.relative_to(tree)})")
    return f, hits[0].start(), hits[0].end()


PARITY = ("tests/reference/test_parity.py",)
DSV4 = ("tests/models/test_backbones.py", "tests/reference/test_reference_dsv4.py")
SEED_ONLY = ("tests/models/test_backbones.py", "tests/models/test_heads.py", "tests/models/test_seed_reference.py")
RANDOM = ("tests/reference/test_reference_random.py",)
HEADS = ("tests/reference/test_reference_random_heads.py",)
ROPE = ("tests/reference/test_reference_rope.py",)
DIFF = ("tests/compare/test_diff.py",)
DEBUGGING = ("tests/compare/test_debugging.py",)
SEEDREF = ("tests/models/test_seed_reference.py",)
KVCACHE = ("tests/runtime/test_kvcache.py",)
SESSION = ("tests/runtime/test_session.py",)
SESSIONS = ("tests/reference/test_reference_sessions.py",)
DRAFTERS = ("tests/speculative/test_drafters.py",)
# the authors' models alone (needs graphgen[torch]): graph bugs llama.cpp's parity would also
# catch, seen here from the authors' side, and bugs in the comparison itself
AUTHORS = ("tests/authors/test_authors.py",)
VIEWER = ("tests/view/test_viewer_browser.py",)
ARBITER = ("tests/authors/test_arbiter.py",)
AUTHORS_COMPARE = ("tests/authors/test_compare.py",)
CONVERT = ("tests/authors/test_convert.py",)

IMPORT_VALUES = ("tests/compare/test_import_values.py",)
CHECK_BATCH = ("tests/checkbatch/test_plan.py", "tests/checkbatch/test_engines.py", "tests/checkbatch/test_matching.py",
               "tests/checkbatch/test_measure.py", "tests/checkbatch/test_results.py", "tests/checkbatch/test_check.py")
LOOP = ("tests/speculative/test_llamaloop.py",)
LOCAL = ("tests/compare/test_local.py",)
REDUCE = ("tests/reduce/test_case.py", "tests/reduce/test_failure.py", "tests/reduce/test_shrink.py",
          "tests/reduce/test_repro.py")
REDUCE_HF = ("tests/reduce/test_case.py", "tests/reduce/test_failure.py")
REDUCE_HF_E2E = ("tests/reduce/test_checkpoint.py",)
FORWARD = ("tests/authors/test_forward.py",)
DUMP_FORMAT = ("tests/dump/test_format.py",)
LOOP_UNIT = ("tests/speculative/test_llamaloop.py::test_compare_names_the_earliest_parting_and_refuses_nothing",)

MUTATIONS = [
    # --- the base backbone (graph_base) ---
    Mutation("kq_scale_sqrt_dropped", "GraphBase.build_layers",
             "inv_sqrtf(self.n_embd_head)", "1.0 / float(self.n_embd_head)", PARITY),
    # one float ulp: upstream works 1.0f/sqrtf(n) in float; the random suites draw head sizes where
    # the double result rounds to another float
    Mutation("kq_scale_in_double", "GraphBase.build_layers",
             "inv_sqrtf(self.n_embd_head)", "1.0 / math.sqrt(float(self.n_embd_head))", RANDOM),
    Mutation("head_kq_scale_in_double", "GraphBase.build_layers",
             "inv_sqrtf(self.n_embd_head)", "1.0 / math.sqrt(float(self.n_embd_head))", HEADS),
    Mutation("dsv4_kq_scale_in_double", "build_attention",
             "inv_sqrtf(n_embd_head), il)", "1.0 / __import__('math').sqrt(float(n_embd_head)), il)",
             ("tests/reference/test_reference_dsv4.py",)),
    Mutation("lilicorr_kq_scale_in_double", "build_lilicorr_scores",
             "kq_scale = inv_sqrtf(head_dim)", "kq_scale = 1.0 / math.sqrt(head_dim)", HEADS),
    Mutation("ml4_kq_scale_in_double", "GraphMistralLarge4._block",
             "kq_scale = inv_sqrtf(k_mla)", "kq_scale = 1.0 / __import__('math').sqrt(float(k_mla))",
             ("tests/models/test_backbones.py",)),
    Mutation("inv_sqrtf_in_double", "inv_sqrtf",
             "float(np.float32(1.0) / sqrtf(n))", "1.0 / float(np.sqrt(float(n)))", RANDOM),
    Mutation("embedding_scale_ignored", "GraphBase.build_layers",
             "inpL = ggml_scale(ctx, inpL, hp.f_embedding_scale)", "inpL = inpL", RANDOM),
    Mutation("value_scale_inverted", "GraphBase.build_layers",
             "cur = ggml_scale(ctx, cur, hp.f_attn_value_scale)",
             "cur = ggml_scale(ctx, cur, 1.0 / hp.f_attn_value_scale)", RANDOM + PARITY),
    Mutation("logit_scale_ignored", "GraphBase.build_logits",
             "cur = ggml_scale(ctx, cur, hp.f_logit_scale)", "cur = cur", HEADS),
    Mutation("softcap_not_restored", "GraphBase.build_logits",
             "cur = ggml_scale(ctx, cur, hp.f_final_logit_softcapping)", "cur = cur", HEADS),
    Mutation("rms_eps_dropped", "GraphContext.build_norm",
             "cur = ggml_rms_norm(self.ctx0, cur, self.hparams.f_norm_rms_eps)",
             "cur = ggml_rms_norm(self.ctx0, cur, 0.0)", PARITY),
    Mutation("sinks_ignored_fa_off", "GraphContext.build_attn_mha",
             "            ggml_soft_max_add_sinks(kq, sinks)\n", "", PARITY + RANDOM),
    Mutation("weight_scale_ignored", "GraphContext.build_lora_mm",
             "            res = ggml_mul(self.ctx0, res, w_s)", "            res = res", RANDOM),
    Mutation("causal_flag_ignored", "GraphContext._build_attn_inp_kq_mask.into",
             "return slot.cache.kq_mask_values(p.ubatch, slot.n_kv, p.causal_attn, npdt, out=out)",
             "return slot.cache.kq_mask_values(p.ubatch, slot.n_kv, False, npdt, out=out)", RANDOM),
    Mutation("bonus_anchor_slot_biased", "build_dspark_markov_head",
             "cat = ggml_cont(ctx0, ggml_view_2d(ctx0, base, n_vocab, n_blocks, base_stride, 0))",
             "cat = ggml_scale(ctx0, ggml_cont(ctx0, ggml_view_2d(ctx0, base, n_vocab, n_blocks, base_stride, 0)), 2.0)",
             PARITY + HEADS),
    # --- seen by the draft authors' own models ---
    Mutation("authors_kq_scale_sqrt_dropped", "GraphBase.build_layers",
             "inv_sqrtf(self.n_embd_head)", "1.0 / float(self.n_embd_head)", AUTHORS),
    Mutation("authors_markov_chain_reads_base_logits", "build_dspark_markov_head",
             "prev = ggml_argmax(ctx0, col)", "prev = ggml_argmax(ctx0, base_i)", AUTHORS),
    Mutation("authors_conv_taps_one_short", "build_dflash2_conv",
             "n_taps = min(kernel_size, block_size)", "n_taps = min(kernel_size, block_size) - 1", AUTHORS),
    Mutation("authors_band_ignored", "_compare_into",
             'status = "ok" if rel < res.band_of(tn.name) else "out of band"', 'status = "ok"', AUTHORS),
    Mutation("authors_lattice_walk_first_candidate", "lattice_path",
             "pred = int(np.argmax(scores))", "pred = 0", AUTHORS),
    Mutation("authors_nan_positions_compared", "graphgen/authors/compare.py:compare_values",
             "keep = ~np.isnan(a)", "keep = np.ones(a.shape, dtype=bool)", AUTHORS),
    Mutation("authors_rel_l2_over_the_ggml_side", "graphgen/authors/compare.py:compare_values",
             "den = float(np.sqrt(np.sum(a * a)))", "den = float(np.sqrt(np.sum(b * b)))", AUTHORS_COMPARE),
    Mutation("authors_mixed_cache_gets_f32_bands", "_band_for",
             'if types == {"f32"}:', 'if "f32" in types:', AUTHORS_COMPARE),
    Mutation("authors_unmapped_counts_every_node", "_compare_into",
             "res.unmapped += len(o.nodes) - len(matched)", "res.unmapped += len(o.nodes)", AUTHORS_COMPARE),
    # --- the comparing side's pieces, tested directly: printed values, --at, filters, layers ---
    Mutation("printed_element_one_ulp", "compare_node",
             "tol = half + ELEMENT_ULPS * EPS32 * max(abs(a), abs(b))", "tol = half + EPS32 * max(abs(a), abs(b))",
             ("tests/compare/test_printed.py",)),
    Mutation("probe_window_planes_swapped", "window", "[at[3], at[2]]", "[at[2], at[3]]",
             ("tests/compare/test_probe.py",)),
    Mutation("filter_name_anchored_at_the_start", "NodeFilter.__call__",
             "any(p.search(node.name) for p in self.names)", "any(p.match(node.name) for p in self.names)",
             ("tests/compare/test_nodefilter.py",)),
    Mutation("layers_auto_name_skips_its_producer", "node_layers",
             "il = layers[k] if k is not None else name_layer(s)", "il = name_layer(s)",
             ("tests/compare/test_layers.py",)),
    # --- graphgen check's float64 arbiter and the converter's refusals ---
    Mutation("arbiter_band_ignores_the_authors_rounding", "Judged.band",
             "return max(self.floor, RATIO * (self.e_authors or 0.0))", "return self.floor", ARBITER),
    Mutation("arbiter_band_is_the_authors_distance_alone", "Judged.band",
             "return max(self.floor, RATIO * (self.e_authors or 0.0))", "return RATIO * (self.e_authors or 0.0)",
             ARBITER),
    Mutation("arbiter_uncompared_node_passes", "Judged.llama_departs",
             "return self.e_llama is None or self.e_llama > self.band", "return self.e_llama is not None and "
             "self.e_llama > self.band", ARBITER),
    Mutation("arbiter_every_near_tie_excused", "Arbitration.choices_depart",
             "if n - eq - excused > 0:", "if n - eq - excused > n:", ARBITER),
    Mutation("arbiter_floor_without_depth", "floor_band",
             "return UNIT[cache] * GROWTH * (1 + depth)", "return UNIT[cache] * GROWTH", ARBITER),
    Mutation("arbiter_drift_blames_nobody", "Judged.authors_drift",
             "return self.e_authors > max(UNIT[\"f32\"] * GROWTH * (1 + self.depth), RATIO * self.e_llama)",
             "return False", ARBITER),
    Mutation("check_scenario_never_cut", "croppable",
             "if not draft.sliding_layers:", "if True:", ARBITER),
    Mutation("check_block_capped_at_8", "default_check_scenario",
             "block = [7] + [mask_token_id] * (block_size - 1)",
             "block = [7] + [mask_token_id] * (min(block_size, 8) - 1)", ARBITER),
    Mutation("convert_yarn_beta_default_wrong", "_refuse_departures",
             'for name, default in (("beta_fast", 32.0), ("beta_slow", 1.0)):',
             'for name, default in (("beta_fast", 32.0), ("beta_slow", 2.0)):', CONVERT),
    Mutation("convert_dflash2_output_scale_refused", "_refuse_departures",
             'and arch == "DFlashDraftModel":', 'and arch in ("DFlashDraftModel", "DFlash2DraftModel"):', CONVERT),
    Mutation("convert_conf_markov_not_refused", "_refuse_departures",
             'hp.get("confidence_head_with_markov") is False', 'hp.get("confidence_head_with_markov") is None',
             CONVERT),
    # --- rope ---
    Mutation("rope_attn_factor_ignored", "rope_params",
             "attn = f32(attn * f32(hp.rope_attn_factor))", "attn = f32(attn)", ROPE),
    Mutation("rope_yarn_ext_factor_off", "rope_params",
             "ext_factor=1.0 if yarn else 0.0, attn_factor=float(attn),",
             "ext_factor=0.0, attn_factor=float(attn),", ROPE),
    Mutation("rope_orig_ctx_ignored", "rope_params",
             "n_ctx_orig = hp.n_ctx_orig_yarn if hp.n_ctx_orig_yarn != 0 else hp.n_ctx_train",
             "n_ctx_orig = hp.n_ctx_train", ROPE),
    Mutation("rope_none_keeps_freq_scale", "rope_params",
             'freq_scale = f32(1.0) if hp.rope_scaling_type == "none" else f32(hp.rope_freq_scale)',
             "freq_scale = f32(hp.rope_freq_scale)", ROPE),
    Mutation("rope_freqs_ignored", "Layer.__init__",
             "self.rope_freqs = tensors.get(arch.ROPE_FREQS.name)", "self.rope_freqs = None", ROPE),
    # --- graph outputs and the dump ---
    Mutation("outputs_not_marked", "GraphResult.set_outputs",
             "                G.ggml_set_output(t)", "                pass",
             ("tests/compare/test_yardstick.py", "tests/reference/test_reference_random_heads.py::test_lilicorr_context_row_is_the_injected_feature")),
    Mutation("digest_ignored_in_diff", "diff_dumps",
             "same = r.digest == o.digest", "same = True", ("tests/compare/test_yardstick.py",)),
    Mutation("not_compared_dropped", "diff_dumps",
             'not_compared.append((i, j, r.name, f"no values or digest in {why}"))', "pass",
             ("tests/compare/test_yardstick.py",)),
    # --- KV cache and masks ---
    Mutation("mask_causal_off_by_one", "KVCache.kq_mask_values",
             "seen = (pc <= qc) if causal else", "seen = (pc < qc) if causal else", RANDOM + KVCACHE),
    Mutation("mask_swa_window_widened", "KVCache.kq_mask_values",
             "seen &= (qc - pc) < self.n_swa", "seen &= (qc - pc) <= self.n_swa", PARITY + RANDOM + KVCACHE),
    Mutation("mask_edge_cells_short", "KVCache.kq_mask_values",
             "edge = base & (((pos > lo_lo) & (pos <= lo_hi)) | ((pos > hi_lo) & (pos <= hi_hi)))",
             "edge = base & (((pos > lo_lo) & (pos <= lo_hi)) | ((pos > hi_lo) & (pos < hi_hi)))", KVCACHE + RANDOM),
    # --- host-side bookkeeping (kept incrementally, journaled, checked on a fast path) ---
    Mutation("kv_used_max_not_advanced", "KVCache.apply_ubatch",
             "st[1] = max(st[1], int(idx.max()) + 1)", "st[1] = max(st[1], int(idx.min()) + 1)", KVCACHE),
    Mutation("kv_seq_pos_max_stale", "KVCache.apply_ubatch",
             "st[2][s0] = max(st[2][s0], int(pos.max()))", "st[2][s0] = max(st[2][s0], int(pos.min()))", KVCACHE),
    Mutation("kv_seq_rm_keeps_last_cell", "KVCache.seq_rm",
             "if nz.size and int(nz[-1]) + 1 == st[1]:", "if nz.size and int(nz[-1]) == st[1]:", KVCACHE),
    Mutation("kv_runs_used_max_not_advanced", "KVCache._apply_runs",
             "st[1] = max(int(st[1]), int(idx.max()) + 1)", "st[1] = max(int(st[1]), int(idx.min()) + 1)", KVCACHE),
    Mutation("kv_runs_pos_max_past_the_run", "KVCache._apply_runs",
             "st[2][s] = max(int(st[2][s]), p0 + n - 1)", "st[2][s] = max(int(st[2][s]), p0 + n)", KVCACHE),
    Mutation("kv_restore_empty_keeps_owner", "KVCache.restore",
             "                self.seq_mask[:, entry[1]] = False", "                pass", KVCACHE),
    Mutation("kv_restore_skips_mask", "KVCache.restore",
             "self.seq_mask[:mask.shape[0], idx] = mask", "pass", KVCACHE),
    Mutation("quick_blocks_vocab_unchecked", "quick_blocks",
             "if not all(type(x) is int for x in t) or min(t) < 0 or max(t) >= n_vocab:",
             "if not all(type(x) is int for x in t) or min(t) < 0:", ("tests/runtime/test_refusals.py", "tests/runtime/test_errors.py")),
    Mutation("runs_gap_accepted", "runs_follow_cache",
             "elif x >= 0 and p0 != x + 1:", "elif x >= 0 and p0 <= x:", ("tests/runtime/test_refusals.py",)),
    Mutation("results_not_settled", "Session._compute",
             "            if other.results and other.sched == slot.sched:", "            if False:", SESSION),
    Mutation("moved_graph_not_unplaced", "Session._allocate",
             "                    self._unplace(other.graph)", "                    pass", SESSION),
    # --- whole sessions against b11739: removals at their edges, cells found again ---
    Mutation("kv_rm_range_end_included", "KVCache.seq_rm",
             "in_range = (self.pos >= 0) & (self.pos >= p0) & (self.pos < p1)",
             "in_range = (self.pos >= 0) & (self.pos >= p0) & (self.pos <= p1)", SESSIONS),
    Mutation("kv_rm_p1_zero_open", "KVCache.seq_rm",
             "p1 = np.iinfo(np.int64).max if p1 < 0 else p1", "p1 = np.iinfo(np.int64).max if p1 <= 0 else p1",
             SESSIONS),
    Mutation("kv_rm_all_sequences_as_last", "KVCache.seq_rm",
             "        if seq < 0:\n            hit = in_range", "        if seq < -1:\n            hit = in_range", SESSIONS),
    Mutation("kv_rm_head_kept", "KVCache.seq_rm",
             "            self.head = int(nz[0])", "            pass", SESSIONS),
    Mutation("kv_slot_search_restart_early", "KVCache.find_slot",
             "if head > self.used() + 2 * n:", "if head > self.used() + n:", SESSIONS),
    Mutation("kv_swa_cell_reused_a_step_late", "KVCache.find_slot",
             "can_use |= single & ((pmax[owner] + 1 - self.pos) >= self.n_swa)",
             "can_use |= single & ((pmax[owner] + 1 - self.pos) > self.n_swa)", SESSIONS),
    Mutation("batch_not_capped_at_n_ctx", "Session.__init__",
             "self.n_batch = min(n_ctx, n_ubatch) if hp.ctx_causal else n_ubatch", "self.n_batch = n_ubatch",
             SESSIONS),
    Mutation("unplace_misses_leaves", "_graph_tensors",
             "        todo += [s for s in c.src if s]", "        todo += []", ("tests/runtime/test_compute_buffer.py",)),
    # --- the drivers: per-request state, blocks below the trained size ---
    Mutation("dflash2_generator_not_restarted_per_request", "DFlash2Drafter.begin",
             "            self.rng_seed[seq] = -1", "            pass", DRAFTERS),
    Mutation("dflash2_one_generator_for_all_sequences", "DFlash2Drafter.read_draft",
             "u = uniform_real(self.rng[seq], 0.0, 1.0)", "u = uniform_real(self.rng[0], 0.0, 1.0)", DRAFTERS),
    Mutation("dspark_anchor_block_one_longer", "DSparkDrafter.block_tokens",
             "return self.block_n_max(dp) + (0 if self.sample_from_anchor else 1)", "return self.block_n_max(dp) + 1",
             DRAFTERS),
    Mutation("authors_edges_keep_the_whole_block", "DFlashDrafter.block_n_max",
             "if dp.shrink_block and 0 < dp.n_max < self.params.n_max:", "if False:",
             ("tests/speculative/test_loop.py::test_the_authors_edges_shrink_the_block_to_the_tokens_left",)),
    Mutation("lilicorr_block_follows_n_max", "LiliCorrDrafter.block_tokens",
             "return self.block_size  # the scorer", "return self.params.n_max + 1  # the scorer", DRAFTERS),
    Mutation("lilicorr_reads_one_row_short", "LiliCorrDrafter.read_draft",
             "for i in range(1, p.n_max + 1):", "for i in range(1, p.n_max):", DRAFTERS),
    # --- graph-diff's promises, op_params, statistics, xdiff's failures ---
    Mutation("diff_integer_threshold_loosened", "thresholds.threshold",
             "        if typ in EXACT_TYPES:\n            return 0.0", "        if typ in EXACT_TYPES:\n            return fallback",
             DIFF),
    Mutation("diff_settings_ignored", "diff_dumps",
             "settings_differ = _settings_differ(ref, ours)", "settings_differ = []", DIFF),
    Mutation("opparams_view_offset_sign_extended", "graphgen/compare/opparams.py",
             "(p[0] & 0xFFFFFFFF) | ((p[1] & 0xFFFFFFFF) << 32)", "p[0] | ((p[1] & 0xFFFFFFFF) << 32)",
             ("tests/compare/test_opparams.py",)),
    Mutation("xdiff_not_compared_ignored", "compare_dirs",
             "res.ok &= not structural and first_bad is None and not unseen and (bool(r.numeric) or idle_ok)",
             "res.ok &= not structural and first_bad is None", DIFF),
    Mutation("xdiff_integer_nodes_loose", "compare_dirs",
             "exact = op in EXACT_OPS or node.type in EXACT_TYPES", "exact = op in EXACT_OPS", DIFF),
    Mutation("stats_sumsq_is_the_sum", "graphgen/dump/record.py:summarize",
             '"sumsq": float(np.dot(finite, finite))', '"sumsq": float(finite.sum())', ("tests/dump/test_format.py",)),
    Mutation("rope_base_default_wrong", "read_hparams",
             'hp.rope_freq_base = m.get(k("rope.freq_base"), 10000.0, kind="float")',
             'hp.rope_freq_base = m.get(k("rope.freq_base"), 1000000.0, kind="float")', ROPE),
    Mutation("mask_block_uniform_last_row", "KVCache.kq_mask_values",
             "full[rows] = full[rows[0]]", "full[rows] = full[rows[-1]]", SEED_ONLY),
    # --- DeepSeek-V4 backbone ---
    Mutation("sinkhorn_eps_x5", "build_hc_mixes",
             "comb = ggml_dsv4_hc_comb(ctx, mixes, hc_scale, hc_base, hp.dsv4_hc_eps, hp.dsv4_hc_sinkhorn_iters)",
             "comb = ggml_dsv4_hc_comb(ctx, mixes, hc_scale, hc_base, hp.dsv4_hc_eps * 5, hp.dsv4_hc_sinkhorn_iters)",
             DSV4),
    Mutation("hc_post_scale_2_dropped", "build_hc_mixes",
             "post = ggml_scale(ctx, post, 2.0)", "post = ggml_scale(ctx, post, 1.0)", DSV4),
    Mutation("moe_weights_clamp_bound", "GraphContext.build_moe_ffn",
             "weights_sum = G.ggml_clamp(ctx, weights_sum, 6.103515625e-5, float(\"inf\"))",
             "weights_sum = G.ggml_clamp(ctx, weights_sum, 6.103515625e-2, float(\"inf\"))", DSV4),
    Mutation("swiglu_clamp_limit_halved", "GraphContext.build_moe_ffn",
             "cur = G.ggml_swiglu_clamp(ctx, cur, up, limit)", "cur = G.ggml_swiglu_clamp(ctx, cur, up, limit / 2)",
             DSV4),
    Mutation("dsv4_rope_offset_zero", "dsv4_rope",
             "return ggml_rope_set_offset(t, hp.n_embd_head_k - n_rot)", "return ggml_rope_set_offset(t, 0)", DSV4),
    # --- the heads ---
    Mutation("markov_bias_subtracted", "build_dspark_markov_head",
             "col = ggml_add(ctx0, base_i, bias)", "col = ggml_sub(ctx0, base_i, bias)", PARITY + HEADS),
    Mutation("rnn_state_gate_flipped", "build_dspark_markov_head",
             "state = ggml_add(ctx0, cand, ggml_mul(ctx0, gate, ggml_sub(ctx0, state, cand)))",
             "state = ggml_add(ctx0, state, ggml_mul(ctx0, gate, ggml_sub(ctx0, cand, state)))", SEED_ONLY),
    Mutation("ml4_rnn_head_fed_pre_norm", "GraphMistralLarge4._block",
             "build_dspark_markov_head(self, model, inp_tokens, cur)",
             "build_dspark_markov_head(self, model, inp_tokens, inpL)", SEED_ONLY),
    Mutation("ml4_softcap_wrong", "GraphMistralLarge4._block",
             "logits = ggml_scale(ctx, logits, recipf(cap))", "logits = ggml_scale(ctx, logits, 2.0 / cap)",
             SEED_ONLY),
    Mutation("lilicorr_vector_eps_dropped", "build_lilicorr_scores",
             "anchor_out = ggml_l2_norm(ctx0, anchor_out, hparams.lilicorr_vector_eps)",
             "anchor_out = ggml_l2_norm(ctx0, anchor_out, 0.0)", PARITY + HEADS),
    Mutation("dflash2_conv_base_dropped", "build_dflash2_conv",
             "weight_all = ggml_add(ctx0, coeff_all, base_side)", "weight_all = coeff_all", PARITY + HEADS),
    # --- the seed-only graphs against the seed reference (tests/support/seedref) ---
    Mutation("seedref_rnn_hidden_of_the_anchor", "build_dspark_markov_head",
             "block_drafts * G.nb(hidden, 1), i * G.nb(hidden, 1))", "block_drafts * G.nb(hidden, 1), 0)",
             SEEDREF),
    Mutation("seedref_rnn_markov_from_cand_chunk", "build_dspark_markov_head",
             "markov = ggml_tanh(ctx0, chunk(2))", "markov = ggml_tanh(ctx0, chunk(1))", SEEDREF),
    Mutation("seedref_ml4_softcap_tanh_dropped", "GraphMistralLarge4._block",
             "            logits = ggml_tanh(ctx, logits)", "            logits = logits", SEEDREF),
    Mutation("seedref_ml4_mask_embd_ignored", "GraphMistralLarge4.build_inp_noise",
             "if block_drafts > 0 and n_tokens % n_blocks == 0 and block_drafts <= hp.block_size:",
             "if False:", SEEDREF),
    Mutation("seedref_dsv41_block_uniform_off", "GraphDSV41.__init__",
             "inpL = self.build_hc_init(inp_tokens)\n        # every query of a block attends like its anchor does "
             "(block-uniform mask)\n        self.inp_attn.block_uniform = True",
             "inpL = self.build_hc_init(inp_tokens)\n        self.inp_attn.block_uniform = False", SEEDREF),
    Mutation("seedref_ml4_block_uniform_off", "GraphMistralLarge4._block",
             "inpL = self.build_inp_noise(inp_tokens)\n        # every query of a block attends like its anchor does "
             "(block-uniform mask)\n        self.inp_attn.block_uniform = True",
             "inpL = self.build_inp_noise(inp_tokens)\n        self.inp_attn.block_uniform = False", SEEDREF),
    Mutation("seedref_dsv41_ffn_premix_not_lagged", "GraphDSV41.__init__",
             "cur = build_hc_pre_weighted(self, inpL, attn_mix.pre, il)",
             "cur = build_hc_pre_weighted(self, inpL, ffn_mix.pre, il)", SEEDREF),
    Mutation("seedref_dsv41_next_stage_premix", "GraphDSV41.__init__",
             "pre_prev = ffn_mix.pre", "pre_prev = attn_mix.pre", SEEDREF),
    Mutation("seedref_dsv41_q_rms_norm_kept", "GraphDSV41.__init__",
             "q_norm=False, name_qr=False)", "q_norm=True, name_qr=False)", SEEDREF),
    Mutation("seedref_dsv4_derope_dropped", "build_attention",
             "out = dsv4_rope(g, out, inp_pos, back=True)", "out = out", SEEDREF),
    Mutation("seedref_dsv4_wo_a_groups_not_interleaved", "build_attention",
             "oa = ggml_permute(ctx, oa, 0, 2, 1, 3)", "oa = oa", SEEDREF),
    Mutation("seedref_ml4_kq_scale_of_the_latent_key", "GraphMistralLarge4._block",
             "kq_scale = inv_sqrtf(k_mla)", "kq_scale = inv_sqrtf(hp.n_embd_head_k)",
             SEEDREF),
    Mutation("seedref_ml4_q_pe_not_roped", "GraphMistralLarge4._block",
             "q_pe = self.rope(q_pe)", "q_pe = q_pe", SEEDREF),
    Mutation("seedref_markov_chain_on_unbiased_logits", "build_dspark_markov_head",
             "prev = ggml_argmax(ctx0, col)", "prev = ggml_argmax(ctx0, base_i)", SEEDREF),
    Mutation("seedref_markov_bias_subtracted", "build_dspark_markov_head",
             "col = ggml_add(ctx0, base_i, bias)", "col = ggml_sub(ctx0, base_i, bias)", SEEDREF),
    Mutation("seedref_ml4_rnn_fed_pre_norm", "GraphMistralLarge4._block",
             "build_dspark_markov_head(self, model, inp_tokens, cur)",
             "build_dspark_markov_head(self, model, inp_tokens, inpL)", SEEDREF),
    Mutation("seedref_dsv4_kq_scale_of_the_nope_dims", "build_attention",
             "inv_sqrtf(n_embd_head), il)", "inv_sqrtf(n_embd_head - hp.n_rot), il)",
             SEEDREF),
    Mutation("seedref_dsv41_window_not_widened", "load_hparams_dsv4",
             "        n_swa += 1\n", "        n_swa += 0\n", SEEDREF),
    Mutation("seedref_ml4_window_not_widened", "load_hparams_mistral_large4",
             "hp.set_swa_uniform(n_swa + 1)", "hp.set_swa_uniform(n_swa)", SEEDREF),
    # --- drafting drivers ---
    Mutation("drafter_p_min_inclusive", "DFlashDrafter.read_draft",
             "if probs[0] < F32(p.p_min):", "if probs[0] <= F32(p.p_min):", ("tests/speculative/test_drafters.py",)),
    Mutation("drafter_n_min_off_by_one", "DFlashDrafter.read_draft",
             "break\n            dp.result.append(int(ids[0]))\n        if len(dp.result) < p.n_min:",
             "break\n            dp.result.append(int(ids[0]))\n        if len(dp.result) <= p.n_min:",
             ("tests/speculative/test_drafters.py",)),
    Mutation("drafter_n_max_not_clamped", "DFlashDrafter.init",
             "p.n_max = min(p.n_max, n_draft_max)", "p.n_max = p.n_max", ("tests/speculative/test_drafters.py",)),
    # --- graph-diff and xdiff: the yardsticks ---
    Mutation("diff_ignores_nan_positions", "graphgen/compare/values.py:compare_values",
             "bad = (nan_a != nan_b) | (inf_a != inf_b) | (inf_a & inf_b & (np.signbit(a) != np.signbit(b)))",
             "bad = (inf_a != inf_b) | (inf_a & inf_b & (np.signbit(a) != np.signbit(b)))", DIFF),
    Mutation("diff_f32_threshold_loose", "graphgen/compare/values.py",
             'DEFAULT_NMSE = {"f32": 1e-7, "f16": 1e-7, "bf16": 1e-7, "i32": 0, "i64": 0}',
             'DEFAULT_NMSE = {"f32": 1e-1, "f16": 1e-7, "bf16": 1e-7, "i32": 0, "i64": 0}', DIFF),
    Mutation("rule_forgives_everything", "diff_dumps",
             "fields = rule.unexplained(_compare_run(i0, i1, j0, j1, rsrc, osrc, pair_map), R[i], O[j])",
             "fields = {}", DIFF),
    Mutation("dump_max_data_zero", "run_scenario",
             "rec = NodeRecorder(G.op_desc, G.type_name, max_data, G.read_tensor_bytes) if out is not None else None",
             "rec = NodeRecorder(G.op_desc, G.type_name, 0, G.read_tensor_bytes) if out is not None else None",
             PARITY + ("tests/compare/test_yardstick.py",)),
    Mutation("xdiff_value_check_disabled", "compare_dirs",
             "bad = (reason is not None) or nmse > thr", "bad = reason is not None",
             ("tests/runtime/test_backends.py",)),
    # --- weights used in place from the mapped GGUF, --no-mmap, the bindings' bytecode ---
    Mutation("mmap_weights_copied_on_cpu", "Model.upload",
             "in_place = self.use_mmap and host", "in_place = False", ("tests/runtime/test_mmapfile.py",)),
    Mutation("mmap_tensor_at_data_section_offset", "Model._map_buffer",
             "if G.ggml_backend_tensor_alloc(buf, gt, m.addr + int(t.data_offset)) != 0:",
             "if G.ggml_backend_tensor_alloc(buf, gt, m.addr + int(t.data_offset) - int(self._reader.data_offset)) != 0:",
             ("tests/runtime/test_mmapfile.py",)),
    Mutation("mmap_mtime_change_ignored", "MappedFile.changed",
             "if st.st_mtime_ns != self.stamp[1]:", "if False:", ("tests/runtime/test_mmapfile.py",)),
    Mutation("fa_auto_resolved_off", "resolve_fa", 'return value != "off"', 'return value == "on"',
             ("tests/runtime/test_fa_auto.py",)),
    Mutation("budget_refuses_the_graph_at_it", "Session._compute", "if n_nodes > self.max_nodes:",
             "if n_nodes >= self.max_nodes:", ("tests/runtime/test_graph_budget.py::test_graph_exactly_at_the_budget_is_built",)),
    Mutation("mmap_only_a_later_mtime_seen", "MappedFile.changed",
             "if st.st_mtime_ns != self.stamp[1]:", "if st.st_mtime_ns > self.stamp[1]:",
             ("tests/runtime/test_mmapfile.py::test_same_size_rewrite_with_only_the_mtime_moved_is_refused",)),
    Mutation("mmap_size_change_ignored", "MappedFile.changed",
             "if st.st_size != self.stamp[0]:", "if False:", ("tests/runtime/test_mmapfile.py",)),
    Mutation("mmap_not_checked_before_compute", "Session._start",
             "self.model.check_file()", "pass", ("tests/runtime/test_mmapfile.py",)),
    Mutation("mmap_metadata_change_ignored", "Model.upload",
             "if self._map.stamp != self._stamp:", "if False:", ("tests/runtime/test_mmapfile.py",)),
    Mutation("mmap_never_unmapped", "MappedFile.close",
             "_libc().munmap(self.addr, self.size)", "pass", ("tests/runtime/test_mmapfile.py",)),
    Mutation("mmap_kept_after_device_upload", "Model.upload",
             "int(t.n_bytes))\n                    self._map.close()", "int(t.n_bytes))", ("tests/runtime/test_mmapfile.py",)),
    Mutation("no_mmap_flag_ignored", "add_mmap_flag.run",
             'if not getattr(args, "no_mmap", False):', "if True:", ("tests/runtime/test_mmapfile.py",)),
    Mutation("no_mmap_left_set_after_command", "no_mmap",
             "os.environ.pop(ENV_NO_MMAP, None)", "pass", ("tests/runtime/test_mmapfile.py",)),
    Mutation("no_mmap_not_passed_to_llama_cpp", "llama_model_params",
             "params.load_mode = 0", "pass", ("tests/runtime/test_mmapfile.py",)),
    Mutation("reader_string_index_on_its_length", "_bounded_reader_class.BoundedReader._get_field_parts",
             "idxs.append(len(parts) + 1)", "idxs.append(len(parts))", ("tests/runtime/test_mmapfile.py",)),
    Mutation("reader_number_parts_shifted", "_bounded_reader_class.BoundedReader._get_field_parts",
             "list(range(2, 2 + n))", "list(range(1, 1 + n))", ("tests/runtime/test_mmapfile.py",)),
    Mutation("memory_shared_pages_counted_twice", "tools/memory.py:run_measured.sample",
             'pss += st["Pss"]', 'pss += st["VmRSS"]', ("tests/tools/test_memory.py",)),
    Mutation("memory_grandchildren_missed", "tools/memory.py:run_measured.sample",
             "for p in _tree(proc.pid):", "for p in [proc.pid]:", ("tests/tools/test_memory.py",)),
    Mutation("memory_failed_run_measured", "tools/memory.py:run_measured",
             "if proc.returncode != 0:", "if False:", ("tests/tools/test_memory.py",)),
    Mutation("bindings_compiled_at_each_import", "activate",
             '_compile_bindings(root / "ggml")', "pass", ("tests/ops/test_bindings_bytecode.py",)),
    # --- the HTML viewer (its script is matched as a whole file) ---
    Mutation("viewer_opened_layer_not_fitted", "graphgen/view/static/viewer.js:",
             "if (!wasOpen) zoomToGroup(g); else render();",
             "if (!wasOpen) centreOn(0, g.y + g.h / 2); else render();", VIEWER),
    Mutation("viewer_search_keeps_small_zoom", "graphgen/view/static/viewer.js:",
             "if (s < READ_S) s = READ_S;", "if (s < 0.6) s = 0.9;", VIEWER),
    Mutation("viewer_label_name_whatever_the_room", "graphgen/view/static/viewer.js:",
             "if (name) { var fs = size(name); if (fs * s >= LABEL_MIN_PX) return [name, fs]; }",
             "if (name) return [name, size(name)];", VIEWER),
    Mutation("viewer_label_height_unbounded", "graphgen/view/static/viewer.js:",
             "tall = Math.min(LABEL_MAX, (NODE_H * s - 1.2) / (1.2 * s));", "tall = LABEL_MAX;", VIEWER),
    Mutation("viewer_legend_op_colours_on_a_diff", "graphgen/view/static/viewer.js:",
             "var cols = diff ? D.statusColours : D.opColours;", "var cols = D.opColours;", VIEWER),
    Mutation("viewer_worst_coord_reversed", "graphgen/view/static/viewer.js:",
             "'<span class=\"w-coord\">[' + w.coord.join",
             "'<span class=\"w-coord\">[' + w.coord.slice().reverse().join", VIEWER),
    Mutation("viewer_changed_fields_dropped", "diff_map",
             'row.status, row.detail, row.fields = "changed", changed[i].describe(), dict(changed[i].fields)',
             'row.status, row.detail, row.fields = "changed", changed[i].describe(), {}', VIEWER),
    Mutation("viewer_op_params_not_decoded", "_side_text",
             'return format_op_params(op, list(value), list(ne)) or "(none)"', "return str(list(value))", VIEWER),
    Mutation("viewer_worst_not_kept", "diff_map",
             'row.worst = nr.to_dict().get("worst")', "row.worst = None", VIEWER),
    Mutation("viewer_uncompared_shown_identical", "diff_map",
             'elif i in uncompared and row.status == "matched":', 'elif False:', VIEWER),
    Mutation("viewer_first_value_is_first_divergence", "diff_map",
             "dm.first_value = _row_of(dm, res.first_value)", "dm.first_value = _row_of(dm, res.first_divergence)",
             VIEWER),
    Mutation("viewer_backend_from_source_ignored", "graphgen/view/html.py:_backend",
             'return imported.get(str(i)) or src.get("backend")', "return imported.get(str(i))", VIEWER),
    # --- imports: printed values, GGML_SCHED_DEBUG's unseen views, build lines ---
    Mutation("printed_tolerance_tenfold", "_half_unit",
             "return 0.5 * 10.0 ** -(len(t) - t.index(\".\") - 1)", "return 5 * 10.0 ** -(len(t) - t.index(\".\") - 1)",
             IMPORT_VALUES),
    Mutation("printed_positions_rows_and_planes_swapped", "printed_positions",
             "((i3 * ne2 + i2) * ne1 + i1) * ne0 + i0", "((i3 * ne1 + i1) * ne2 + i2) * ne0 + i0", IMPORT_VALUES),
    Mutation("printed_sum_not_checked", "compare_node", "s = _sum_check(ref, ours)", "s = None", IMPORT_VALUES),
    Mutation("printed_sum_one_sides_digits", "_sum_check",
             "tol = ref.printed.sum_half + ours.printed.sum_half",
             "tol = max(ref.printed.sum_half, ours.printed.sum_half)",
             ("tests/compare/test_import_values.py::test_printed_sum_against_printed_sum_at_the_tolerance",)),
    Mutation("printed_sum_no_rounding_room", "_sum_check",
             "return a, b, tol + ELEMENT_ULPS * EPS32 * max(abs(a), abs(b)) if math.isfinite(a + b) else tol",
             "return a, b, tol",
             ("tests/compare/test_import_values.py::test_printed_sum_against_printed_sum_at_the_tolerance",)),
    Mutation("printed_inf_sign_ignored", "_agree", "return a == b", "return abs(a) == abs(b)", IMPORT_VALUES),
    Mutation("sched_debug_gaps_not_recorded", "parse_sched_debug.close",
             "skipped.append([k for k in range(max(seen) + 1) if k not in shown])", "skipped.append([])",
             IMPORT_VALUES),
    Mutation("sched_debug_unseen_still_identical", "graphgen/compare/diff.py:diff_dumps",
             "and not settings_differ and not unseen", "and not settings_differ", IMPORT_VALUES),
    Mutation("sched_debug_only_view_op_unseen", "graphgen/compare/diff.py:diff_dumps",
             "for k, n in enumerate(full.nodes) if n.op in VIEW_OPS]", "for k, n in enumerate(full.nodes) if n.op == \"VIEW\"]",
             IMPORT_VALUES),
    Mutation("import_build_line_as_a_full_dump", "describe_build", "if fmt:", "if False:", IMPORT_VALUES),
    # --- check-batch: cutting a sequence's rows, NMSE, the cache views, own cache, parity; the mask's batch code ---
    Mutation("checkbatch_offset_ignored", "rows_of", "((n_tokens, n_alone, offset), (n_seq, 1, i))",
             "((n_tokens, n_alone, 0), (n_seq, 1, i))", CHECK_BATCH),
    Mutation("checkbatch_nmse_of_the_batched_side", "graphgen/checkbatch/measure.py:_nmse",
             "compare_values(alone, batched)", "compare_values(batched, alone)", CHECK_BATCH),
    Mutation("checkbatch_bits_as_allclose", "_same_bits",
             "np.array_equal(a.view(np.uint32), b.view(np.uint32))", "np.allclose(a, b)", CHECK_BATCH),
    Mutation("checkbatch_cache_state_compared", "compare_sequence",
             'if how == "whole" and nb.name.startswith(CACHE_PREFIX) and nb.op != "SET_ROWS":', "if False:",
             CHECK_BATCH),
    Mutation("checkbatch_no_output_passes", "compare_sequence", "if not any(is_out for *_, is_out in got):",
             "if False:", CHECK_BATCH),
    Mutation("checkbatch_keeps_every_graphs_values", "compare_case",
             "kept.append(g if g is first else Graph(g.nodes, {}))", "kept.append(g)", CHECK_BATCH),
    Mutation("checkbatch_own_cache_ignored", "compare_case", "res.own_outputs_identical &= same_bits", "pass",
             CHECK_BATCH),
    Mutation("checkbatch_filler_is_the_sequence", "case_scenario", "f = 1 if i == 0 else 0", "f = i", CHECK_BATCH),
    Mutation("checkbatch_parity_by_shape_only", "graphs_equal", "if x.digest != y.digest:", "if False:",
             CHECK_BATCH),
    Mutation("checkbatch_absent_output_ignored", "compare_sequence",
             "for k in sorted(outs - {ia for ia, _ in pairs}):", "for k in []:", CHECK_BATCH),
    Mutation("checkbatch_mask_of_the_first_sequence", "KVCache.kq_mask_values",
             "groups = [(s0, slice(None))] if (seq == s0).all() else",
             "groups = [(s0, slice(None))] if True else", CHECK_BATCH),
    Mutation("checkbatch_mask_sees_every_sequence", "KVCache.kq_mask_values",
             "base = self.seq_mask[s, :n_kv] & held", "base = self.seq_mask[:, :n_kv].any(axis=0) & held",
             CHECK_BATCH),
    Mutation("checkbatch_exit_0_on_a_dependence", "Report.exit_code",
             "return 1 if self.engines_differ() or any(self.dependent(e) for e in self.engines) else 0",
             "return 1 if self.engines_differ() else 0", CHECK_BATCH),
    Mutation("checkbatch_default_is_the_sweep", "graphgen/checkbatch/check.py", "DEFAULT_N_SEQ = (4,)",
             "DEFAULT_N_SEQ = (1, 2, 4, 8, 16)", CHECK_BATCH),
    Mutation("checkbatch_reports_ggml_auto_names", "node_label", "if not is_auto_name(node.name):", "if True:",
             CHECK_BATCH),
    Mutation("checkbatch_ubatch_from_the_cells", "settings_for", "else max(64, longest)", "else max(64, cells)",
             CHECK_BATCH),
    Mutation("checkbatch_progress_throttled_by_stage", "Task.update", "not self.every_step and", "",
             CHECK_BATCH),
    # --- one word for one thing: bench's --engine, the diff's statuses, devices' free memory ---
    Mutation("bench_engines_alias_silent", "_Deprecated.__call__",
             'print(f"graphgen: {option_string} is deprecated: use --engine (the same comma list)", file=sys.stderr)',
             "pass", ("tests/test_bench.py::test_engine_flag_as_every_command_spells_it",)),
    Mutation("view_deleted_called_missing", "diff_map",
             'rows.append(Row(i, None, "deleted",', 'rows.append(Row(i, None, "missing",',
             ("tests/view/test_names.py",)),
    Mutation("view_summary_missing_extra", "graphgen/view/html.py",
             "f\"{s.get('deleted')} deleted, {s.get('inserted')} inserted, \"",
             "f\"{s.get('deleted')} missing, {s.get('inserted')} extra, \"", ("tests/view/test_names.py",)),
    Mutation("devices_cpu_free_is_the_total", "devices", 'if dev.kind == "cpu":', "if False:",
             ("tests/compare/test_debugging.py::test_devices_cpu_free_memory_is_what_is_available",)),
    Mutation("host_available_reads_memfree", "host_available", 'if line.startswith("MemAvailable:"):',
             'if line.startswith("MemFree:"):', ("tests/compare/test_debugging.py::test_host_available_reads_memavailable",)),
    Mutation("checkbatch_progress_only_on_a_terminal", "Task.__init__",
             'if every_step and self.mode == "auto":', "if False:", CHECK_BATCH),
    # --- finding where graphs part: diff --at, the strip, filters, thresholds; llama.cpp's flags ---
    Mutation("probe_coord_slowest_first", "graphgen/compare/probe.py:coord",
             "for n in list(ne) + [1] * (4 - len(ne)):", "for n in list(reversed(ne)) + [1] * (4 - len(ne)):",
             DEBUGGING),
    Mutation("probe_ours_index_read_as_refs", "find_pairs",
             "return [(back.get(target.index), target.index)] if target.index < len(O) else []",
             "return [(target.index, target.index)] if target.index < len(O) else []",
             ("tests/compare/test_debugging.py::test_at_by_index_when_the_graphs_do_not_line_up",)),
    Mutation("probe_ours_index_through_the_ref_map", "find_pairs",
             "return [(back.get(target.index), target.index)] if target.index < len(O) else []",
             "return [(pairs.get(target.index), target.index)] if target.index < len(O) else []",
             ("tests/compare/test_debugging.py::test_at_by_index_when_the_graphs_do_not_line_up",)),
    Mutation("probe_ref_index_partner_is_itself", "find_pairs",
             "return [(target.index, pairs.get(target.index))] if target.index < len(R) else []",
             "return [(target.index, target.index)] if target.index < len(R) else []",
             ("tests/compare/test_debugging.py::test_at_by_index_when_the_graphs_do_not_line_up",)),
    Mutation("probe_largest_smallest_first", "largest_errors",
             "top = nz[np.argsort(-err[nz], kind=\"stable\")[:k]]", "top = nz[np.argsort(err[nz], kind=\"stable\")[:k]]",
             DEBUGGING),
    Mutation("probe_nan_on_one_side_ignored", "largest_errors",
             "err[np.isnan(err)] = np.inf", "err[np.isnan(err)] = 0.0", DEBUGGING),
    Mutation("first_value_is_the_first_divergence", "diff_dumps",
             "first_v = event(min(v_events, key=lambda e: e[0])[1]) if v_events else None", "first_v = first",
             DEBUGGING),
    Mutation("layer_strip_keeps_the_first_error", "layer_strip",
             "if nm > 0 and (row[\"max_nmse\"] is None or nm > row[\"max_nmse\"]):",
             "if nm > 0 and row[\"max_nmse\"] is None:", DEBUGGING),
    Mutation("filter_keeps_every_value", "diff_dumps",
             "numeric = [r for r in numeric if select(R[r.ref_index]) or select(O[r.ours_index])]", "numeric = numeric",
             DEBUGGING),
    Mutation("filter_selecting_nothing_passes", "diff_paths",
             "if select is not None and select.active and results and all(r.nothing_selected or r.unpaired for r in results):",
             "if False:", DEBUGGING),
    Mutation("thresholds_type_before_op", "thresholds.threshold",
             "if op in per_op:", "if op in per_op and typ not in per_op:", DEBUGGING),
    Mutation("device_index_dropped", "backend_of", "for pat, to in _DEV:", "for pat, to in _DEV[:2]:", DEBUGGING),
    Mutation("batch_does_not_cap_ubatch", "parse_scenario",
             "sc.n_ubatch = min(sc.n_ubatch, sc.n_batch)", "sc.n_ubatch = sc.n_ubatch", DEBUGGING),
    Mutation("flag_scenario_prompt_not_chunked", "build_scenario_doc",
             "steps_out.append({\"inject\": {\"n_tokens\": min(ub, n_prompt - p0), \"pos0\": p0, \"seq\": s}})",
             "steps_out.append({\"inject\": {\"n_tokens\": n_prompt - p0, \"pos0\": p0, \"seq\": s}})", DEBUGGING),
    Mutation("bench_block_tokens_of_one_sequence", "_step_tokens",
             "sum(len(b.tokens) for b in st.blocks)", "len(st.blocks[0].tokens)", DEBUGGING),
    Mutation("fa_auto_read_as_off", "parse_scenario",
             "sc.flash_attn = fa is True or fa in (\"on\", \"auto\")", "sc.flash_attn = fa is True or fa == \"on\"",
             DEBUGGING),
    Mutation("view_replaces_any_file", "refuse_to_replace",
             "if path.exists() and not force and not ours(path):", "if False:",
             ("tests/view/test_view.py::test_view_does_not_replace_a_file_it_did_not_write",)),
    Mutation("view_several_graphs_without_index", "_cmd_view", "index = out", "index = None",
             ("tests/view/test_view.py::test_view_of_several_graphs_writes_the_page_named",)),
    Mutation("staged_files_keep_the_folders_they_made", "staged_files", "_undo_parents(made)", "pass",
             ("tests/view/test_view.py::test_staged_files_appear_together_or_not_at_all",)),
    Mutation("draft_rate_over_the_whole_round", "LoopResult.summary",
             "drafted / t_draft if t_draft > 0 else 0.0", "drafted / (t_draft + t_proc) if t_draft > 0 else 0.0",
             ("tests/speculative/test_drafters.py::test_draft_output_says_what_ran_and_what_was_simulated",)),
    Mutation("thresholds_unknown_key_accepted", "parse_thresholds", "if key not in ops:", "if False:",
             ("tests/compare/test_debugging.py::test_a_mistyped_threshold_key_is_refused_with_the_nearest",)),
    Mutation("diff_quiet_prints_the_report", "run_diff", 'elif getattr(args, "quiet", False):', "elif False:",
             ("tests/compare/test_debugging.py::test_at_prints_the_node_not_the_whole_report_and_quiet_the_verdict",)),
    Mutation("diff_at_under_the_whole_report", "run_diff", "elif args.at:", "elif False:",
             ("tests/compare/test_debugging.py::test_at_prints_the_node_not_the_whole_report_and_quiet_the_verdict",)),
    Mutation("demo_keeps_its_folder_silently", "_cmd_demo",
             'print(f"the draft, scenario and dumps are in {work} (a temporary folder, kept: remove it when "\n'
             '              "done, or give --out DIR)")', "pass",
             ("tests/cli/test_cli.py::test_demo_says_where_its_files_are",)),
    Mutation("refused_step_not_named", "naming_step",
             'e.args = (f"step {step.index} ({step.kind}): {e.args[0]}",) + e.args[1:]', "pass",
             ("tests/dump/test_format.py::test_run_scenario_names_the_refused_step",)),
    Mutation("refused_run_drops_its_graphs", "staged_dump_dir", "_keep_incomplete(tmp, out, e)", "pass",
             ("tests/dump/test_format.py::test_a_step_refused_part_way_is_named_and_its_graphs_kept_apart",)),
    Mutation("incomplete_replaces_a_users_folder", "_keep_incomplete",
             "if not (dest.is_dir() and not dest.is_symlink() and (dest / INCOMPLETE).is_file()):", "if False:",
             ("tests/dump/test_format.py::test_a_step_refused_part_way_is_named_and_its_graphs_kept_apart",)),
    Mutation("cli_abbreviations_allowed", "_Parser.__init__",
             'kw.setdefault("allow_abbrev", False)', 'kw.setdefault("allow_abbrev", True)',
             ("tests/cli/test_cli.py::test_no_subcommand_takes_an_abbreviated_flag",)),
    Mutation("cli_single_dash_prefixes_allowed", "_Parser._get_option_tuples",
             "return []", "return found", ("tests/cli/test_cli.py::test_no_subcommand_takes_an_abbreviated_flag",)),
    Mutation("cli_n_is_n_parallel", "graphgen/cli/draft.py:register",
             '"-n", "--n-predict"', '"--n-predict"',
             ("tests/cli/test_cli.py::test_n_is_n_predict_on_draft_and_refused_where_there_is_none",)),
    Mutation("rerun_scenario_not_recorded", "provenance",
             '{"digest": scenario_digest(doc), "doc": doc}', '{"digest": scenario_digest(doc)}',
             ("tests/reference/test_scenario_from.py::test_rerun_is_bit_identical",)),
    Mutation("rerun_inject_seq_not_recorded", "Scenario.to_dict",
             '{"n_tokens": s.n_tokens, "pos0": s.pos0, "seq": s.seq}', '{"n_tokens": s.n_tokens, "pos0": s.pos0}',
             ("tests/reference/test_scenario_from.py::test_rerun_is_bit_identical",)),
    Mutation("rerun_edited_scenario_accepted", "recorded_scenario",
             "digest is not None and digest != scenario_digest(d.scenario_doc)", "False",
             ("tests/reference/test_scenario_from.py::test_refusals",)),
    Mutation("rerun_doc_left_in_scenario", "_parse_doc",
             'scenario.pop("doc", None)', 'scenario.get("doc")',
             ("tests/dump/test_format.py::test_provenance_round_trip",)),
    Mutation("rerun_from_a_plain_scenario_file", "scenario_from_args",
             'if scenario_flag(args) == "--scenario-from":', "if False:",
             ("tests/reference/test_scenario_from.py::test_refusals",)),
    Mutation("reference_names_its_scenario_copy", "_cmd_dump",
             "recorded_as=args.scenario", 'recorded_as=""',
             ("tests/reference/test_scenario_from.py::test_rerun_in_llama_cpp",)),
    Mutation("refusal_before_the_first_graph_masked", "_keep_incomplete",
             "except DumpError:", "except FileNotFoundError:",
             ("tests/reference/test_scenario_from.py::test_a_refusal_before_the_first_graph_is_the_error",)),
    # --- a draft and its target (graphgen/speculative/pair.py) ---
    Mutation("pair_fc_width_from_target_depth", "check_pair",
             "d.fc_width != len(layers) * t.n_embd", "d.fc_width != t.n_layer * t.n_embd",
             ("tests/speculative/test_pair.py",)),
    Mutation("pair_last_layer_output_accepted", "layers_problem",
             "il >= n_layer", "il > n_layer", ("tests/speculative/test_pair.py",)),
    Mutation("pair_borrowed_width_unchecked", "check_pair",
             "src[0] != d.n_embd", "src[0] != src[0]", ("tests/speculative/test_pair.py",)),
    # --- the real target's verification (graphgen/speculative/verifier.py, speculate.py, reference/target.py) ---
    Mutation("verify_accepts_a_wrong_first_token", "TargetVerifier.verify",
             "if i < len(draft) and tok == draft[i] and not eog:",
             "if i < len(draft) and (tok == draft[i] or i == 0) and not eog:",
             ("tests/speculative/test_verifier.py",)),
    Mutation("verify_keeps_a_rejected_row_in_the_target", "TargetVerifier.verify",
             "self.target.seq_rm(seq, pos0 + n_acc + 1, -1)", "self.target.seq_rm(seq, pos0 + n_acc + 2, -1)",
             ("tests/speculative/test_verifier.py",)),
    Mutation("loop_drops_the_last_accepted_row_from_the_draft", "run_speculative",
             "drafter.seq_rm(seq, pos0 + n_acc + 1, -1)", "drafter.seq_rm(seq, pos0 + n_acc, -1)",
             ("tests/speculative/test_verifier.py",)),
    Mutation("sampler_top_p_keeps_one_less", "TargetSampler.sample",
             "keep = i + 1", "keep = max(1, i)", ("tests/speculative/test_verifier.py",)),
    Mutation("sampler_min_p_doubled", "TargetSampler.sample",
             "F32(math.log(MIN_P))", "F32(math.log(2 * MIN_P))", ("tests/speculative/test_verifier.py",)),
    Mutation("features_layers_swapped", "TargetContext.decode",
             "feats[:, k * self.n_embd:(k + 1) * self.n_embd]",
             "feats[:, (len(self.layers) - 1 - k) * self.n_embd:(len(self.layers) - k) * self.n_embd]",
             ("tests/reference/test_target.py::test_features_are_the_layer_inputs_layer_after_layer",)),
    Mutation("eog_not_ending_generation", "TargetVerifier.verify",
             "eog = self.is_eog(tok)", "eog = False", ("tests/speculative/test_verifier.py",)),
    # --- a draft behind a quantized target and its float copies (graphgen/accept/quantized.py) ---
    Mutation("quantized_nmse_counts_each_first_position", "graphgen/accept/quantized.py:feature_nmse",
             "[f[1:] for f in feats]), np.concatenate([r[1:] for r in ref])",
             "[f for f in feats]), np.concatenate([r for r in ref])",
             ("tests/accept/test_quantized.py::"
              "test_feature_nmse_leaves_each_sequences_first_row_out_of_the_first_figure",)),
    Mutation("quantized_features_on_the_prompts_alone", "graphgen/accept/quantized.py:measure",
             "seqs = [p + list(g) for p, g in zip(prompt_tokens, ref_run.tokens)]",
             "seqs = [list(p) for p in prompt_tokens]",
             ("tests/accept/test_quantized.py::"
              "test_the_feature_nmse_is_b11739s_on_the_f32_texts_tokens",)),
    Mutation("quantized_features_on_the_first_copys_text", "graphgen/accept/quantized.py:measure",
             "ref_run = next(iter(runs[reference].values()))",
             "ref_run = next(iter(next(iter(runs.values())).values()))",
             ("tests/accept/test_quantized.py::"
              "test_the_feature_nmse_is_b11739s_on_the_f32_texts_tokens",)),
    Mutation("quantized_sequences_share_the_cache", "graphgen/accept/quantized.py:sequence_features",
             "t.seq_rm(0, -1, -1)", "pass",
             ("tests/accept/test_quantized.py::"
              "test_the_feature_nmse_is_b11739s_on_the_f32_texts_tokens",)),
    Mutation("quantized_tau_without_the_target_token", "graphgen/accept/quantized.py:CopyRun.tau",
             "return self.first.mean_acceptance_length", "return self.first.mean_acceptance_length - 1.0",
             ("tests/accept/test_quantized.py::"
              "test_each_copy_generates_its_greedy_text_and_the_engines_agree",)),
    Mutation("quantized_text_compared_with_itself", "graphgen/accept/quantized.py:measure",
             "zip(first.tokens, ref_run.tokens)", "zip(first.tokens, first.tokens)",
             ("tests/accept/test_quantized.py::"
              "test_each_copy_generates_its_greedy_text_and_the_engines_agree",)),
    Mutation("quantized_same_text_rounds_compare_lengths", "graphgen/accept/quantized.py:same_text_rounds",
             'r["draft"] != o["draft"]', 'r["n_drafted"] != o["n_drafted"]',
             ("tests/accept/test_quantized.py::"
              "test_each_copy_generates_its_greedy_text_and_the_engines_agree",)),
    Mutation("quantized_bound_loosened", "graphgen/accept/quantized.py:QuantizedResult.problems",
             "v > max_nmse", "v > 100 * max_nmse",
             ("tests/accept/test_quantized.py::"
              "test_a_copy_with_a_layer_zeroed_is_caught",)),
    Mutation("quantized_engines_parting_unseen", "graphgen/accept/quantized.py:divergence",
             "return None if d is None else d.describe()", "return None",
             ("tests/accept/test_quantized.py::"
              "test_the_engines_parting_is_a_problem",)),
    Mutation("quantized_own_type_dequantized", "graphgen/accept/quantized.py:target_copies",
             "if t == own:", "if t == own and t in F.DEQUANT_TYPES:",
             ("tests/accept/test_quantized.py::"
              "test_the_copies_are_the_file_and_its_dequantized_weights",)),
    Mutation("quantized_draft_layers_as_authors_ids", "graphgen/accept/quantized.py:draft_layers",
             "[int(il) for il in layers]", "[int(il) - 1 for il in layers]",
             ("tests/accept/test_quantized.py::"
              "test_the_copies_are_the_file_and_its_dequantized_weights",)),
    # --- which stage parts the authors' loop from b11739's (graphgen/accept/attribute.py) ---
    Mutation("attribution_replay_drops_the_anchor_row", "graphgen/accept/authors_loop.py:draft_block",
             "use_cache=False)[:, 1:, :]", "use_cache=False)[:, :-1, :]",
             ("tests/accept/test_attribute.py::test_without_a_fault_only_the_targets_numerics_are_blamed",)),
    Mutation("attribution_authors_layers_as_ids", "graphgen/accept/authors_loop.py:read_layers",
             "[int(i) + 1 for i in draft.target_layer_ids]", "[int(i) for i in draft.target_layer_ids]",
             ("tests/accept/test_attribute.py::test_without_a_fault_only_the_targets_numerics_are_blamed",)),
    Mutation("attribution_authors_round_at_the_next_token", "graphgen/accept/authors_loop.py:_one",
             'blocks.append({"pos0": at - 1,', 'blocks.append({"pos0": at,',
             ("tests/accept/test_attribute.py::test_without_a_fault_only_the_targets_numerics_are_blamed",)),
    Mutation("attribution_draft_forward_unchecked", "graphgen/accept/attribute.py:attribute",
             'i = _lcp(dl[:n], r["draft"][:n])', "i = n",
             ("tests/accept/test_attribute.py::test_a_wrong_mask_token_is_the_draft_forward",)),
    Mutation("attribution_verification_sees_only_too_few", "graphgen/accept/attribute.py:attribute",
             "if got != n:", "if got > n:",
             ("tests/accept/test_attribute.py::test_a_verification_accepting_one_too_many_is_the_verification",)),
    Mutation("attribution_features_against_themselves", "graphgen/accept/attribute.py:attribute",
             "T = _torch_pass(target, c.layers, seq_a)", "T = _torch_pass(target, a.layers, seq_a)",
             ("tests/accept/test_attribute.py::test_a_target_layer_off_by_one_is_the_target_features",)),
    Mutation("attribution_band_without_the_features_shift", "graphgen/accept/attribute.py:mean_band",
             "return shift + 2 * sd", "return 2 * sd",
             ("tests/accept/test_attribute.py::test_the_authors_mean_is_within_the_band_of_llama_cpps",)),
    Mutation("divergence_ignores_the_accepted_count", "graphgen/accept/compare.py:first_divergence",
             'if x["n_accepted"] != y["n_accepted"]:', "if False:",
             ("tests/accept/test_compare.py",
              "tests/accept/test_attribute.py::test_a_verification_accepting_one_too_many_is_the_verification")),
    # --- training the shipped drafts (graphgen/training/) ---
    Mutation("train_block_sees_its_anchors_row", "graphgen/training/loop.py:make_batch",
             "visible[row, j, :, :a] = True", "visible[row, j, :, :a + 1] = True",
             ("tests/training/test_loop.py::test_a_batch_asks_each_block_row_for_the_token_the_authors_loop_drafts_there",
              "tests/training/test_loop.py::test_many_blocks_in_one_forward_equal_each_block_alone")),
    Mutation("train_prev_is_the_label", "graphgen/training/loop.py:make_batch",
             "prev[row, j, r] = toks[p - 1]", "prev[row, j, r] = toks[p]",
             ("tests/training/test_loop.py::test_a_batch_asks_each_block_row_for_the_token_the_authors_loop_drafts_there",)),
    Mutation("train_soft_label_one_row_late", "graphgen/training/loop.py:make_batch",
             "soft_ids[row, j, r] = corpus.top_ids[i][p - 1]", "soft_ids[row, j, r] = corpus.top_ids[i][min(p, len(toks) - 2)]",
             ("tests/training/test_loop.py::test_a_batch_asks_each_block_row_for_the_token_the_authors_loop_drafts_there",)),
    Mutation("train_row_predicts_its_anchor", "graphgen/training/loop.py:make_batch",
             "if p <= a or p >= len(toks):", "if p < a or p >= len(toks):",
             ("tests/training/test_loop.py::test_a_batch_asks_each_block_row_for_the_token_the_authors_loop_drafts_there",)),
    Mutation("train_convs_span_two_blocks", "graphgen/training/draft.py:_BlockwiseConvs.__enter__",
             "b = self.block", "b = self.block * 2",
             ("tests/training/test_loop.py::test_many_blocks_in_one_forward_equal_each_block_alone",)),
    Mutation("train_speculators_blocks_unmasked", "graphgen/training/loop.py:block_hidden",
             "attention_mask=b.visible,\n                      use_cache=False", "attention_mask=None,\n                      use_cache=False",
             ("tests/training/test_loop.py::test_many_blocks_in_one_forward_equal_each_block_alone",)),
    Mutation("train_soft_label_nan_kept", "graphgen/training/loop.py:block_loss",
             "p = torch.softmax(slog, -1).nan_to_num(0.0)", "p = torch.softmax(slog, -1)",
             ("tests/training/test_loop.py::test_a_row_whose_whole_top_lies_outside_the_draft_vocabulary_leaves_the_loss_finite",)),
    Mutation("train_vocabulary_ties_to_the_higher_id", "graphgen/training/draft.py:draft_vocabulary",
             "np.lexsort((np.arange(n_vocab), -counts))", "np.lexsort((-np.arange(n_vocab), -counts))",
             ("tests/training/test_draft.py::test_the_draft_vocabulary_is_the_most_frequent_tokens_sorted",)),
    # --- the authors' loop for DFlash2 and speculators' DSpark (authors_loop.py, speculators_loop.py) ---
    Mutation("speculators_loop_block_rows_stay_cached", "TorchDraftSession.block_multi",
             "st.cache.crop(len(st.cached))", "None",
             ("tests/accept/test_speculators_loop.py::"
              "test_every_round_is_the_drafts_markov_chain_on_the_targets_features",)),
    Mutation("speculators_loop_features_one_layer_late", "TransformersTarget.decode",
             "out.hidden_states[il] for il in self.layers", "out.hidden_states[il + 1] for il in self.layers",
             ("tests/accept/test_speculators_loop.py::"
              "test_every_round_is_the_drafts_markov_chain_on_the_targets_features",)),
    Mutation("speculators_loop_anchor_row_not_drafted", "graphgen/accept/speculators_loop.py:draft_tokens",
             "first = 0 if draft.sample_from_anchor else 1", "first = 1",
             ("tests/accept/test_speculators_loop.py::"
              "test_every_round_is_the_drafts_markov_chain_on_the_targets_features",)),
    Mutation("speculators_loop_markov_chain_from_the_mask", "TorchDraftSession.block_multi",
             "hidden, int(toks[0]))", "hidden, int(self.draft.mask_token_id))",
             ("tests/accept/test_speculators_loop.py::"
              "test_every_round_is_the_drafts_markov_chain_on_the_targets_features",)),
    Mutation("speculators_loop_verifies_one_row_late", "TransformersTarget.decode",
             "for i, row in zip(idx, logits):", "for i, row in zip(idx, np.roll(logits, -1, axis=0)):",
             ("tests/accept/test_speculators_loop.py::test_greedy_generates_what_the_target_alone_does",)),
    Mutation("speculators_loop_p_min_keeps_the_low_slot", "DSparkDrafter.read_draft",
             "conf[i, 0] < F32(p.p_min)", "conf[max(i - 1, i_beg), 0] < F32(p.p_min)",
             ("tests/accept/test_speculators_loop.py::"
              "test_p_min_ends_a_draft_before_the_first_slot_scored_below_it",)),
    Mutation("speculators_draft_markov_chain_from_the_mask", "graphgen/authors/forward.py:drafted_logits",
             "raw, int(anchor))", "raw, int(draft.mask_token_id))",
             ("tests/accept/test_speculators_loop.py::"
              "test_every_round_is_the_drafts_markov_chain_on_the_targets_features",)),
    Mutation("torch_draft_seq_rm_keeps_the_first_removed_row", "TorchDraftSession.seq_rm",
             "st.pending = [(x[[p < p0 for p in ps]], [p for p in ps if p < p0]) for x, ps in st.pending]",
             "st.pending = [(x[[p <= p0 for p in ps]], [p for p in ps if p <= p0]) for x, ps in st.pending]",
             ("tests/speculative/test_torch_draft.py",)),
    Mutation("best_ids_ties_to_the_higher_id", "graphgen/runtime/sampler.py:best_ids",
             'return cand[np.argsort(neg[cand], kind="stable")][:k]',
             'return cand[::-1][np.argsort(neg[cand[::-1]], kind="stable")][:k]',
             ("tests/runtime/test_sampler.py::test_the_best_candidates_come_best_first_ties_in_id_order",)),
    Mutation("transformers_target_cache_keeps_the_removed_tail", "TransformersTarget.seq_rm",
             "cache.crop(max(p0, 0))", "None",
             ("tests/speculative/test_transformers_target.py::test_a_tail_leaves_the_cache_and_rows_must_follow_it",)),
    # --- the one player (graphgen/play/player.py) ---
    Mutation("player_block_takes_its_own_rows_context", "block_states",
             "row = context.get((b.seq, b.pos0 - 1))", "row = context.get((b.seq, b.pos0))",
             ("tests/play/test_player.py",)),
    Mutation("player_ignores_features_drawn_beforehand", "walk",
             "inputs = features[step.index]", "inputs = scenario.features(step, engine.n_embd_inp)",
             ("tests/play/test_player.py",)),
    Mutation("lilicorr_in_the_llama_loop", "graphgen/models/lilicorr.py",
             "llama_loop=False", "llama_loop=True",
             ("tests/speculative/test_llamaloop.py::test_lilicorr_has_no_b11549_driver_to_compare_with",)),
    Mutation("speculators_loop_layers_counted_as_zlab_ids", "graphgen/accept/authors_loop.py:read_layers",
             "return [int(i) for i in draft.target_layers]", "return [int(i) + 1 for i in draft.target_layers]",
             ("tests/accept/test_attribution_speculators.py::"
              "test_without_a_fault_the_draft_forward_sampling_and_verification_agree",)),
    Mutation("authors_loop_dflash2_loaded_as_dflash", "graphgen/accept/authors_loop.py:_load",
             "authors_class(authors, variant).from_pretrained", 'authors_class(authors, "dflash").from_pretrained',
             ("tests/accept/test_authors_loop.py::"
              "test_dflash2_is_loaded_as_its_class_and_generates_what_the_target_alone_does",)),
    Mutation("authors_loop_dflash2_replay_without_the_selector", "graphgen/accept/authors_loop.py:draft_block",
             'if hasattr(draft, "propose"):', "if False:",
             ("tests/accept/test_authors_loop.py::"
              "test_dflash2_drafts_are_the_selectors_walk_and_the_replay_gives_them",)),
    Mutation("attribution_any_draft_token_a_tie", "graphgen/accept/attribute.py:attribute",
             "(ties_d if gap_l[p][k][i] <= TIE_BAND else fail_d)", "(ties_d if gap_l[p][k][i] <= 100 * TIE_BAND else fail_d)",
             ("tests/accept/test_attribution_speculators.py::test_a_markov_chain_from_the_mask_token_is_the_draft_forward",)),
    Mutation("attribution_dflash2_set_edge_ignored", "graphgen/accept/attribute.py:edge_gap",
             "pool = np.flatnonzero(unary >= unary[pool[-1]] - band)", "pool = np.flatnonzero(unary >= unary[pool[-1]])",
             ("tests/accept/test_attribution_dflash2.py",)),
    # --- the docs' blocks, the trained drafts' test, mmap and the arbiter's unit ---
    Mutation("no_mmap_stale_weights_size_only", "Model._read_into",
             "if (st.st_size, st.st_mtime_ns) != self._stamp:", "if st.st_size != self._stamp[0]:",
             ("tests/runtime/test_mmapfile.py::test_same_size_rewrite_between_metadata_and_weights_is_refused",)),
    Mutation("mmap_stale_weights_size_only", "Model.upload",
             "if self._map.stamp != self._stamp:", "if self._map.stamp[0] != self._stamp[0]:",
             ("tests/runtime/test_mmapfile.py::test_same_size_rewrite_between_metadata_and_weights_is_refused",)),
    Mutation("arbiter_unit_f32_if_either_cache_is", "_cache_of",
             'if types == {"f32"}:', 'if "f32" in types:',
             ("tests/authors/test_arbiter.py::test_the_coarser_cache_sets_the_unit",)),
    # (end of the docs / mmap / arbiter mutations)
    # --- recorded runs, shipped draft names, output paths and small command fixes ---
    Mutation("recorded_features_read_from_the_cwd", "graphgen/cli/dump.py:_cmd_dump",
             "sc.features_base = scenario_folder(args.scenario)", "pass",
             ("tests/reference/test_scenario_from.py::test_a_recorded_run_replays_from_any_folder",)),
    Mutation("recorded_features_copy_not_named", "Scenario.keep_in",
             "self.features_file, self.features_base, self._features = name, str(folder), None",
             "self._features = None",
             ("tests/reference/test_scenario_from.py::test_a_recorded_run_replays_from_any_folder",)),
    Mutation("recorded_reference_reads_the_unchanged_file", "graphgen/cli/dump.py:_cmd_dump",
             "if not args.scenario or sc.to_dict() != load_scenario(args.scenario).to_dict():",
             "if not args.scenario:",
             ("tests/reference/test_scenario_from.py::test_a_recorded_run_replays_from_any_folder[llama.cpp]",)),
    Mutation("recorded_features_named_like_a_graph", "Scenario.keep_in",
             'if _DUMP_FILE.match(name) or name.startswith("."):', 'if name.startswith("."):',
             ("tests/reference/test_scenario_from.py::test_features_named_like_a_graph_are_kept_apart",)),
    Mutation("recorded_target_left_relative", "Scenario.keep_in",
             "self.target = os.path.abspath(self.target_path)", "pass",
             ("tests/reference/test_scenario_from.py::test_a_relative_target_is_found_and_recorded_by_its_path",)),
    # shipped draft names (-md and the draft argument), diff -m -md's log and --keep, shallow targets,
    # bench's outputs
    Mutation("shipped_info_md_taken_as_a_path", "graphgen/cli/model.py:_draft_or_given",
             "return resolve_draft(value)", "return Path(value)",
             ("tests/speculative/test_targets.py::test_info_checks_a_shipped_draft_on_the_target",)),
    Mutation("shipped_info_hint_names_draft_gguf", "graphgen/cli/model.py:_cmd_info",
             "-md {draft_label(given)}", "-md {m.path.name}",
             ("tests/speculative/test_targets.py::test_info_checks_a_shipped_draft_on_the_target",)),
    Mutation("shipped_pair_lines_name_draft_gguf", "graphgen/cli/model.py:relabel_pair",
             "shown + p[len(said):] if p.startswith(said) else p", "p",
             ("tests/speculative/test_pair.py::test_the_pair_check_names_a_shipped_draft_as_given",)),
    Mutation("shipped_dump_pair_lines_name_draft_gguf", "graphgen/cli/dump.py:_record",
             "raise PairError(relabel_pair(e.problems, target, draft, label)) from None", "raise",
             ("tests/speculative/test_pair.py::test_the_pair_check_names_a_shipped_draft_as_given",)),
    Mutation("shipped_dump_md_taken_as_a_path", "graphgen/cli/dump.py:_dump_on_target",
             "draft, label = resolve_draft(args.model_draft), draft_label(args.model_draft)",
             "draft, label = Path(args.model_draft), draft_label(args.model_draft)",
             ("tests/speculative/test_targets.py::test_dump_on_the_target_by_name_and_folder",)),
    Mutation("shipped_dump_summary_names_draft_gguf", "graphgen/cli/dump.py:_dump_on_target",
             "graphs of {label} on", "graphs of {draft.name} on",
             ("tests/speculative/test_targets.py::test_dump_on_the_target_by_name_and_folder[graphgen]",)),
    Mutation("shipped_dump_argument_taken_as_a_path", "graphgen/cli/dump.py:_cmd_dump",
             "model = args.model = str(resolve_draft(model))", "model = args.model = str(model)",
             ("tests/speculative/test_targets.py::test_dump_takes_a_shipped_draft_as_its_argument",)),
    Mutation("shipped_diff_md_taken_as_a_path", "graphgen/cli/dump.py:_diff_on_target",
             "draft = resolve_draft(args.model_draft)", "draft = Path(args.model_draft)",
             ("tests/speculative/test_targets.py::test_diff_on_the_target_names_no_log_it_deletes",)),
    Mutation("diff_names_a_log_it_deletes", "graphgen/cli/dump.py:_diff_on_target",
             "stderr_log=STDERR_LOG if keep is not None else None", "stderr_log=STDERR_LOG",
             ("tests/speculative/test_targets.py::test_diff_on_the_target_names_no_log_it_deletes",)),
    Mutation("diff_keep_log_named_in_the_temporary_folder", "graphgen/cli/dump.py:_diff_on_target",
             'announce_dir=keep / "ref" if keep is not None else None', "announce_dir=None",
             ("tests/speculative/test_targets.py::test_diff_on_the_target_keeps_dumps_and_log_where_it_says",)),
    Mutation("diff_keep_files_left_out", "graphgen/cli/dump.py:_diff_on_target",
             "shutil.move(f, dest / f.name)", 'f.name.endswith(".json") and shutil.move(f, dest / f.name)',
             ("tests/speculative/test_targets.py::test_diff_on_the_target_keeps_dumps_and_log_where_it_says",)),
    Mutation("shipped_trace_argument_taken_as_a_path", "graphgen/cli/view.py:_cmd_trace",
             "model = args.model = str(resolve_draft(model_path(args)))", "model = args.model = str(model_path(args))",
             ("tests/speculative/test_targets.py::test_the_draft_argument_takes_a_folder_holding_draft_gguf",)),
    Mutation("shipped_bench_names_draft_gguf", "graphgen/cli/bench.py:_cmd_bench",
             "res.model = args.draft_label", "pass",
             ("tests/speculative/test_targets.py::test_the_draft_argument_takes_a_folder_holding_draft_gguf",)),
    Mutation("shipped_check_batch_names_draft_gguf", "graphgen/cli/checkbatch.py:_cmd_check_batch",
             "report.model = draft_label(given)", "pass",
             ("tests/speculative/test_targets.py::test_the_draft_argument_takes_a_folder_holding_draft_gguf",)),
    Mutation("shallow_target_default_layers_repeat", "graphgen/synth/model.py:_make_model",
             "len(set(target_layers)) == len(target_layers) and", "",
             ("tests/synth/test_model.py::test_a_target_too_shallow_for_the_default_layers_needs_them_given",
              "tests/speculative/test_pair.py::test_make_model_for_a_shallow_target_asks_for_its_layers")),
    Mutation("bench_output_folder_found_after_the_runs", "graphgen/staging.py:check_output",
             "if path.is_dir():", "if False:",
             ("tests/cli/test_cli.py::test_bench_refuses_its_outputs_before_the_runs",)),
    Mutation("bench_svg_replaces_any_file", "graphgen/staging.py:check_output",
             "refuse_to_replace(path, ours, what, force)", "pass",
             ("tests/cli/test_cli.py::test_bench_refuses_its_outputs_before_the_runs",)),
    # (end of the recorded-run / naming mutations)
    # --- the real-target loop's flags, validation and the greedy check ---
    Mutation("block_fits_any_micro_batch", "check_block_fits", "if n > micro:", "if n > 4 * micro:",
             ("tests/cli/test_generate.py::test_flags_that_cannot_work_are_refused_before_any_round",)),
    Mutation("real_target_block_not_checked", "run_target", "check_block_fits(drafter, args.n_batch)", "pass",
             ("tests/cli/test_generate.py::test_flags_that_cannot_work_are_refused_before_any_round",)),
    Mutation("spec_n_max_minus_one_allowed", "check_spec_flags", "if n_max is not None and n_max < 0:",
             "if n_max is not None and n_max < -1:",
             ("tests/cli/test_generate.py::test_flags_that_cannot_work_are_refused_before_any_round",)),
    Mutation("spec_p_min_unbounded_above", "check_spec_flags", "if not 0.0 <= p_min <= 1.0:",
             "if not 0.0 <= p_min:",
             ("tests/cli/test_generate.py::test_flags_that_cannot_work_are_refused_before_any_round",)),
    Mutation("simulated_flags_ignored_with_a_target", "run_target", "if getattr(args, dest, None) is not None:",
             "if False:", ("tests/cli/test_generate.py::test_flags_that_cannot_work_are_refused_before_any_round",)),
    Mutation("until_the_end_ignores_the_block", "open_pair", "n_predict = tg.n_ctx // n_seq - longest - block - 1",
             "n_predict = tg.n_ctx // n_seq - longest - 1",
             ("tests/cli/test_generate.py::test_llama_cpp_meanings_of_seed_n_and_c",)),
    Mutation("trained_context_never_warned", "open_pair", "if trained is not None and tg.n_ctx > trained:",
             "if trained is not None and tg.n_ctx > 2 * trained:",
             ("tests/cli/test_generate.py::test_llama_cpp_meanings_of_seed_n_and_c",)),
    Mutation("eval_counts_the_prefills_token", "graphgen/cli/generate.py:_summary",
             "n_eval = sum(max(len(res.tokens[q]) - res.n_prompt[q] - 1, 0) for q in res.tokens)",
             "n_eval = sum(max(len(res.tokens[q]) - res.n_prompt[q], 0) for q in res.tokens)",
             ("tests/cli/test_generate.py::test_the_summary_reports_the_fields_figures_and_every_round",)),
    Mutation("near_tie_reads_one_margin", "Parting.near_tie",
             "return self.margin_alone + self.margin_drafted <= TIE_BAND", "return self.margin_alone <= TIE_BAND",
             ("tests/speculative/test_verifier.py",)),
    Mutation("parting_indexed_with_the_prompt", "first_partings",
             "a, d = alone[seq][n_prompt[seq]:], drafted[seq][n_prompt[seq]:]", "a, d = alone[seq], drafted[seq]",
             ("tests/speculative/test_verifier.py",)),
    Mutation("a_wide_parting_exits_0", "run_target",
             "print(f\"error: drafting changed the target's greedy text beyond a near tie: {bad[0]}\", file=sys.stderr)\n        return 1",
             "print(f\"error: drafting changed the target's greedy text beyond a near tie: {bad[0]}\", file=sys.stderr)\n        return 0",
             ("tests/cli/test_generate.py::test_a_parting_from_the_target_alone_is_named_with_its_margins",)),
    # (end of the real-target flag mutations)
    # --- the drivers and the loop against llama.cpp b11549's own (both graphgen engines share them,
    # so only llama.cpp's loop sees these) ---
    Mutation("n_min_drops_a_draft_of_exactly_n_min", "DFlashDrafter.read_draft",
             "if len(dp.result) < p.n_min:", "if len(dp.result) <= p.n_min:", LOOP),
    Mutation("draft_cap_leaves_no_room_for_the_targets_token", "run_speculative",
             'cap = n_predict - st["generated"] - (0 if edges == "authors" else 1)',
             'cap = n_predict - st["generated"] - 0', LOOP),
    Mutation("draft_cut_keeps_one_token_more", "DFlashDrafter.draft",
             "del dp.result[dp.n_max:]", "del dp.result[dp.n_max + 1:]", LOOP),
    Mutation("dspark_cutoff_reads_the_next_slots_confidence", "DSparkDrafter.read_draft",
             "conf[i, 0] < F32(p.p_min)", "conf[min(i + 1, conf.shape[0] - 1), 0] < F32(p.p_min)", LOOP),
    Mutation("speculative_simple_stops_at_n_predict", "run_speculative",
             'st["generated"] > n_predict if simple else', 'st["generated"] >= n_predict if simple else', LOOP),
    Mutation("loop_compare_skips_the_target_tokens", "graphgen/speculative/llamaloop.py",
             'ROUND_KEYS = ("pos0", "id_last", "draft", "target", "n_accepted")',
             'ROUND_KEYS = ("pos0", "id_last", "draft", "n_accepted")', LOOP_UNIT),
    # --- mean acceptance length and the loop's reports ---
    Mutation("accept_mean_without_the_target_token", "EngineRun.mean_acceptance_length",
             'return 1.0 + sum(r["n_accepted"] for r in self.blocks) / n if n else 1.0',
             'return sum(r["n_accepted"] for r in self.blocks) / n if n else 1.0',
             ("tests/cli/test_accept.py::test_the_numbers_follow_from_the_rounds",)),
    # every round of accept's loops drafts a full block, so only a round planted to draft nothing
    # tells drafts from blocks (test_the_numbers_follow_from_the_rounds alone lets this survive)
    Mutation("accept_mean_over_blocks_not_drafts", "EngineRun.mean_acceptance_length",
             "n = self.drafts", "n = len(self.blocks)",
             ("tests/cli/test_accept.py::test_a_round_that_drafted_nothing_is_no_draft",)),
    Mutation("accept_drafts_count_empty_rounds", "EngineRun.drafts",
             'if r["n_drafted"] > 0', 'if r["n_drafted"] >= 0',
             ("tests/cli/test_accept.py::test_a_round_that_drafted_nothing_is_no_draft",)),
    Mutation("accept_svg_checked_after_the_run", "graphgen/cli/accept.py:_cmd_accept",
             'check_output("--svg", args.svg, is_svg, "an SVG file", args.force)', "pass",
             ("tests/cli/test_accept.py::test_svg_on_a_file_that_is_not_an_svg_is_refused_before_the_run",)),
    Mutation("accept_svg_force_ignored", "graphgen/cli/accept.py:_cmd_accept",
             'check_output("--svg", args.svg, is_svg, "an SVG file", args.force)',
             'check_output("--svg", args.svg, is_svg, "an SVG file", False)',
             ("tests/cli/test_accept.py::test_svg_force_replaces_the_file_and_one_prompt_is_singular",)),
    Mutation("accept_table_mean_without_the_target_token", "graphgen/cli/accept.py:_print",
             "{r.mean_acceptance_length:13.3f}", "{r.mean_acceptance_length - 1:13.3f}",
             ("tests/cli/test_accept.py::test_svg_force_replaces_the_file_and_one_prompt_is_singular",)),
    Mutation("accept_one_prompt_said_prompts", "graphgen/cli/accept.py:_print",
             "_plural(len(first.prompts), 'prompt')", "str(len(first.prompts)) + ' prompts'",
             ("tests/cli/test_accept.py::test_svg_force_replaces_the_file_and_one_prompt_is_singular",)),
    Mutation("accept_binary_prompt_file_read_as_text", "graphgen/cli/accept.py:_prompts",
             "read_prompt_file(args.file)", 'Path(args.file).read_text(encoding="utf-8", errors="replace")',
             ("tests/cli/test_accept.py::test_a_binary_prompt_file_is_refused_naming_it_and_the_byte",)),
    Mutation("accept_micro_batch_flag_dropped", "graphgen/accept/compare.py:_run_engine",
             "n_ubatch = flags.micro_batch", "n_ubatch = 64",
             ("tests/cli/test_accept.py::test_a_micro_batch_under_the_draft_block_is_refused_before_any_round",)),
    Mutation("accept_draft_flash_attn_always_on", "graphgen/accept/compare.py:_run_engine",
             'flash_attn=flags.flash_attn != "off"', "flash_attn=True",
             ("tests/cli/test_accept.py::test_the_context_flags_reach_both_engines_contexts",)),
    Mutation("loop_summary_mean_without_the_target_token", "LoopResult.summary",
             '"mean_acceptance_length": 1.0 + accepted / n_drafts if n_drafts else 1.0',
             '"mean_acceptance_length": accepted / n_drafts if n_drafts else 1.0',
             ("tests/speculative/test_loop.py::test_run_speculative_api",)),
    Mutation("loop_summary_drafts_count_empty_rounds", "LoopResult.summary",
             "n_drafts = sum(1 for r in self.rounds if r.draft)", "n_drafts = len(self.rounds)",
             ("tests/speculative/test_loop.py::test_a_round_that_drafted_nothing_is_no_draft",)),
    Mutation("draft_simulated_prints_accepted_per_block", "graphgen/cli/draft.py:_run",
             "{s['mean_acceptance_length']:.2f} tokens per round", "{s['mean_acceptance_length'] - 1:.2f} tokens per round",
             ("tests/speculative/test_drafters.py::test_draft_cli",)),
    Mutation("authors_mean_without_the_target_token", "graphgen/accept/authors_loop.py:mean_acceptance_length",
             "return 1.0 + sum(a for _, a in rounds) / len(rounds) if rounds else 1.0",
             "return sum(a for _, a in rounds) / len(rounds) if rounds else 1.0",
             ("tests/accept/test_authors_loop.py::test_the_shipped_draft_gets_tokens_accepted",)),
    Mutation("authors_mean_of_no_rounds_zero", "graphgen/accept/authors_loop.py:mean_acceptance_length",
             "if rounds else 1.0", "if rounds else 0.0",
             ("tests/accept/test_authors_loop.py::test_the_shipped_draft_gets_tokens_accepted",)),
    # (end of the acceptance-report mutations)
    # --- a target b11739 refuses, said with its reason; check -m beside the target's own GGUF ---
    Mutation("target_gguf_reason_keeps_the_prefix", "logged_reason",
             "return ln.split(LOAD_ERROR, 1)[1]", "return ln",
             ("tests/reference/test_protocol.py::test_the_reason_is_what_follows_error_loading_model",)),
    Mutation("target_gguf_refusal_without_the_reason", "TargetContext.__init__",
             "raise TargetFailed(log.explain(f\"{reference_label()} could not load the target {path}\"))",
             "raise TargetFailed(f\"{reference_label()} could not load the target {path}\")",
             ("tests/reference/test_target_errors.py::test_accept_names_the_missing_tensor",)),
    Mutation("target_gguf_lender_refusal_as_a_traceback", "run_child",
             "raise ReferenceFailed(str(e)) from None", "raise",
             ("tests/reference/test_target_errors.py::test_dump_beside_a_target_names_the_missing_tensor",)),
    Mutation("target_gguf_headline_ignores_the_childs_line", "error_text",
             "if reason and runner and reason in runner[0]:", "if reason and runner and runner[0] in reason:",
             ("tests/reference/test_protocol.py::test_the_childs_line_is_the_headline_when_it_carries_the_reason",)),
    Mutation("target_gguf_label_said_twice", "run_reference",
             "first = headline if headline.startswith(f\"{label} \") else f\"{label} failed ({how}): {headline}\"",
             "first = f\"{label} failed ({how}): {headline}\"",
             ("tests/reference/test_target_errors.py::test_dump_beside_a_target_names_the_missing_tensor",)),
    Mutation("target_gguf_converts_the_target_too", "_beside_gguf",
             "conv = convert(hf, work / \"draft.gguf\", target_dir=folder, force=True, warn=None)",
             "conv = convert(hf, work / \"draft.gguf\", target_dir=folder, target_gguf=work / \"target.gguf\", "
             "force=True, warn=None)",
             ("tests/authors/test_check_target_gguf.py::test_beside_the_targets_gguf_as_the_folder_form[zlab-dflash]",)),
    Mutation("target_gguf_scenario_names_a_converted_target", "graphgen/cli/authors.py:run_check",
             "doc = {**doc, \"target\": target_out.name if target_gguf is None else str(tpath)}",
             "doc = {**doc, \"target\": target_out.name}",
             ("tests/authors/test_check_target_gguf.py::test_beside_the_targets_gguf_as_the_folder_form[zlab-dflash]",)),
    Mutation("target_gguf_untied_head_read_as_the_embeddings", "read_tables",
             "out[\"head\"] = table(HEAD) if HEAD in tensors else out[\"embed\"]", "out[\"head\"] = out[\"embed\"]",
             ("tests/authors/test_check_target_gguf.py::test_beside_the_targets_gguf_as_the_folder_form[zlab-dflash]",)),
    Mutation("target_gguf_verifier_not_staged", "staged_checkpoint",
             "ver[\"name_or_path\"] = str(Path(verifier).resolve())", "pass",
             ("tests/authors/test_check_target_gguf.py::test_the_shipped_dspark_beside_the_smollm2_target",)),
    Mutation("target_gguf_pair_unchecked", "_beside_gguf",
             "problems = _pair_problems(target_gguf, work / \"draft.gguf\")", "problems = []",
             ("tests/authors/test_check_target_gguf.py::"
              "test_a_pair_problem_of_the_converted_draft_is_said_before_anything_runs",)),
    Mutation("target_gguf_width_read_at_the_config_top", "_width_problem",
             "width = (ck.config.get(\"transformer_layer_config\") or {}) if ck.authors == \"speculators\" else ck.config",
             "width = ck.config",
             ("tests/authors/test_check_target_gguf.py::test_a_draft_for_another_target_is_refused_before_it_is_converted",)),
    Mutation("target_gguf_head_rounding_ignored", "arbitrate",
             "e_h = head_rounding(x_head, head_type) if node.name in HEAD_NODES and x_head is not None else None",
             "e_h = None",
             ("tests/authors/test_check_target_gguf.py::test_the_shipped_draft_beside_the_smollm2_target",)),
    Mutation("target_gguf_head_band_without_the_rounding", "Judged.band",
             "return max(self.floor, RATIO * (self.e_authors or 0.0), RATIO * self.e_head)",
             "return max(self.floor, RATIO * (self.e_authors or 0.0))",
             ("tests/authors/test_check_target_gguf.py::test_the_heads_rounding_widens_the_band",)),
    Mutation("target_gguf_k_quants_in_blocks_of_32", "head_rounding",
             "block = 32 if t in BLOCK32 else 256", "block = 32",
             ("tests/authors/test_check_target_gguf.py::test_a_k_quant_head_rounds_blocks_of_256",)),
    Mutation("target_gguf_8_bit_step_of_255", "head_rounding",
             "step = np.abs(xb).max(axis=1, keepdims=True) / 127.0",
             "step = np.abs(xb).max(axis=1, keepdims=True) / 255.0",
             ("tests/authors/test_check_target_gguf.py::test_a_q8_0_head_rounds_blocks_of_32_to_8_bits",)),
    Mutation("target_gguf_logits_dropped_by_size", "_max_data",
             "return max(262144, rows * n_vocab)", "return 262144",
             ("tests/authors/test_check_target_gguf.py::test_the_shipped_dspark_beside_the_smollm2_target",)),
    Mutation("target_gguf_layer_inputs_refused", "_pair_problems",
             "return [p for p in problems if not (lends_only and \"publishes no layer inputs\" in p)]",
             "return problems",
             ("tests/authors/test_check_target_gguf.py::test_a_target_without_layer_inputs_still_lends_its_tables",)),
    Mutation("target_gguf_draft_refusal_without_the_reason", "ReferenceContext.__init__",
             "raise ReferenceFailed(self.log.explain(f\"{reference_label()} could not load {model}\"))",
             "raise ReferenceFailed(f\"{reference_label()} could not load {model}\")",
             ("tests/reference/test_target_errors.py::test_a_refused_draft_is_named_with_the_reason_too",)),
    # (end of the check -m and target-refusal mutations)
    # --- each node's own error (graphgen/compare/local.py) and the reducer (graphgen/reduce/) ---
    Mutation("local_write_target_slot", "graphgen/compare/local.py",
             'WRITE_TARGET = {"SET_ROWS": 2, "CPY": 1, "FILL": 0}', 'WRITE_TARGET = {"SET_ROWS": 0, "CPY": 1, "FILL": 0}', LOCAL),
    Mutation("local_inputs_from_ours", "_source",
             "vals = ref.input_values(rk) if rk is not None else (own if not ref.inputs else None)", "vals = own", LOCAL),
    Mutation("local_bf16_truncated", "graphgen/compare/local.py:_encode",
             "rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)",
             "rounded = (bits >> 16).astype(np.uint16)", LOCAL),
    Mutation("local_replay_never_checked", "graphgen/compare/local.py:_one",
             "res.replay_exact = bool(np.array_equal(own, replay, equal_nan=True))", "res.replay_exact = True", LOCAL),
    Mutation("local_ranked_smallest_first", "summarize_local",
             "key=lambda r: (-r.local.nmse, r.ref_index)", "key=lambda r: (r.local.nmse, r.ref_index)", LOCAL),
    Mutation("local_first_past_bound_latest", "summarize_local",
             "row(min(past, key=lambda r: r.ref_index))", "row(max(past, key=lambda r: r.ref_index))", LOCAL),
    Mutation("local_inputs_never_differ", "compare_inputs",
             "same = bool(np.array_equal(a, b, equal_nan=True))", "same = True", LOCAL),
    Mutation("local_other_model_accepted", "local_errors",
             "if model_sha256(model) != ours.model_sha256:", "if False:", LOCAL),
    Mutation("local_nothing_rerun_passes", "local_unmeasured",
             'if any(loc.get("rerun") for loc in locs):', "if True:", LOCAL),
    Mutation("local_sources_always_contiguous", "graphgen/compare/local.py:_strided",
             "return any(nb[k] != want[k] for k in range(4) if ne[k] > 1)", "return False", LOCAL),
    Mutation("local_second_mask_is_the_first", "Dump.input_partner",
             "rank = sum(inp.name == name for inp in other.inputs[:k])", "rank = 0", LOCAL),
    Mutation("record_quantized_blocks_dropped", "NodeRecorder.record",
             "if int(np.prod(t.ne[:4])) <= self.max_data:", "if False:", LOCAL),
    Mutation("record_copy_not_tied_to_its_node", "NodeRecorder._source_at",
             "return self._by_digest.get((name, hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()))",
             "return None", LOCAL),
    Mutation("view_own_error_dropped", "diff_map",
             "row.own = None if loc.nmse is None else _num(loc.nmse)", "row.own = None", LOCAL),
    Mutation("reduce_signature_with_detail", "graphgen/reduce/failure.py",
             'detail: str = field(default="", compare=False)', 'detail: str = field(default="")', REDUCE),
    Mutation("reduce_vocab_mask_kept", "Case._vocab",
             "b[\"tokens\"] = [v - 1 if t == old_mask or t >= v - 1 else t for t in b[\"tokens\"]]",
             "b[\"tokens\"] = [t for t in b[\"tokens\"]]", REDUCE),
    Mutation("reduce_inject_cut_not_followed", "Case._tokens",
             'b["pos0"] = max(0, b["pos0"] - cut)', 'b["pos0"] = b["pos0"]', REDUCE),
    Mutation("reduce_crash_read_as_refusal", "_side_failure",
             'if rc < 0 or rc >= 128 or "GGML_ASSERT" in text', 'if rc < 0', REDUCE),
    Mutation("reduce_repro_not_rerun", "write_repro",
             "reproduced = again.failure == res.failure", "reproduced = True", REDUCE),
    Mutation("reduce_max_tries_ignored", "reduce",
             "res.complete = res.tries < max_tries", "res.complete = True", REDUCE),
    Mutation("reduce_hf_layers_leave_swa_pattern", "Case._layers",
             'kw["swa_pattern"] = list(self.config["swa_pattern"][:v])', 'pass', REDUCE_HF),
    Mutation("reduce_hf_d2t_outside_vocab", "Case._vocab",
             'kw["d2t_vocab"] = max(1, v * 3 // 4)', 'pass', REDUCE_HF),
    Mutation("reduce_hf_gguf_defaults", "Case.settings",
             'return {**_hf_defaults(), **(self.config or {})}', 'pass', REDUCE_HF),
    Mutation("reduce_hf_unknown_field_taken", "load_case",
             "bad = sorted(k for k in config if k not in known)", "bad = []", REDUCE_HF),
    Mutation("reduce_check_layer_kept", "_check_outcome",
             'how=_LAYER.sub("-N", bad["name"])', 'how=bad["name"]', REDUCE_HF),
    Mutation("reduce_check_graph_file_name", "_graph_kind",
             'return m.group(2) if m else str(name)', 'return str(name)', REDUCE_HF),
    Mutation("reduce_check_near_ties_ignored", "_check_outcome",
             'if r[n_key] - r["equal"] - r["near_ties"] > 0:', 'if r[n_key] - r["equal"] > 0:', REDUCE_HF),
    Mutation("reduce_check_uncompared_agrees", "_check_outcome",
             'if not any(n.get("llama.cpp") is not None for n in arb.get("nodes", [])):', 'if False:', REDUCE_HF),
    Mutation("reduce_check_no_target", "target_of",
             'return f"{draft_arg}/target" if case.format == "hf" and case.config is not None else None',
             'return None', REDUCE_HF_E2E),
    Mutation("reduce_repro_verifier_staged", "graphgen/reduce/repro.py:_name_verifier",
             'name_verifier(cfg, target)', 'pass', REDUCE_HF_E2E),
    Mutation("authors_verifier_from_config", "AuthorsDraft._load_speculators",
             'cfg.speculators_config.verifier.name_or_path = str(target.resolve())', 'pass', FORWARD),
    Mutation("dump_npz_archive_left_open", "_write_npz",
             "z.fp = None  # the half-written file is thrown away: nothing may write to it any more", "pass",
             DUMP_FORMAT),
    Mutation("dump_tmp_left_behind", "_replace_atomically",
             "tmp.unlink(missing_ok=True)", "pass", DUMP_FORMAT),

]


# Faults the debugging tools are tested on: each is planted in a copy of the package (`plant`),
# run there, and the tools must name it. A builder's fault whose error at its own node stays
# under the diff's bound and grows past it downstream; a fault in a kernel's input.
FAULTS = [
    Mutation("fault_ffn_norm_eps", "graphgen/models/dflash.py:GraphBase.build_layers",
             "cur = self.build_norm(ffn_inp, layer.ffn_norm, None, il)",
             "cur = ggml_rms_norm(ctx, ffn_inp, hp.f_norm_rms_eps * (600.0 if il == 0 else 1.0))\n"
             "            self.cb(cur, 'norm', il)\n"
             "            cur = ggml_mul(ctx, cur, layer.ffn_norm)", ()),
    Mutation("fault_positions_shifted", "GraphContext.build_inp_pos.values",
             "p = np.asarray(params.ubatch.pos, dtype=np.int32)",
             "p = np.asarray(params.ubatch.pos, dtype=np.int32) + 1", ()),
]


def plant(name: str, dest: Path) -> Path:
    """A copy of the graphgen package under `dest` with the fault (or mutation) `name` applied;
    put `dest` first on PYTHONPATH to run it. Returns `dest`."""
    chosen = [m for m in FAULTS + MUTATIONS if m.name == name]
    if not chosen:
        raise ValueError(f"no fault or mutation named {name!r}")
    dest = Path(dest)
    shutil.copytree(ROOT / "graphgen", dest / "graphgen", ignore=shutil.ignore_patterns("__pycache__"))
    target, a, b = locate(dest, chosen[0])
    text = target.read_text()
    target.write_text(text[:a] + chosen[0].new + text[b:])
    return dest


def _copy_tree(dst: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / f)


def run_one(m: Mutation, tree: Path, timeout: float) -> tuple[str, float, str]:
    try:
        target, a, b = locate(tree, m)
    except ValueError as e:
        return "ERROR", 0.0, str(e)
    text = target.read_text()
    target.write_text(text[:a] + m.new + text[b:])
    env = dict(os.environ, PYTHONPATH=str(tree) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    start = time.time()
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *m.tests],
                              cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
        code, tail = proc.returncode, (proc.stdout.strip().splitlines() or [""])[-1]
    except subprocess.TimeoutExpired:
        code, tail = 1, f"timed out after {timeout:.0f} s (counted as caught: the run did not pass)"
    finally:
        target.write_text(text)
    took = time.time() - start
    if code == 1:
        return "caught", took, tail
    if code < 0:  # the tests died on a signal (an abort): loud, so caught, but worth a look
        return "caught", took, f"the test run died on signal {-code}"
    if code == 0:
        return "SURVIVED", took, tail
    return "ERROR", took, f"pytest exit {code}: {tail}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="tools/mutate.py", description="plant one-line bugs, run the tests that should catch each")
    ap.add_argument("-k", metavar="WORD", action="append",
                    help="only mutations whose name contains WORD (repeat it for several words)")
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    ap.add_argument("--check", action="store_true",
                    help="find every mutation's place and code in the tree, run no test (after a refactor)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per mutation (default 900)")
    ap.add_argument("--plant", metavar="NAME", help="write a copy of the package with the fault (or mutation) NAME "
                                                    "applied into --into DIR, and run nothing")
    ap.add_argument("--into", metavar="DIR", help="with --plant: the folder to write the copy into")
    args = ap.parse_args(argv)
    if args.plant:
        if not args.into:
            ap.error("--plant needs --into DIR")
        print(plant(args.plant, Path(args.into)))
        return 0
    chosen = [m for m in MUTATIONS if not args.k or any(w in m.name for w in args.k)]
    if not chosen:
        print(f"no mutation matches {' or '.join(args.k)}", file=sys.stderr)
        return 2
    if args.list:
        for m in chosen:
            print(f"{m.name:32s} {m.where:32s} {' '.join(m.tests)}")
        return 0
    if args.check:
        bad = 0
        for m in chosen + ([] if args.k else FAULTS):
            try:
                f, a, b = locate(ROOT, m)
            except ValueError as e:
                bad += 1
                print(f"ERROR    {m.name}: {e}")
                continue
            if f.read_text()[a:b] == m.new:
                bad += 1
                print(f"ERROR    {m.name}: the mutation changes nothing")
        n = len(chosen) + (0 if args.k else len(FAULTS))
        print(f"{n - bad}/{n} mutations and faults found their place")
        return 1 if bad else 0
    with tempfile.TemporaryDirectory(prefix="graphgen-mutate-") as tmp:
        tree = Path(tmp)
        _copy_tree(tree)
        results = []
        for i, m in enumerate(chosen, 1):
            print(f"[{i}/{len(chosen)}] {m.name} ...", file=sys.stderr, flush=True)
            verdict, took, detail = run_one(m, tree, args.timeout)
            results.append((m, verdict))
            print(f"{verdict:8s} {m.name:32s} {took:6.1f} s  {detail}", flush=True)
    caught = sum(v == "caught" for _, v in results)
    print(f"\nmutation score: {caught}/{len(results)} caught")
    for m, v in results:
        if v != "caught":
            print(f"  {v}: {m.name} ({m.where})")
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
