// ssmk-op-bench: each served op alone, on ggml's CPU backend and on SSMK, with the same inputs in
// one CPU buffer: the outputs' NMSE and the time per call at 1, 16 and 512 tokens per sequence.
// test-backend-ops cannot run GATED_DELTA_NET or RWKV_WKV7 on SSMK (their cases add L2_NORM nodes)
// and has no 16-token cases; this fills both gaps. Usage: ssmk-op-bench [THREADS] (GGML_BACKEND_PATH must
// load SSMK). Exits non-zero when an NMSE exceeds 1e-7, test-backend-ops' default bound.

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

struct Backends {
    ggml_backend_t cpu = nullptr;
    ggml_backend_t ssmk = nullptr;
};

ggml_backend_t init_device(const char * name, int n_threads) {
    ggml_backend_dev_t dev = ggml_backend_dev_by_name(name);
    if (dev == nullptr) {
        return nullptr;
    }
    ggml_backend_t backend = ggml_backend_dev_init(dev, nullptr);
    auto set_threads = (ggml_backend_set_n_threads_t) ggml_backend_reg_get_proc_address(
        ggml_backend_dev_backend_reg(dev), "ggml_backend_set_n_threads");
    if (set_threads != nullptr) {
        set_threads(backend, n_threads);
    }
    return backend;
}

void fill(ggml_tensor * t, float lo, float hi, std::mt19937 & rng) {
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> data(ggml_nelements(t));
    for (float & x : data) {
        x = dist(rng);
    }
    ggml_backend_tensor_set(t, data.data(), 0, ggml_nbytes(t));
}

// Rows of length ne0 scaled to unit norm, as llama.cpp hands q and k to the delta rule.
void normalize_rows(ggml_tensor * t) {
    std::vector<float> data(ggml_nelements(t));
    ggml_backend_tensor_get(t, data.data(), 0, ggml_nbytes(t));
    for (size_t r = 0; r < data.size(); r += t->ne[0]) {
        double sum = 0.0;
        for (int64_t i = 0; i < t->ne[0]; ++i) {
            sum += data[r + i] * data[r + i];
        }
        for (int64_t i = 0; i < t->ne[0]; ++i) {
            data[r + i] /= (float) std::sqrt(sum);
        }
    }
    ggml_backend_tensor_set(t, data.data(), 0, ggml_nbytes(t));
}

// Builds one op over fresh inputs (filled after allocation by `init`).
struct Case {
    std::string name;
    int64_t T, S;
    std::function<ggml_tensor *(ggml_context *)> build;
    std::function<void(ggml_context *, std::mt19937 &)> init;
};

ggml_tensor * named(ggml_tensor * t, const char * name) { return ggml_set_name(t, name); }

void init_uniform(ggml_context * ctx, std::mt19937 & rng) {
    for (ggml_tensor * t = ggml_get_first_tensor(ctx); t != nullptr; t = ggml_get_next_tensor(ctx, t)) {
        if (t->op != GGML_OP_NONE) {
            continue;
        }
        const std::string name = t->name;
        if (name == "ids") {
            std::vector<int32_t> ids(t->ne[0]);
            for (size_t i = 0; i < ids.size(); ++i) {
                ids[i] = (int32_t) (ids.size() - 1 - i);
            }
            ggml_backend_tensor_set(t, ids.data(), 0, ggml_nbytes(t));
        } else if (name == "A") {
            fill(t, -1.0f, -0.5f, rng);
        } else if (name == "g") {
            fill(t, -2.0f, -1e-4f, rng);
        } else if (name == "beta") {
            fill(t, 0.0f, 1.0f, rng);
        } else if (name == "w") {
            fill(t, 0.545f, 1.0f, rng);  // RWKV-7's decay factor exp(-0.606531 * sigmoid(x))
        } else {
            fill(t, -1.0f, 1.0f, rng);
            // q and k of the delta rule; RWKV-7's a = -kk and b = kk * iclr, kk unit rows.
            if (name == "q" || name == "k" || name == "a" || name == "b") {
                normalize_rows(t);
            }
        }
    }
}

Case ssm_conv(int64_t D, int64_t W, int64_t T, int64_t S) {
    return {"SSM_CONV D=" + std::to_string(D) + " W=" + std::to_string(W), T, S,
            [=](ggml_context * ctx) {
                return ggml_ssm_conv(ctx, named(ggml_new_tensor_3d(ctx, GGML_TYPE_F32, W - 1 + T, D, S), "sx"),
                                     named(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, W, D), "c"));
            },
            init_uniform};
}

Case ssm_scan(int64_t N, int64_t P, int64_t NH, int64_t G, int64_t T, int64_t S, bool mamba1) {
    return {std::string(mamba1 ? "SSM_SCAN Mamba-1" : "SSM_SCAN Mamba-2") + " N=" + std::to_string(N) +
                " P=" + std::to_string(P) + " NH=" + std::to_string(NH),
            T, S,
            [=](ggml_context * ctx) {
                return ggml_ssm_scan(ctx, named(ggml_new_tensor_4d(ctx, GGML_TYPE_F32, N, P, NH, S), "s"),
                                     named(ggml_new_tensor_4d(ctx, GGML_TYPE_F32, P, NH, T, S), "x"),
                                     named(ggml_new_tensor_3d(ctx, GGML_TYPE_F32, NH, T, S), "dt"),
                                     named(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, mamba1 ? N : 1, NH), "A"),
                                     named(ggml_new_tensor_4d(ctx, GGML_TYPE_F32, N, G, T, S), "B"),
                                     named(ggml_new_tensor_4d(ctx, GGML_TYPE_F32, N, G, T, S), "C"),
                                     named(ggml_new_tensor_1d(ctx, GGML_TYPE_I32, S), "ids"), 1);
            },
            init_uniform};
}

Case gdn(int64_t Hk, int64_t Hv, int64_t Sd, int64_t T, int64_t S, bool kda, int64_t K) {
    return {std::string(kda ? "GDN KDA" : "GDN") + " Hk=" + std::to_string(Hk) + " Hv=" + std::to_string(Hv) +
                " d=" + std::to_string(Sd) + (K > 1 ? " K=" + std::to_string(K) : ""),
            T, S,
            [=](ggml_context * ctx) {
                return ggml_gated_delta_net(ctx, named(ggml_new_tensor_4d(ctx, GGML_TYPE_F32, Sd, Hk, T, S), "q"),
                                            named(ggml_new_tensor_4d(ctx, GGML_TYPE_F32, Sd, Hk, T, S), "k"),
                                            named(ggml_new_tensor_4d(ctx, GGML_TYPE_F32, Sd, Hv, T, S), "v"),
                                            named(ggml_new_tensor_4d(ctx, GGML_TYPE_F32, kda ? Sd : 1, Hv, T, S), "g"),
                                            named(ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 1, Hv, T, S), "beta"),
                                            named(ggml_new_tensor_4d(ctx, GGML_TYPE_F32, Sd, Sd, Hv, S), "state"), K);
            },
            init_uniform};
}

// RWKV-7: H heads of size Sd, S sequences of T tokens.
Case rwkv_wkv7(int64_t H, int64_t Sd, int64_t T, int64_t S) {
    return {"RWKV_WKV7 H=" + std::to_string(H) + " d=" + std::to_string(Sd), T, S,
            [=](ggml_context * ctx) {
                auto rows = [&](const char * name) {
                    return named(ggml_new_tensor_3d(ctx, GGML_TYPE_F32, Sd, H, T * S), name);
                };
                return ggml_rwkv_wkv7(ctx, rows("r"), rows("w"), rows("k"), rows("v"), rows("a"), rows("b"),
                                      named(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, Sd * Sd * H, S), "state"));
            },
            init_uniform};
}

double seconds_per_call(ggml_backend_t backend, ggml_cgraph * graph) {
    using clock = std::chrono::steady_clock;
    ggml_backend_graph_compute(backend, graph);
    int reps = 0;
    const auto start = clock::now();
    double elapsed = 0.0;
    while (reps < 3 || (elapsed < 0.3 && reps < 1000)) {
        ggml_backend_graph_compute(backend, graph);
        ++reps;
        elapsed = std::chrono::duration<double>(clock::now() - start).count();
    }
    return elapsed / reps;
}

// Runs the case on both backends; returns its NMSE (SSMK vs CPU) and prints the times.
double run(const Backends & b, const Case & c, std::mt19937 & rng) {
    ggml_init_params params = {64 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true};
    ggml_context * ctx = ggml_init(params);
    ggml_tensor * out = c.build(ctx);
    ggml_cgraph * graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(graph, out);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, b.cpu);
    c.init(ctx, rng);

    std::vector<float> want(ggml_nelements(out)), got(ggml_nelements(out));
    ggml_backend_graph_compute(b.cpu, graph);
    ggml_backend_tensor_get(out, want.data(), 0, ggml_nbytes(out));
    ggml_backend_graph_compute(b.ssmk, graph);
    ggml_backend_tensor_get(out, got.data(), 0, ggml_nbytes(out));
    double err = 0.0, ref = 0.0;
    for (size_t i = 0; i < want.size(); ++i) {
        err += ((double) want[i] - got[i]) * ((double) want[i] - got[i]);
        ref += (double) want[i] * want[i];
    }
    const double nmse = ref > 0.0 ? err / ref : err;
    const double t_cpu = seconds_per_call(b.cpu, graph);
    const double t_ssmk = seconds_per_call(b.ssmk, graph);
    std::printf("| %-36s | %3lld | %4lld | %10.1f | %10.1f | %5.2fx | %.1e |\n", c.name.c_str(), (long long) c.S,
                (long long) c.T, t_cpu * 1e6, t_ssmk * 1e6, t_cpu / t_ssmk, nmse);
    std::fflush(stdout);
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return nmse;
}

}  // namespace

int main(int argc, char ** argv) {
    const int n_threads = argc > 1 ? std::atoi(argv[1]) : 1;
    ggml_backend_load_all();
    Backends b{init_device("CPU", n_threads), init_device("SSMK", n_threads)};
    if (b.cpu == nullptr || b.ssmk == nullptr) {
        std::fprintf(stderr, "ssmk-op-bench: needs the CPU and SSMK devices (set GGML_BACKEND_PATH)\n");
        return 1;
    }
    std::printf("threads: %d\n| %-36s | seq | tok  | CPU us     | SSMK us    | CPU/SSMK | NMSE |\n|---|---|---|---|---|---|---|\n",
                n_threads, "op");
    std::mt19937 rng(42);
    double worst = 0.0;
    for (int64_t T : {1, 16, 512}) {
        for (const Case & c : {ssm_conv(8192, 4, T, 1), ssm_scan(128, 64, 48, 1, T, 1, false),
                               ssm_scan(16, 1, 8192, 1, T, 1, true), gdn(16, 32, 128, T, 1, false, 1),
                               gdn(32, 32, 128, T, 1, true, 1), rwkv_wkv7(32, 64, T, 1)}) {
            worst = std::max(worst, run(b, c, rng));
        }
    }
    // Several sequences at once and snapshot rows (op param K), for correctness.
    for (const Case & c : {ssm_conv(1024, 4, 16, 4), ssm_scan(64, 32, 8, 2, 16, 4, false),
                           gdn(4, 8, 64, 16, 4, false, 3), gdn(4, 8, 64, 40, 2, true, 4), rwkv_wkv7(4, 64, 16, 4)}) {
        worst = std::max(worst, run(b, c, rng));
    }
    std::printf("worst NMSE %.2e\n", worst);
    ggml_backend_free(b.ssmk);
    ggml_backend_free(b.cpu);
    return worst <= 1e-7 ? 0 : 1;
}
