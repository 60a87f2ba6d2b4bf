"""Which llama.cpp node stands for which tensor of the authors' forward: the one place that says so.

Each entry names the node as llama.cpp's graph callback names it (`{il}` is the layer), the
authors' tensor it is compared with, the graph it lives in, the variants that have it, and how the
node is found on the ggml side: by its name, or (for outputs llama.cpp leaves unnamed) by rule.
`graphgen.authors.forward` records these tensors through hooks on the authors' modules; the
comparison (`graphgen.authors.compare`) reads this table, and docs/authors.md shows it.
"""

from __future__ import annotations

from dataclasses import dataclass

ALL = ("dflash", "dflash2", "dspark")


@dataclass(frozen=True)
class MapEntry:
    node: str                 # llama.cpp's name; "[...]" for an output found by `select`
    authors: str              # the authors' tensor, in their modules' names
    graph: str                # inject | block
    variants: tuple[str, ...] = ALL
    select: str = "name"      # name | last (the graph's last node) | last REPEAT | lattice path
    kind: str = "values"      # values | tokens (compared for equality)

    def names(self, n_layer: int) -> list[str]:
        return [self.node.format(il=il) for il in range(n_layer)] if "{il}" in self.node else [self.node]


TENSOR_MAP: tuple[MapEntry, ...] = (
    MapEntry("inp_g_embeddings", "hidden_norm(fc(target_hidden)), the injected rows", "inject"),
    MapEntry("Kcur_injected-{il}", "layers.{il}.self_attn: k_norm(k_proj(context)) after rope", "inject"),
    MapEntry("Vcur_injected-{il}", "layers.{il}.self_attn.v_proj(context)", "inject"),
    MapEntry("inp_noise_embd", "the target's embeddings of the block tokens", "block"),
    MapEntry("noise_norm-{il}", "layers.{il}.input_layernorm", "block"),
    MapEntry("attn_conv_in-{il}", "layers.{il}.attention_conv.prepare", "block", ("dflash2",)),
    MapEntry("Qcur-{il}", "layers.{il}.self_attn: q_norm(q_proj(x)) after rope", "block"),
    MapEntry("Kcur-{il}", "layers.{il}.self_attn: k_norm(k_proj(x)) after rope, the block rows", "block"),
    MapEntry("Vcur-{il}", "layers.{il}.self_attn.v_proj(x), the block rows", "block"),
    MapEntry("kqv_out-{il}", "input of layers.{il}.self_attn.o_proj", "block"),
    MapEntry("attn_conv_out-{il}", "layers.{il}.attention_conv.finish", "block", ("dflash2",)),
    MapEntry("ffn_inp-{il}", "input of layers.{il}.post_attention_layernorm", "block"),
    MapEntry("ffn_norm-{il}", "layers.{il}.post_attention_layernorm", "block"),
    MapEntry("ffn_conv_in-{il}", "layers.{il}.mlp_conv.prepare", "block", ("dflash2",)),
    MapEntry("ffn_out-{il}", "layers.{il}.mlp", "block"),
    MapEntry("ffn_conv_out-{il}", "layers.{il}.mlp_conv.finish", "block", ("dflash2",)),
    MapEntry("l_out-{il}", "layers.{il}", "block"),
    MapEntry("result_norm", "norm", "block"),
    MapEntry("result_output", "the output head on every row (z-lab compute_logits; speculators lm_head, "
             "a draft vocabulary scattered to target ids through d2t)", "block"),
    MapEntry("[drafted logits]", "result_output plus markov_head's bias, slot by slot, each slot's "
             "previous token the argmax of the slot before", "block", ("dspark",), select="last"),
    MapEntry("[confidences]", "sigmoid(confidence_head([hidden, markov_w1(previous token)])), per slot",
             "block", ("dspark",), select="last REPEAT"),
    MapEntry("[selector path]", "candidate_selector: the greedy path through the block's top-k candidates",
             "block", ("dflash2",), select="lattice path", kind="tokens"),
)

# what llama.cpp's graphs compute that the authors' forward has no tensor for, or that is not
# mapped: listed in reports as unmapped, never counted as compared
UNMAPPED_NOTE = ("kq / kq_soft_max (the authors run sdpa, which returns no weights), the KV-cache "
                 "writes and views, the Markov head's and selector's intermediate nodes")


def entries(variant: str, graph: str | None = None) -> list[MapEntry]:
    return [e for e in TENSOR_MAP if variant in e.variants and (graph is None or e.graph == graph)]


def markdown_table() -> str:
    """The map as docs/authors.md shows it."""
    rows = ["| llama.cpp node | authors' tensor | graph | variants |", "|---|---|---|---|"]
    for e in TENSOR_MAP:
        rows.append(f"| `{e.node}` | {e.authors} | {e.graph} | {', '.join(e.variants)} |")
    return "\n".join(rows)
