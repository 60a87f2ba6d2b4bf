// graphgen-spec-loop: llama.cpp's speculative loop around common/speculative.cpp, with every
// round of every sequence written to stdout as one JSON line, so graphgen can compare its own
// port of the drivers and of the loop with llama.cpp's, round for round.
//
// Flags are llama.cpp's (common_params_parse, the speculative example's set, so -m, -md, -np,
// -n, -c, -b, -ub, -fa, -ctk/-ctv, -ctkd/-ctvd, --spec-draft-*, --temp, --seed, -t, -p, -f),
// plus two of graphgen's, taken out before llama.cpp parses the rest:
//   --gg-tokens FILE   the prompts as token ids, one line of space-separated ids per sequence
//                      (sequence s takes line s modulo their count); without it -p / -f is
//                      tokenized by the target for every sequence
//   --gg-edges server|simple
//                      server (default): llama-server's loop. The whole prompt is decoded, the
//                      target samples the first token, and each round drafts from it, capped at
//                      the tokens left minus one. simple: llama-speculative-simple's loop. The
//                      prompt but its last token is decoded, that token drafts the first round,
//                      and a round drafts up to the tokens left minus one.
//   --gg-kv-unified    one KV stream for all sequences (llama-server's -kvu; not a flag of the
//                      speculative example)
//   --gg-ubatch-draft N
//                      the draft context's micro-batch (llama.cpp gives it the target's -ub)
// Each sequence's rows form one contiguous run of the target batch, every row of it an output
// (logits and layer inputs), and a batch is decoded in chunks of -b, each handed to the drivers.
//
// Output lines (JSON): {"event":"prefill",...} per sequence, {"event":"round",...} per round and
// sequence, {"event":"end",...} per sequence, {"event":"timing",...} once. Exit status 0, 1 on a
// failure (the reason on stderr), 2 on a usage error.

#include "arg.h"
#include "common.h"
#include "llama.h"
#include "log.h"
#include "sampling.h"
#include "speculative.h"

#include <algorithm>
#include <chrono>
#include <clocale>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct seq_state {
    llama_tokens prompt;      // the prompt's tokens
    llama_tokens tokens;      // the tokens in the target's cache (prompt, then accepted)
    llama_tokens draft;       // this round's draft
    llama_tokens spec_prompt; // what the driver sees as the history
    llama_token  id_last = -1;
    int          n_gen   = 0; // tokens generated (sampled by the target)
    bool         done    = false;
    std::string  stop;
    common_sampler_ptr smpl;
    std::vector<int32_t> i_batch; // this round's rows in the target batch
};

double now_s() {
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
}

std::string ids_json(const llama_tokens & t, size_t from = 0, size_t to = (size_t) -1) {
    std::string s = "[";
    to = std::min(to, t.size());
    for (size_t i = from; i < to; ++i) {
        if (i > from) {
            s += ",";
        }
        s += std::to_string(t[i]);
    }
    return s + "]";
}

void emit(const std::string & line) {
    std::fputs(line.c_str(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
}

[[noreturn]] void fail(const std::string & why) {
    std::fprintf(stderr, "graphgen-spec-loop: error: %s\n", why.c_str());
    std::exit(1);
}

// decode `batch` on the target in chunks of n_batch, handing every chunk to the drivers; the
// logits of the last chunk stay readable, so one round's rows must fit one chunk
void decode_target(llama_context * ctx, common_speculative * spec, const common_batch & batch, double & t_tgt,
                   double & t_inj) {
    const int32_t n_batch = (int32_t) llama_n_batch(ctx);
    for (int32_t off = 0; off < batch.size(); off += n_batch) {
        const int32_t n = std::min(n_batch, batch.size() - off);
        common_batch chunk(ctx);
        for (int32_t i = 0; i < n; ++i) {
            const auto & t = batch.tokens[off + i];
            chunk.add(t.id, t.pos[0], t.seq_id, t.output);
        }
        double t0 = now_s();
        const int rc = llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, chunk.get());
        t_tgt += now_s() - t0;
        if (rc != 0) {
            fail("the target's decode failed (llama_process returned " + std::to_string(rc) + ")");
        }
        t0 = now_s();
        if (!common_speculative_process(spec, chunk)) {
            fail("the drivers could not process the target's batch");
        }
        t_inj += now_s() - t0;
    }
}

}  // namespace

int main(int argc, char ** argv) {
    std::setlocale(LC_NUMERIC, "C");

    // graphgen's own flags first; the rest is llama.cpp's
    std::string tokens_file;
    std::string edges = "server";
    int  ubatch_draft = 0;
    bool kv_unified   = false;
    std::vector<char *> rest = { argv[0] };
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if ((a == "--gg-tokens" || a == "--gg-edges") && i + 1 < argc) {
            (a == "--gg-tokens" ? tokens_file : edges) = argv[++i];
        } else if (a == "--gg-ubatch-draft" && i + 1 < argc) {
            ubatch_draft = std::atoi(argv[++i]);
        } else if (a == "--gg-kv-unified") {
            kv_unified = true;
        } else {
            rest.push_back(argv[i]);
        }
    }
    if (edges != "server" && edges != "simple") {
        std::fprintf(stderr, "graphgen-spec-loop: --gg-edges takes server or simple, not %s\n", edges.c_str());
        return 2;
    }

    common_params params;
    common_init();
    if (!common_params_parse((int) rest.size(), rest.data(), params, LLAMA_EXAMPLE_SPECULATIVE)) {
        return 2;
    }
    if (!params.speculative.has_dft()) {
        std::fprintf(stderr, "graphgen-spec-loop: give a draft with -md\n");
        return 2;
    }
    params.kv_unified = params.kv_unified || kv_unified;
    const int n_seq = std::max(1, params.n_parallel);
    params.n_parallel = n_seq;
    // every row of a batch is an output (graphgen's target reads each one): up to -b of them
    params.n_outputs_max = params.n_batch;
    params.n_outputs_max_per_seq = params.n_batch;

    llama_backend_init();
    llama_numa_init(params.numa);

    auto init_tgt = common_init_from_params(params);
    llama_model   * model_tgt = init_tgt->model();
    llama_context * ctx_tgt   = init_tgt->context();
    if (model_tgt == nullptr || ctx_tgt == nullptr) {
        fail("cannot load the target " + params.model.path);
    }
    const llama_vocab * vocab = llama_model_get_vocab(model_tgt);

    common_params params_dft = common_base_params_to_speculative(params);
    if (ubatch_draft > 0) {
        params_dft.n_ubatch = ubatch_draft;
    }
    auto spec_init = common_speculative_init_from_params(params_dft, model_tgt, ctx_tgt);
    params.speculative.draft.ctx_tgt = ctx_tgt;
    params.speculative.draft.ctx_dft = spec_init->context();
    llama_context * ctx_dft = params.speculative.draft.ctx_dft;
    if (ctx_dft == nullptr) {
        fail("cannot load the draft " + params.speculative.draft.mparams.path);
    }
    common_speculative * spec = common_speculative_init(params.speculative, (uint32_t) n_seq);
    if (spec == nullptr) {
        fail("common_speculative_init found no speculative implementation for the draft");
    }

    // the prompts
    std::vector<llama_tokens> prompts;
    if (!tokens_file.empty()) {
        std::ifstream in(tokens_file);
        if (!in) {
            fail("cannot read " + tokens_file);
        }
        std::string line;
        while (std::getline(in, line)) {
            std::istringstream ls(line);
            llama_tokens p;
            long long v;
            while (ls >> v) {
                p.push_back((llama_token) v);
            }
            if (!p.empty()) {
                prompts.push_back(p);
            }
        }
    } else {
        prompts.push_back(common_tokenize(ctx_tgt, params.prompt, true, true));
    }
    if (prompts.empty() || prompts[0].empty()) {
        fail("the prompt gives no tokens");
    }

    const int  n_predict = params.n_predict;
    const int  n_ctx_seq = (int) llama_n_ctx_seq(ctx_tgt);
    const bool simple    = edges == "simple";
    double t_tgt = 0, t_inj = 0, t_draft = 0, t_sample = 0, t_prefill = 0, t_total = 0;

    // more prompts than sequences: -np of them at a time, each batch from empty caches (as graphgen's
    // accept runs them); else every sequence takes the prompts in turn
    const bool chunked = prompts.size() > (size_t) n_seq;
    for (size_t c0 = 0, chunk = 0; chunk == 0 || c0 < prompts.size(); c0 += n_seq, ++chunk) {
        const int n_act = chunked ? (int) std::min(prompts.size() - c0, (size_t) n_seq) : n_seq;
        if (chunk > 0) {
            for (int s = 0; s < n_seq; ++s) {
                llama_memory_seq_rm(llama_get_memory(ctx_tgt), s, -1, -1);
                llama_memory_seq_rm(llama_get_memory(ctx_dft), s, -1, -1);
            }
        }
        std::vector<seq_state> seqs(n_act);
        for (int s = 0; s < n_act; ++s) {
            seqs[s].prompt = chunked ? prompts[c0 + s] : prompts[s % prompts.size()];
            seqs[s].smpl.reset(common_sampler_init(model_tgt, params.sampling));
        }
        const std::string chunk_json = "\"chunk\":" + std::to_string(chunk) + ",";
        const double t_start = now_s();

        // prefill: every sequence's prompt (but its last token, for speculative-simple) in one batch
        {
            common_batch batch(ctx_tgt);
            std::vector<int32_t> last(n_act, -1);
            for (int s = 0; s < n_act; ++s) {
                auto & st = seqs[s];
                const size_t n = st.prompt.size() - (simple ? 1 : 0);
                for (size_t i = 0; i < n; ++i) {
                    batch.add(st.prompt[i], (llama_pos) i, s, true);
                }
                last[s] = batch.size() - 1;
            }
            if (!simple && batch.size() > (int32_t) llama_n_batch(ctx_tgt)) {
                fail("the prompts' " + std::to_string(batch.size()) + " rows exceed the batch of " +
                     std::to_string(llama_n_batch(ctx_tgt)) + " (-b)");
            }
            if (batch.size() > 0) {
                decode_target(ctx_tgt, spec, batch, t_tgt, t_inj);
            }
            for (int s = 0; s < n_act; ++s) {
                auto & st = seqs[s];
                if (simple) {
                    st.tokens.assign(st.prompt.begin(), st.prompt.end() - 1);
                    st.id_last = st.prompt.back();
                } else {
                    const double t0 = now_s();
                    st.id_last = common_sampler_sample(st.smpl.get(), ctx_tgt, last[s]);
                    common_sampler_accept(st.smpl.get(), st.id_last, true);
                    t_sample += now_s() - t0;
                    st.tokens = st.prompt;
                    st.n_gen  = 1;
                    if (llama_vocab_is_eog(vocab, st.id_last)) {
                        st.done = true, st.stop = "eog";
                    } else if (n_predict >= 0 && st.n_gen >= n_predict) {
                        st.done = true, st.stop = "n_predict";
                    }
                }
                common_speculative_begin(spec, s, st.tokens);
                emit("{\"event\":\"prefill\"," + chunk_json + "\"seq\":" + std::to_string(s) + ",\"n_prompt\":" +
                     std::to_string(st.prompt.size()) + ",\"first\":" + std::to_string(simple ? -1 : st.id_last) + "}");
            }
        }

        t_prefill += now_s() - t_start;

        for (int round = 0;; ++round) {
            std::vector<int> active;
            for (int s = 0; s < n_act; ++s) {
                if (!seqs[s].done) {
                    active.push_back(s);
                }
            }
            if (active.empty()) {
                break;
            }
            // draft: every active sequence that has room, in one call
            std::vector<int> pos_max(n_seq, -1);
            for (int s : active) {
                auto & st = seqs[s];
                auto & dp = common_speculative_get_draft_params(spec, s);
                dp.drafting = false;
                st.draft.clear();
                int n_draft_max = n_ctx_seq - (int) st.tokens.size() - 2;
                if (n_predict >= 0) {
                    const int left = n_predict - st.n_gen;
                    // the server caps only while tokens are left; speculative-simple always
                    if (simple || left > 0) {
                        n_draft_max = std::min(n_draft_max, left - 1);
                    }
                }
                n_draft_max = std::max(n_draft_max, 0);
                pos_max[s] = llama_memory_seq_pos_max(llama_get_memory(ctx_tgt), s);
                if (n_draft_max > 0) {
                    st.spec_prompt = st.tokens;
                    dp = {
                        /* .drafting = */ true,
                        /* .n_max    = */ n_draft_max,
                        /* .pos0     = */ (llama_pos) st.tokens.size(),
                        /* .id_last  = */ st.id_last,
                        /* .prompt   = */ &st.spec_prompt,
                        /* .result   = */ &st.draft,
                        /* .result_q = */ nullptr,
                        /* .temp     = */ params.sampling.temp,
                        /* .seed     = */ params.sampling.seed,
                    };
                }
            }
            double t0 = now_s();
            common_speculative_draft(spec);
            const double t_round_draft = now_s() - t0;
            t_draft += t_round_draft;
            for (int s : active) {
                // the draft's noise block leaves the draft's cache again before verification
                llama_memory_seq_rm(llama_get_memory(ctx_dft), s, pos_max[s] + 1, -1);
            }

            // verify: [id_last, draft...] of every active sequence in one target batch
            common_batch batch(ctx_tgt);
            for (int s : active) {
                auto & st = seqs[s];
                const llama_pos p0 = (llama_pos) st.tokens.size();
                st.i_batch.clear();
                st.i_batch.push_back(batch.size());
                batch.add(st.id_last, p0, s, true);
                for (size_t i = 0; i < st.draft.size(); ++i) {
                    st.i_batch.push_back(batch.size());
                    batch.add(st.draft[i], p0 + 1 + (llama_pos) i, s, true);
                }
            }
            if (batch.size() > (int32_t) llama_n_batch(ctx_tgt)) {
                fail("a round's " + std::to_string(batch.size()) + " rows exceed the batch of " +
                     std::to_string(llama_n_batch(ctx_tgt)) + " (-b)");
            }
            const double t_tgt0 = t_tgt, t_inj0 = t_inj;
            decode_target(ctx_tgt, spec, batch, t_tgt, t_inj);

            for (int s : active) {
                auto & st = seqs[s];
                const llama_pos pos0 = (llama_pos) st.tokens.size();
                t0 = now_s();
                auto ids = common_sampler_sample_and_accept_n(st.smpl.get(), ctx_tgt, st.i_batch, st.draft);
                t_sample += now_s() - t0;
                if (ids.empty()) {
                    fail("the target accepted nothing, not even its own token");
                }
                const int n_acc = (int) ids.size() - 1;
                common_speculative_accept(spec, s, (uint16_t) n_acc);
                // the tokens this round adds: id_last, then the accepted run; the target's own token
                // is the next id_last. An end of generation or -n ends the sequence inside the run.
                st.tokens.push_back(st.id_last);
                int bonus = -1, n_kept = 0;
                for (size_t i = 0; i < ids.size(); ++i) {
                    st.n_gen++;
                    const bool last = i + 1 == ids.size();
                    if (!last) {
                        st.tokens.push_back(ids[i]);
                        n_kept++;
                    } else {
                        bonus = ids[i];
                    }
                    if (llama_vocab_is_eog(vocab, ids[i])) {
                        st.done = true, st.stop = "eog";
                    } else if (!simple && n_predict >= 0 && st.n_gen >= n_predict) {
                        // the server stops at -n inside the run: the rest of it is dropped
                        st.done = true, st.stop = "n_predict";
                    }
                    if (st.done) {
                        if (last) {
                            st.tokens.push_back(ids[i]);
                        } else {
                            bonus = -1;  // cut inside the accepted run: the target's own token is dropped
                        }
                        break;
                    }
                }
                if (simple && !st.done && n_predict >= 0 && st.n_gen > n_predict) {
                    // speculative-simple keeps the whole round and stops once past -n
                    st.done = true, st.stop = "n_predict";
                    st.tokens.push_back(bonus);
                }
                st.id_last = st.done ? -1 : bonus;
                const int bonus_out = bonus;
                emit("{\"event\":\"round\"," + chunk_json + "\"round\":" + std::to_string(round) + ",\"seq\":" + std::to_string(s) +
                     ",\"pos0\":" + std::to_string(pos0) + ",\"id_last\":" +
                     std::to_string(st.tokens[pos0]) + ",\"draft\":" + ids_json(st.draft) +
                     ",\"target\":" + ids_json(ids) + ",\"n_accepted\":" + std::to_string(n_acc) +
                     ",\"n_kept\":" + std::to_string(n_kept) + ",\"bonus\":" + std::to_string(bonus_out) +
                     ",\"t_draft\":" + std::to_string(t_round_draft) + ",\"t_target\":" +
                     std::to_string(t_tgt - t_tgt0) + ",\"t_inject\":" + std::to_string(t_inj - t_inj0) + "}");
                // the rejected rows leave both caches
                llama_memory_seq_rm(llama_get_memory(ctx_tgt), s, pos0 + 1 + n_acc, -1);
                llama_memory_seq_rm(llama_get_memory(ctx_dft), s, pos0 + 1 + n_acc, -1);
            }
        }
        t_total += now_s() - t_start;

        for (int s = 0; s < n_act; ++s) {
            auto & st = seqs[s];
            llama_tokens gen(st.tokens.begin() + (long) st.prompt.size() - (simple ? 1 : 0), st.tokens.end());
            if (simple && !gen.empty()) {
                gen.erase(gen.begin());  // the prompt's last token, which drafted the first round
            }
            std::string text;
            for (auto t : gen) {
                text += common_token_to_piece(ctx_tgt, t);
            }
            std::string esc;
            for (unsigned char c : text) {
                if (c == '"' || c == '\\') {
                    esc += '\\', esc += (char) c;
                } else if (c < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof buf, "\\u%04x", c);
                    esc += buf;
                } else {
                    esc += (char) c;
                }
            }
            emit("{\"event\":\"end\"," + chunk_json + "\"seq\":" + std::to_string(s) + ",\"stop\":\"" + st.stop + "\",\"tokens\":" +
                 ids_json(st.tokens) + ",\"generated\":" + ids_json(gen) + ",\"text\":\"" + esc + "\"}");
        }
    }

    emit("{\"event\":\"timing\",\"t_total\":" + std::to_string(t_total) + ",\"t_prefill\":" +
         std::to_string(t_prefill) + ",\"t_target\":" + std::to_string(t_tgt) +
         ",\"t_draft\":" + std::to_string(t_draft) + ",\"t_inject\":" + std::to_string(t_inj) +
         ",\"t_sample\":" + std::to_string(t_sample) + "}");

    common_speculative_free(spec);
    llama_backend_free();
    return 0;
}
