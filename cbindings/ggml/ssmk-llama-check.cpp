// ssmk-llama-check: runs a GGUF model through llama.cpp and records what ggml-ssmk must not change.
//
//   ssmk-llama-check run MODEL OUT [REQUIRED_DEVICE [no-parallel]]
//       loads every backend (GGML_BACKEND_PATH included), fails unless REQUIRED_DEVICE is among
//       them, prefills a fixed 40-token prompt in ubatches of 32 (so a prefill also continues a
//       state), then decodes 32 tokens greedily; restores the state saved after the prompt
//       (llama_state_seq_get/set_data) and fails unless 8 steps replay bit for bit; then, in a
//       fresh context, 4 sequences with prompts of 10, 20, 30 and 40 tokens in one batch
//       (ubatches then hold several sequences) and 16 greedy steps of all 4 together (skipped
//       with no-parallel). Writes each step's token and logits to OUT.
//   ssmk-llama-check compare A B MAX_NMSE
//       fails unless both runs chose the same tokens and every step's logits agree within MAX_NMSE.

#include "ggml-backend.h"
#include "llama.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int kPromptTokens = 40;
constexpr int kUbatch = 32;  // 40 = 32 + 8: the delta rule takes its chunked form (>= 24 tokens) and its recurrence
constexpr int kDecodeSteps = 32;
constexpr int kReplaySteps = 8;
constexpr int kParallelSeqs = 4;
constexpr int kParallelSteps = 16;

struct Step {
    int32_t token;
    std::vector<float> logits;
};

bool has_device(const char * name) {
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        if (std::strcmp(ggml_backend_dev_name(ggml_backend_dev_get(i)), name) == 0) {
            return true;
        }
    }
    return false;
}

int greedy(const float * logits, int n_vocab) {
    int best = 0;
    for (int i = 1; i < n_vocab; ++i) {
        if (logits[i] > logits[best]) {
            best = i;
        }
    }
    return best;
}

llama_context * new_context(llama_model * model, int n_seqs) {
    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = 128 * n_seqs;
    cparams.n_batch = kUbatch * n_seqs;
    cparams.n_ubatch = kUbatch;
    cparams.n_seq_max = n_seqs;
    cparams.n_threads = cparams.n_threads_batch = 2;
    return llama_init_from_model(model, cparams);
}

llama_token prompt_token(int seq, int i, int n_vocab) { return (i * 7 + 3 + 11 * seq) % n_vocab; }

// Sequence s has a prompt of 10 (s + 1) tokens; all prompts go in one batch, then every decode
// step feeds the 4 sequences' greedy tokens in one batch.
bool run_parallel(llama_model * model, int n_vocab, std::vector<Step> & steps) {
    llama_context * ctx = new_context(model, kParallelSeqs);
    llama_batch batch = llama_batch_init(kParallelSeqs * kPromptTokens, 0, 1);
    std::vector<int> last(kParallelSeqs), length(kParallelSeqs);
    batch.n_tokens = 0;
    for (int s = 0; s < kParallelSeqs; ++s) {
        length[s] = 10 * (s + 1);
        for (int i = 0; i < length[s]; ++i) {
            const int j = batch.n_tokens++;
            batch.token[j] = prompt_token(s, i, n_vocab);
            batch.pos[j] = i;
            batch.n_seq_id[j] = 1;
            batch.seq_id[j][0] = s;
            batch.logits[j] = i == length[s] - 1;
            last[s] = j;
        }
    }
    bool ok = llama_decode(ctx, batch) == 0;
    for (int step = 0; ok && step < kParallelSteps; ++step) {
        std::vector<llama_token> next(kParallelSeqs);
        for (int s = 0; s < kParallelSeqs; ++s) {
            const float * logits = llama_get_logits_ith(ctx, last[s]);
            next[s] = greedy(logits, n_vocab);
            steps.push_back({next[s], std::vector<float>(logits, logits + n_vocab)});
        }
        batch.n_tokens = kParallelSeqs;
        for (int s = 0; s < kParallelSeqs; ++s) {
            batch.token[s] = next[s];
            batch.pos[s] = length[s]++;
            batch.n_seq_id[s] = 1;
            batch.seq_id[s][0] = s;
            batch.logits[s] = true;
            last[s] = s;
        }
        ok = llama_decode(ctx, batch) == 0;
    }
    llama_batch_free(batch);
    llama_free(ctx);
    if (!ok) {
        std::fprintf(stderr, "ssmk-llama-check: parallel decode failed\n");
    }
    return ok;
}

// The state saved after the prompt, restored, must continue bit for bit as the first run did.
bool replay_from_saved_state(llama_context * ctx, const std::vector<uint8_t> & saved, const std::vector<Step> & steps,
                             int n_vocab) {
    llama_memory_seq_rm(llama_get_memory(ctx), 0, -1, -1);
    if (llama_state_seq_set_data(ctx, saved.data(), saved.size(), 0) != saved.size()) {
        std::fprintf(stderr, "ssmk-llama-check: state restore failed\n");
        return false;
    }
    for (int step = 0; step < kReplaySteps; ++step) {
        llama_token token = steps[step].token;
        if (llama_decode(ctx, llama_batch_get_one(&token, 1)) != 0 ||
            std::memcmp(llama_get_logits_ith(ctx, -1), steps[step + 1].logits.data(), n_vocab * sizeof(float)) != 0) {
            std::fprintf(stderr, "ssmk-llama-check: step %d after the state restore differs\n", step + 1);
            return false;
        }
    }
    return true;
}

int run(const char * model_path, const char * out_path, const char * required_device, bool parallel) {
    ggml_backend_load_all();
    if (required_device != nullptr && !has_device(required_device)) {
        std::fprintf(stderr, "ssmk-llama-check: device %s is not loaded\n", required_device);
        return 1;
    }
    llama_backend_init();
    llama_model_params mparams = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(model_path, mparams);
    if (model == nullptr) {
        std::fprintf(stderr, "ssmk-llama-check: cannot load %s\n", model_path);
        return 1;
    }
    llama_context * ctx = new_context(model, 1);
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    std::vector<Step> steps;
    std::vector<llama_token> prompt(kPromptTokens);
    for (int i = 0; i < kPromptTokens; ++i) {
        prompt[i] = prompt_token(0, i, n_vocab);
    }
    for (int pos = 0; pos < kPromptTokens; pos += kUbatch) {
        const int n = std::min(kUbatch, kPromptTokens - pos);
        if (llama_decode(ctx, llama_batch_get_one(prompt.data() + pos, n)) != 0) {
            std::fprintf(stderr, "ssmk-llama-check: prompt decode failed\n");
            return 1;
        }
    }
    std::vector<uint8_t> saved(llama_state_seq_get_size(ctx, 0));
    llama_state_seq_get_data(ctx, saved.data(), saved.size(), 0);
    for (int step = 0; step < kDecodeSteps; ++step) {
        const float * logits = llama_get_logits_ith(ctx, -1);
        llama_token token = greedy(logits, n_vocab);
        steps.push_back({token, std::vector<float>(logits, logits + n_vocab)});
        if (llama_decode(ctx, llama_batch_get_one(&token, 1)) != 0) {
            std::fprintf(stderr, "ssmk-llama-check: decode step %d failed\n", step);
            return 1;
        }
    }
    const bool restore_ok = replay_from_saved_state(ctx, saved, steps, n_vocab);
    llama_free(ctx);
    const bool parallel_ok = !parallel || run_parallel(model, n_vocab, steps);
    llama_model_free(model);
    if (!restore_ok || !parallel_ok) {
        return 1;
    }

    FILE * f = std::fopen(out_path, "wb");
    std::fwrite(&n_vocab, sizeof n_vocab, 1, f);
    for (const Step & s : steps) {
        std::fwrite(&s.token, sizeof s.token, 1, f);
        std::fwrite(s.logits.data(), sizeof(float), s.logits.size(), f);
    }
    std::fclose(f);
    return 0;
}

std::vector<Step> read_steps(const char * path) {
    std::vector<Step> steps;
    FILE * f = std::fopen(path, "rb");
    int n_vocab = 0;
    if (f == nullptr || std::fread(&n_vocab, sizeof n_vocab, 1, f) != 1) {
        std::fprintf(stderr, "ssmk-llama-check: cannot read %s\n", path);
        std::exit(1);
    }
    Step s{0, std::vector<float>(n_vocab)};
    while (std::fread(&s.token, sizeof s.token, 1, f) == 1 &&
           std::fread(s.logits.data(), sizeof(float), n_vocab, f) == (size_t) n_vocab) {
        steps.push_back(s);
    }
    std::fclose(f);
    return steps;
}

int compare(const char * a_path, const char * b_path, double max_nmse) {
    const std::vector<Step> a = read_steps(a_path), b = read_steps(b_path);
    if (a.size() != b.size() || a.empty()) {
        std::fprintf(stderr, "ssmk-llama-check: %zu vs %zu steps\n", a.size(), b.size());
        return 1;
    }
    double worst = 0.0;
    int mismatched_tokens = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        double err = 0.0, ref = 0.0;
        for (size_t j = 0; j < a[i].logits.size(); ++j) {
            const double d = (double) a[i].logits[j] - b[i].logits[j];
            err += d * d;
            ref += (double) a[i].logits[j] * a[i].logits[j];
        }
        worst = std::max(worst, ref > 0.0 ? err / ref : err);
        mismatched_tokens += a[i].token != b[i].token;
    }
    const bool ok = worst <= max_nmse && mismatched_tokens == 0;
    std::printf("%s: %zu steps, worst logits NMSE %.3e (max %.1e), %d tokens differ\n", ok ? "OK" : "FAIL", a.size(),
                worst, max_nmse, mismatched_tokens);
    return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char ** argv) {
    if (argc >= 4 && std::strcmp(argv[1], "run") == 0) {
        return run(argv[2], argv[3], argc >= 5 ? argv[4] : nullptr,
                   argc < 6 || std::strcmp(argv[5], "no-parallel") != 0);
    }
    if (argc == 5 && std::strcmp(argv[1], "compare") == 0) {
        return compare(argv[2], argv[3], std::atof(argv[4]));
    }
    std::fprintf(stderr, "usage: %s run MODEL OUT [REQUIRED_DEVICE [no-parallel]] | compare A B MAX_NMSE\n", argv[0]);
    return 2;
}
