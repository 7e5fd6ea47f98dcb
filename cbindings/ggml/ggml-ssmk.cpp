// ggml-ssmk: a ggml accelerator backend that computes llama.cpp's recurrent ops with ssmk.
//
// An ACCEL device on the CPU buffer type (the pattern of ggml-blas): the scheduler hands it the
// SSM_CONV, SSM_SCAN, GATED_DELTA_NET and RWKV_WKV7 nodes its supports_op accepts and no tensor
// is copied.
// Built as libggml-ssmk.so against one pinned llama.cpp (ggml 0.25.3, llama-cpp-python 0.3.36's
// vendor/llama.cpp): it includes ggml's internal backend header and relies on the ggml_op enum,
// so it checks both at load and refuses to register on any other build.
//
// Environment: SSMK_GGML_OPS=none or a comma list of conv,scan,gdn,wkv7 (default: all) chooses the ops
// it claims, for A/B runs in an unchanged setup. SSMK_GGML_DECODES=all also claims the one-token
// steps it leaves to ggml by default (see decode_left_to_cpu). SSMK_GGML_IN_PLACE=off keeps the
// delta rules out of place (see find_cache_rows); SSMK_GGML_VERBOSE=1 prints each in-place update.
// ssmk runs on ggml's thread count on ggml's OpenMP team (see on_openmp_team); SSMK_POOL=ssmk
// (any value but openmp) keeps it on the calling thread.

#include "ggml-backend-impl.h"
#include "ggml.h"
#include "ssmk.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <initializer_list>
#include <string>
#include <vector>

namespace {

constexpr const char * kName = "SSMK";
constexpr const char * kPinnedGgmlVersion = "0.25.3";

// ---------------------------------------------------------------- which ops are switched on

struct EnabledOps {
    bool conv = true;
    bool scan = true;
    bool gdn = true;
    bool wkv7 = true;
};

EnabledOps read_enabled_ops() {
    const char * env = std::getenv("SSMK_GGML_OPS");
    EnabledOps ops;
    if (env == nullptr) {
        return ops;
    }
    ops = {false, false, false, false};
    std::string list = env;
    size_t start = 0;
    while (start <= list.size()) {
        size_t end = list.find(',', start);
        if (end == std::string::npos) {
            end = list.size();
        }
        const std::string name = list.substr(start, end - start);
        if (name == "conv") {
            ops.conv = true;
        } else if (name == "scan") {
            ops.scan = true;
        } else if (name == "gdn") {
            ops.gdn = true;
        } else if (name == "wkv7") {
            ops.wkv7 = true;
        } else if (name != "none" && !name.empty()) {
            std::fprintf(stderr, "ggml-ssmk: SSMK_GGML_OPS: unknown op '%s' ignored (known: conv, scan, gdn, wkv7, none)\n",
                         name.c_str());
        }
        start = end + 1;
    }
    return ops;
}

const EnabledOps & enabled_ops() {
    static const EnabledOps ops = read_enabled_ops();
    return ops;
}

// ---------------------------------------------------------------- ssmk tensor views

constexpr ssmk_dtype kF32 = {SSMK_DTYPE_CODE_FLOAT, 32, 1};
constexpr ssmk_dtype kI32 = {SSMK_DTYPE_CODE_INT, 32, 1};

struct Dim {
    int64_t size;
    int64_t stride;  // in elements
};

// An ssmk_tensor that owns its shape and strides (ssmk_tensor only points at them), hence pinned.
class View {
  public:
    View(const void * data, ssmk_dtype dtype, std::initializer_list<Dim> dims) {
        int i = 0;
        for (const Dim & d : dims) {
            shape_[i] = d.size;
            strides_[i] = d.stride;
            ++i;
        }
        tensor_ = {const_cast<void *>(data), {SSMK_DEVICE_CPU, 0}, i, dtype, shape_, strides_, 0};
    }
    View(const View &) = delete;
    View & operator=(const View &) = delete;

    ssmk_tensor * get() { return &tensor_; }

  private:
    int64_t shape_[4] = {};
    int64_t strides_[4] = {};
    ssmk_tensor tensor_;
};

int64_t elems(size_t nb) { return (int64_t) (nb / sizeof(float)); }

char * at(const ggml_tensor * t, size_t byte_offset) { return (char *) t->data + byte_offset; }

// True when the sequence dimension `seq_dim` follows the token dimension without a gap, so that
// all sequences can be passed as one packed run of tokens.
bool tokens_packed(const ggml_tensor * t, int seq_dim) {
    return t->ne[seq_dim] == 1 || t->nb[seq_dim] == t->ne[seq_dim - 1] * t->nb[seq_dim - 1];
}

// ---------------------------------------------------------------- backend state

// How ssmk runs next to ggml's CPU backend: on ggml's OpenMP team, with ggml's thread count,
// when the process has ggml's OpenMP runtime (ggml's default build) and SSMK_POOL does not say
// otherwise; else on the calling thread, since a second pool would fight ggml's threads, which
// keep spinning on the other cores after each CPU split. Measured (Zen 3, 2 threads, a Qwen3-Next-
// shaped Q8_0 model, pp512, best of three alternating runs): on the team 1.06x faster than
// without the backend, on the calling thread 1.0x.
bool on_openmp_team() {
    static const bool yes = [] {
        const char * pool = std::getenv("SSMK_POOL");
        if (pool != nullptr) {
            return std::strcmp(pool, "openmp") == 0;
        }
        return dlsym(RTLD_DEFAULT, "GOMP_parallel") != nullptr;
    }();
    return yes;
}

// A context of `threads` threads, on ggml's OpenMP team when on_openmp_team(): ssmk reads
// SSMK_POOL=openmp at creation, so the backend sets it for that moment when the user has not.
ssmk_context * create_context(int threads) {
    const bool set_pool = threads > 1 && on_openmp_team() && std::getenv("SSMK_POOL") == nullptr;
    if (set_pool) {
        setenv("SSMK_POOL", "openmp", 0);
    }
    ssmk_context * ctx = ssmk_context_create((uint32_t) threads);
    if (set_pool) {
        unsetenv("SSMK_POOL");
    }
    return ctx;
}

struct BackendContext {
    int n_threads = GGML_DEFAULT_N_THREADS;
    int ctx_threads = 0;
    ssmk_context * ssmk = nullptr;
    std::vector<float> conv_history;  // [S, W-1, D]: the conv window's history, channels contiguous
    std::vector<float> conv_input;    // [S, T, D]: the conv window's new tokens, channels contiguous

    ~BackendContext() { ssmk_context_destroy(ssmk); }

    const ssmk_context * context() {
        const int threads = on_openmp_team() ? n_threads : 1;
        if (ssmk == nullptr || ctx_threads != threads) {
            ssmk_context_destroy(ssmk);
            ssmk = create_context(threads);
            ctx_threads = threads;
        }
        return ssmk;
    }
};

bool check(int32_t status, const ggml_tensor * node) {
    if (status != SSMK_OK) {
        std::fprintf(stderr, "ggml-ssmk: %s (%s): %s: %s\n", ggml_op_desc(node), node->name, ssmk_status_str(status),
                     ssmk_last_error_message());
    }
    return status == SSMK_OK;
}

// ---------------------------------------------------------------- SSM_CONV

// sx {W-1+T, D, S} is the already concatenated window [history, x], time contiguous per channel;
// c {W, D}; out {D, T, S}. ssmk's decode/verify entry appends each sequence's T tokens to its
// history, read from a state pool (its update is discarded). Its fast path wants channels
// contiguous, so the window is transposed into the pool and a token buffer.
bool compute_ssm_conv(BackendContext & ctx, ggml_tensor * dst) {
    const ggml_tensor * sx = dst->src[0];
    const ggml_tensor * c = dst->src[1];
    const int64_t W = c->ne[0], D = c->ne[1], T = dst->ne[1], S = dst->ne[2];
    if (T == 0 || S == 0) {
        return true;
    }
    ctx.conv_history.resize((size_t) (S * (W - 1) * D));
    ctx.conv_input.resize((size_t) (S * T * D));
    // Transposed in tiles of 16 channels (one cache line of each output row) by 64 window steps,
    // so that every line written is written whole: channel by channel, each store touched a line
    // D floats away from the last, and the transpose cost as much as ggml's whole convolution.
    constexpr int64_t kTileChannels = 16, kTileSteps = 64;
    const int64_t steps = W - 1 + T;
    for (int64_t s = 0; s < S; ++s) {
        float * history = ctx.conv_history.data() + s * (W - 1) * D;
        float * input = ctx.conv_input.data() + s * T * D;
        for (int64_t d0 = 0; d0 < D; d0 += kTileChannels) {
            const int64_t d1 = std::min(D, d0 + kTileChannels);
            for (int64_t p0 = 0; p0 < steps; p0 += kTileSteps) {
                const int64_t p1 = std::min(steps, p0 + kTileSteps);
                for (int64_t p = p0; p < p1; ++p) {
                    float * to = p < W - 1 ? history + p * D : input + (p - (W - 1)) * D;
                    for (int64_t d = d0; d < d1; ++d) {
                        to[d] = ((const float *) at(sx, s * sx->nb[2] + d * sx->nb[1]))[p];
                    }
                }
            }
        }
    }
    View x(ctx.conv_input.data(), kF32, {{S, T * D}, {T, D}, {D, 1}});
    View history(ctx.conv_history.data(), kF32, {{S, (W - 1) * D}, {W - 1, D}, {D, 1}});
    View weight(c->data, kF32, {{D, elems(c->nb[1])}, {W, 1}});
    View out(dst->data, kF32, {{S, elems(dst->nb[2])}, {T, elems(dst->nb[1])}, {D, 1}});
    return check(ssmk_causal_conv1d_update(ctx.context(), x.get(), history.get(), weight.get(), nullptr, nullptr, nullptr,
                                           SSMK_ACTIVATION_NONE, -1, out.get()),
                 dst);
}

bool supports_ssm_conv(const ggml_tensor * op) {
    const ggml_tensor * sx = op->src[0];
    const ggml_tensor * c = op->src[1];
    return sx->type == GGML_TYPE_F32 && c->type == GGML_TYPE_F32 && sx->nb[0] == sizeof(float) &&
           c->nb[0] == sizeof(float) && c->ne[0] >= 2 && c->ne[0] <= 8 && ggml_is_contiguous(op);
}

// ---------------------------------------------------------------- llama.cpp's state cache

// The tensor whose memory `t` views (itself when it is no view).
const ggml_tensor * storage(const ggml_tensor * t) {
    while (t->view_src != nullptr) {
        t = t->view_src;
    }
    return t;
}

// llama.cpp's recurrent cache of one layer as an ssmk state pool: `rows` rows of one state each.
// When the backend fuses a recurrent op with the copy of its new states into this cache
// (find_cache_rows), ssmk updates the sequences' rows in place: sequence s in row first + s.
struct CacheRows {
    char * base;
    int64_t rows;
    int64_t first;
};

// ---------------------------------------------------------------- sequence tables

// The op parameter K of SSM_SCAN and GATED_DELTA_NET: how many state rows per sequence they return.
int64_t snapshot_rows(const ggml_tensor * op) { return ((const int32_t *) op->op_params)[0]; }

// The tables ssmk takes for S sequences of T tokens each, every one continuing from its state, with
// the K state rows the recurrent ops return: row 0 the final state, row j the state j tokens before
// the end (rows older than the call are left alone). Sequence s keeps its state in pool slot
// first + s; its row j >= 1 is an ssmk checkpoint after T-j tokens, in slot j*S + first + s. In the
// op's output the pool is its K*S state rows (first 0); in llama.cpp's cache (CacheRows, K = 1
// rows written) it is the whole cache.
struct SequenceTables {
    std::vector<int32_t> cu_seqlens;  // [S+1]: 0, T, 2T, ...
    std::vector<int32_t> slots;       // [S]: first + s
    std::vector<int32_t> has_state;   // [S]: all true
    std::vector<int32_t> ck_offsets;  // [S, K-1]
    std::vector<int32_t> ck_slots;    // [S, K-1], -1 (no row) where the call is too short

    SequenceTables(int64_t S, int64_t T, int64_t K, int64_t first = 0)
        : cu_seqlens(S + 1), slots(S), has_state(S, 1), ck_offsets(S * (K - 1)), ck_slots(S * (K - 1)) {
        for (int64_t s = 0; s <= S; ++s) {
            cu_seqlens[s] = (int32_t) (s * T);
        }
        for (int64_t s = 0; s < S; ++s) {
            slots[s] = (int32_t) (first + s);
            for (int64_t j = 1; j < K; ++j) {
                const int64_t e = s * (K - 1) + (j - 1);
                ck_offsets[e] = (int32_t) (T - j);
                ck_slots[e] = T - j >= 1 ? (int32_t) (j * S + first + s) : -1;
            }
        }
    }
};

// The table views for sequences first .. first+count-1 (the whole batch, or one when the token
// and sequence dimensions cannot be merged into one packed run).
struct SequenceViews {
    int64_t K;
    View cu_seqlens, slots, has_state, ck_offsets, ck_slots;

    SequenceViews(const SequenceTables & t, int64_t first, int64_t count, int64_t K)
        : K(K),
          cu_seqlens(t.cu_seqlens.data(), kI32, {{count + 1, 1}}),
          slots(t.slots.data() + first, kI32, {{count, 1}}),
          has_state(t.has_state.data() + first, kI32, {{count, 1}}),
          ck_offsets(t.ck_offsets.data() + first * (K - 1), kI32, {{count, K - 1}, {K - 1, 1}}),
          ck_slots(t.ck_slots.data() + first * (K - 1), kI32, {{count, K - 1}, {K - 1, 1}}) {}

    const ssmk_tensor * offsets() { return K > 1 ? ck_offsets.get() : nullptr; }
    const ssmk_tensor * checkpoint_slots() { return K > 1 ? ck_slots.get() : nullptr; }
};

// ---------------------------------------------------------------- SSM_SCAN

// s {N, P, NH, slots} is the whole cache, read at ids; x {P, NH, T, S}; dt {NH, T, S};
// A {1, NH} (Mamba-2) or {N, NH} (Mamba-1); B, C {N, G, T, S}. dst = y {P, NH, T, S} then K state
// rows {N, P, NH, S}. softplus(dt) is part of the op; D, z and dt_bias are separate graph nodes.
bool compute_ssm_scan(BackendContext & ctx, ggml_tensor * dst) {
    const ggml_tensor * s0 = dst->src[0];
    const ggml_tensor * x = dst->src[1];
    const ggml_tensor * dt = dst->src[2];
    const ggml_tensor * A = dst->src[3];
    const ggml_tensor * B = dst->src[4];
    const ggml_tensor * C = dst->src[5];
    const int32_t * ids = (const int32_t *) dst->src[6]->data;
    const int64_t N = s0->ne[0], P = x->ne[0], NH = x->ne[1], T = x->ne[2], S = x->ne[3], G = B->ne[1];
    const int64_t K = snapshot_rows(dst);
    const size_t state_bytes = N * P * NH * sizeof(float);
    char * states = at(dst, ggml_nelements(x) * sizeof(float));

    // The op is out of place: its input rows are gathered into the output rows ssmk updates.
    for (int64_t s = 0; s < S; ++s) {
        std::memcpy(states + s * state_bytes, at(s0, ids[s] * s0->nb[3]), state_bytes);
    }
    const SequenceTables tables(S, T, K);
    const bool packed = tokens_packed(x, 3) && tokens_packed(dt, 2) && tokens_packed(B, 3) && tokens_packed(C, 3);
    const int64_t count = packed ? S : 1;
    for (int64_t first = 0; first < S; first += count) {
        const int64_t n = count * T;
        View xv(at(x, first * x->nb[3]), kF32, {{n, elems(x->nb[2])}, {NH, elems(x->nb[1])}, {P, 1}});
        View dtv(at(dt, first * dt->nb[2]), kF32, {{n, elems(dt->nb[1])}, {NH, 1}});
        View Av = A->ne[0] == 1 ? View(A->data, kF32, {{NH, elems(A->nb[1])}})
                                : View(A->data, kF32, {{NH, elems(A->nb[1])}, {N, 1}});
        View Bv(at(B, first * B->nb[3]), kF32, {{n, elems(B->nb[2])}, {G, elems(B->nb[1])}, {N, 1}});
        View Cv(at(C, first * C->nb[3]), kF32, {{n, elems(C->nb[2])}, {G, elems(C->nb[1])}, {N, 1}});
        View pool(states, kF32, {{K * S, NH * P * N}, {NH, P * N}, {P, N}, {N, 1}});
        View y(at(dst, first * T * NH * P * sizeof(float)), kF32, {{n, NH * P}, {NH, P}, {P, 1}});
        SequenceViews seqs(tables, first, count, K);
        const int32_t status = ssmk_mamba2_scan(
            ctx.context(), xv.get(), dtv.get(), Av.get(), Bv.get(), Cv.get(), nullptr, nullptr, nullptr, -INFINITY,
            INFINITY, SSMK_MAMBA2_DT_SOFTPLUS, pool.get(), seqs.cu_seqlens.get(), seqs.slots.get(),
            seqs.has_state.get(), nullptr, -1, y.get(), seqs.offsets(), seqs.checkpoint_slots());
        if (!check(status, dst)) {
            return false;
        }
    }
    return true;
}

bool supports_ssm_scan(const ggml_tensor * op) {
    for (int i = 0; i < 6; ++i) {
        if (op->src[i]->type != GGML_TYPE_F32 || op->src[i]->nb[0] != sizeof(float)) {
            return false;
        }
    }
    // ggml keeps each cache row {N, P, NH} contiguous; the builder asserts the rest.
    return op->src[6]->type == GGML_TYPE_I32 && ggml_is_contiguous(op->src[0]) && ggml_is_contiguous(op);
}

// ---------------------------------------------------------------- GATED_DELTA_NET

// q, k {S_k, Hk, T, n}; v {S_v, Hv, T, n}; g {1 or S_v, Hv, T, n} (log-decay; per key channel:
// KDA); beta {1, Hv, T, n}; state {S_v, S_v, Hv, n}, each head stored transposed ([v][k]).
// dst = attn {S_v, Hv, T, n} then K state rows. v-head h uses q/k head h % Hk (tiled GQA) and
// scale 1/sqrt(S_v). With `cache`, the states are updated in llama.cpp's cache instead (the
// output's state rows are left unwritten: only the fused copy read them).
bool compute_gated_delta_net(BackendContext & ctx, ggml_tensor * dst, const CacheRows * cache) {
    const ggml_tensor * q = dst->src[0];
    const ggml_tensor * k = dst->src[1];
    const ggml_tensor * v = dst->src[2];
    const ggml_tensor * g = dst->src[3];
    const ggml_tensor * beta = dst->src[4];
    const ggml_tensor * state = dst->src[5];
    const int64_t Sv = v->ne[0], Hv = v->ne[1], T = v->ne[2], S = v->ne[3], Hk = q->ne[1];
    const int64_t K = snapshot_rows(dst);
    const size_t attn_bytes = Sv * Hv * T * S * sizeof(float);
    const size_t state_bytes = Sv * Sv * Hv * sizeof(float);
    char * states = cache != nullptr ? cache->base : at(dst, attn_bytes);
    const int64_t pool_slots = cache != nullptr ? cache->rows : K * S;

    // Out of place, the op's input states become the output rows ssmk updates.
    if (cache == nullptr) {
        std::memcpy(states, state->data, state_bytes * S);
    }
    const SequenceTables tables = cache != nullptr ? SequenceTables(S, T, K, cache->first)
                                                   : SequenceTables(S, T, K);
    const bool packed = tokens_packed(q, 3) && tokens_packed(k, 3) && tokens_packed(v, 3);
    const int64_t count = packed ? S : 1;
    for (int64_t first = 0; first < S; first += count) {
        const int64_t n = count * T;
        View qv(at(q, first * q->nb[3]), kF32, {{n, elems(q->nb[2])}, {Hk, elems(q->nb[1])}, {Sv, 1}});
        View kv(at(k, first * k->nb[3]), kF32, {{n, elems(k->nb[2])}, {Hk, elems(k->nb[1])}, {Sv, 1}});
        View vv(at(v, first * v->nb[3]), kF32, {{n, elems(v->nb[2])}, {Hv, elems(v->nb[1])}, {Sv, 1}});
        View gv = g->ne[0] == 1 ? View(at(g, first * g->nb[3]), kF32, {{n, Hv}, {Hv, 1}})
                                : View(at(g, first * g->nb[3]), kF32, {{n, Hv * Sv}, {Hv, Sv}, {Sv, 1}});
        View betav(at(beta, first * beta->nb[3]), kF32, {{n, Hv}, {Hv, 1}});
        // [slot][hv][k][v] with k contiguous: ggml's transposed heads.
        View pool(states, kF32, {{pool_slots, Hv * Sv * Sv}, {Hv, Sv * Sv}, {Sv, 1}, {Sv, Sv}});
        View out(at(dst, first * T * Hv * Sv * sizeof(float)), kF32, {{n, Hv * Sv}, {Hv, Sv}, {Sv, 1}});
        SequenceViews seqs(tables, first, count, K);
        const int32_t status = ssmk_gated_delta_rule(
            ctx.context(), qv.get(), kv.get(), vv.get(), gv.get(), betav.get(), 1.0f / std::sqrt((float) Sv),
            pool.get(), seqs.cu_seqlens.get(), seqs.slots.get(), seqs.has_state.get(), nullptr, SSMK_GDN_GQA_TILED,
            0.0f, -1, out.get(), seqs.offsets(), seqs.checkpoint_slots());
        if (!check(status, dst)) {
            return false;
        }
    }
    return true;
}

bool supports_gated_delta_net(const ggml_tensor * op) {
    const ggml_tensor * q = op->src[0];
    const ggml_tensor * k = op->src[1];
    const ggml_tensor * v = op->src[2];
    for (int i = 0; i < 6; ++i) {
        if (op->src[i]->type != GGML_TYPE_F32) {
            return false;
        }
    }
    // ggml's kernel reads q and k with v's head size and broadcasts them over sequences when they
    // have fewer; ssmk takes neither, so those shapes stay on the CPU backend.
    return q->ne[0] == v->ne[0] && k->ne[0] == v->ne[0] && k->ne[1] == q->ne[1] && v->ne[1] % q->ne[1] == 0 &&
           q->ne[3] == v->ne[3] && k->ne[3] == v->ne[3] && ggml_is_contiguous(op);
}

// ---------------------------------------------------------------- RWKV_WKV7

// r, w, k, v, a, b {S, H, T} (w the decay factor itself); state {S*S*H, n} with each head stored
// [v][k] (k contiguous); the T tokens are n sequences of T/n tokens in order. dst = out {S*H, T}
// then the n final states. One ssmk_dplr_delta_rule call with SSMK_DPLR_W_LINEAR over the [v][k]
// view of the output states, which start as a copy of the input states (the op is out of place),
// or with `cache` over llama.cpp's cache rows, updated in place.
bool compute_rwkv_wkv7(BackendContext & ctx, ggml_tensor * dst, const CacheRows * cache) {
    const ggml_tensor * state = dst->src[6];
    const int64_t S = dst->src[2]->ne[0], H = dst->src[2]->ne[1], T = dst->src[2]->ne[2], n = state->ne[1];
    char * states = cache != nullptr ? cache->base : at(dst, S * H * T * sizeof(float));
    const int64_t pool_slots = cache != nullptr ? cache->rows : n;
    if (cache == nullptr) {
        std::memcpy(states, state->data, ggml_nbytes(state));
    }
    if (T == 0) {
        return true;
    }
    const SequenceTables tables = cache != nullptr ? SequenceTables(n, T / n, 1, cache->first)
                                                   : SequenceTables(n, T / n, 1);
    SequenceViews seqs(tables, 0, n, 1);
    auto token_rows = [&](const ggml_tensor * t) { return View(t->data, kF32, {{T, H * S}, {H, S}, {S, 1}}); };
    View r = token_rows(dst->src[0]), w = token_rows(dst->src[1]), k = token_rows(dst->src[2]),
         v = token_rows(dst->src[3]), a = token_rows(dst->src[4]), b = token_rows(dst->src[5]);
    View out(dst->data, kF32, {{T, H * S}, {H, S}, {S, 1}});
    // [slot][h][k][v] with k contiguous.
    View pool(states, kF32, {{pool_slots, H * S * S}, {H, S * S}, {S, 1}, {S, S}});
    return check(ssmk_dplr_delta_rule(ctx.context(), r.get(), w.get(), k.get(), v.get(), a.get(), b.get(), 1.0f,
                                      pool.get(), seqs.cu_seqlens.get(), seqs.slots.get(), seqs.has_state.get(),
                                      nullptr, SSMK_DPLR_W_LINEAR, -1, out.get(), nullptr, nullptr),
                 dst);
}

bool supports_rwkv_wkv7(const ggml_tensor * op) {
    for (int i = 0; i < 7; ++i) {
        if (op->src[i]->type != GGML_TYPE_F32 || !ggml_is_contiguous(op->src[i])) {
            return false;
        }
    }
    return op->src[6]->ne[1] > 0 && ggml_is_contiguous(op);
}

// ---------------------------------------------------------------- the state copy after an op

bool is_view(const ggml_tensor * node) {
    switch (node->op) {
        case GGML_OP_NONE:
        case GGML_OP_RESHAPE:
        case GGML_OP_VIEW:
        case GGML_OP_PERMUTE:
        case GGML_OP_TRANSPOSE:
            return true;
        default:
            return false;
    }
}

// llama.cpp gathers a GATED_DELTA_NET or RWKV_WKV7 layer's states from its cache with GET_ROWS
// (on the CPU backend, earlier in the graph), the op writes the new states after its output, and
// a CPY puts them back into the cache rows of the ubatch's sequences. The backend claims that CPY
// too (device_supports_op), so it runs in the op's split, right after the op; when every sequence's
// state comes from the row it goes back to (the gather's ids are first, first+1, ...: no sequence
// was copied into another's cells), ssmk updates those cache rows in place and the CPY is done:
// the state moves once, where the op alone would copy it into its output first and the CPY would
// move it again. Returns the CPY's node index, or -1 (then the op and the CPY run as they are).
int find_cache_rows(ggml_cgraph * graph, int op_index, CacheRows & cache) {
    static const bool disabled = [] {
        const char * env = std::getenv("SSMK_GGML_IN_PLACE");
        return env != nullptr && std::strcmp(env, "off") == 0;
    }();
    const ggml_tensor * op = ggml_graph_node(graph, op_index);
    const bool gdn = op->op == GGML_OP_GATED_DELTA_NET;
    if (disabled || (!gdn && op->op != GGML_OP_RWKV_WKV7)) {
        return -1;
    }
    // Sequences, bytes of one state and of the op's output.
    const ggml_tensor * v = gdn ? op->src[2] : op->src[3];
    const int64_t n_seqs = gdn ? v->ne[3] : op->src[6]->ne[1];
    // One state row per sequence: a step that also writes snapshot rows (llama.cpp's experimental
    // n_rs_seq rollback, several tokens) stays out of place, as no test here runs it.
    if (gdn && v->ne[2] > 1 && snapshot_rows(op) > 1) {
        return -1;
    }
    const size_t state_bytes = gdn ? v->ne[0] * v->ne[0] * v->ne[1] * sizeof(float) : ggml_nbytes(op->src[6]) / n_seqs;
    const size_t out_bytes = ggml_nelements(v) * sizeof(float);  // v may be a strided view

    const ggml_tensor * gather = storage(gdn ? op->src[5] : op->src[6]);
    if (gather->op != GGML_OP_GET_ROWS || gather->src[1]->type != GGML_TYPE_I32 ||
        !ggml_is_contiguous(gather->src[1]) || gather->ne[1] != n_seqs) {
        return -1;
    }
    const ggml_tensor * rows = gather->src[0];
    const ggml_tensor * base = storage(rows);
    if (base->op != GGML_OP_NONE || base->type != GGML_TYPE_F32 || !ggml_is_contiguous(base) || rows->data != base->data ||
        rows->nb[0] != sizeof(float) || rows->nb[1] != state_bytes || rows->ne[0] * sizeof(float) != state_bytes) {
        return -1;
    }

    int cpy_index = op_index + 1;
    while (cpy_index < ggml_graph_n_nodes(graph) && is_view(ggml_graph_node(graph, cpy_index))) {
        ++cpy_index;
    }
    if (cpy_index >= ggml_graph_n_nodes(graph)) {
        return -1;
    }
    const ggml_tensor * cpy = ggml_graph_node(graph, cpy_index);
    if (cpy->op != GGML_OP_CPY) {
        return -1;
    }
    const ggml_tensor * from = cpy->src[0];
    const ggml_tensor * to = cpy->src[1];
    const int64_t elems = n_seqs * (int64_t) (state_bytes / sizeof(float));
    if (storage(from) != op || (const char *) from->data != (const char *) op->data + out_bytes ||
        !ggml_is_contiguous(from) || ggml_nelements(from) != elems || storage(to) != base ||
        ggml_nelements(to) != elems || !ggml_is_contiguous(to)) {
        return -1;
    }
    const size_t offset = (const char *) to->data - (const char *) base->data;
    if (offset % state_bytes != 0) {
        return -1;
    }
    cache.base = (char *) base->data;
    cache.rows = (int64_t) (ggml_nbytes(base) / state_bytes);
    cache.first = (int64_t) (offset / state_bytes);
    if (cache.first + n_seqs > cache.rows) {
        return -1;
    }
    const int32_t * ids = (const int32_t *) gather->src[1]->data;
    for (int64_t s = 0; s < n_seqs; ++s) {
        if (ids[s] != cache.first + s) {
            return -1;
        }
    }
    static const bool verbose = std::getenv("SSMK_GGML_VERBOSE") != nullptr;
    if (verbose) {
        std::fprintf(stderr, "ggml-ssmk: %s (%s): states updated in place in %s rows %lld..%lld\n", ggml_op_desc(op),
                     op->name, base->name, (long long) cache.first, (long long) (cache.first + n_seqs - 1));
    }
    return cpy_index;
}

// An f32 CPY the backend claimed and did not fuse: src[0]'s elements in order into src[1].
bool compute_cpy(ggml_tensor * node) {
    const ggml_tensor * src = node->src[0];
    const ggml_tensor * dst = node->src[1];
    if (ggml_is_contiguous(src) && ggml_is_contiguous(dst)) {
        std::memcpy(dst->data, src->data, ggml_nbytes(src));
        return true;
    }
    int64_t d[4] = {0, 0, 0, 0};
    for (int64_t i3 = 0; i3 < src->ne[3]; ++i3) {
        for (int64_t i2 = 0; i2 < src->ne[2]; ++i2) {
            for (int64_t i1 = 0; i1 < src->ne[1]; ++i1) {
                for (int64_t i0 = 0; i0 < src->ne[0]; ++i0) {
                    const float x = *(const float *) at(src, i0 * src->nb[0] + i1 * src->nb[1] + i2 * src->nb[2] + i3 * src->nb[3]);
                    *(float *) at(dst, d[0] * dst->nb[0] + d[1] * dst->nb[1] + d[2] * dst->nb[2] + d[3] * dst->nb[3]) = x;
                    for (int k = 0; k < 3 && ++d[k] == dst->ne[k]; ++k) {
                        d[k] = 0;
                        if (k == 2) {
                            ++d[3];
                        }
                    }
                }
            }
        }
    }
    return true;
}

// ---------------------------------------------------------------- backend

const char * backend_get_name(ggml_backend_t) { return kName; }

void backend_free(ggml_backend_t backend) {
    delete (BackendContext *) backend->context;
    delete backend;
}

ggml_status backend_graph_compute(ggml_backend_t backend, ggml_cgraph * graph) {
    BackendContext & ctx = *(BackendContext *) backend->context;
    int fused_copy = -1;  // the CPY node find_cache_rows fused into the op before it
    for (int i = 0; i < ggml_graph_n_nodes(graph); ++i) {
        ggml_tensor * node = ggml_graph_node(graph, i);
        if ((node->flags & GGML_TENSOR_FLAG_COMPUTE) == 0 || is_view(node) || i == fused_copy) {
            continue;
        }
        CacheRows cache;
        const int cpy = find_cache_rows(graph, i, cache);
        const CacheRows * in_place = cpy >= 0 ? &cache : nullptr;
        fused_copy = cpy;
        bool ok = false;
        switch (node->op) {
            case GGML_OP_SSM_CONV: ok = compute_ssm_conv(ctx, node); break;
            case GGML_OP_SSM_SCAN: ok = compute_ssm_scan(ctx, node); break;
            case GGML_OP_GATED_DELTA_NET: ok = compute_gated_delta_net(ctx, node, in_place); break;
            case GGML_OP_RWKV_WKV7: ok = compute_rwkv_wkv7(ctx, node, in_place); break;
            case GGML_OP_CPY: ok = compute_cpy(node); break;
            default: GGML_ABORT("ggml-ssmk: unsupported op %s", ggml_op_desc(node));
        }
        if (!ok) {
            return GGML_STATUS_FAILED;
        }
    }
    return GGML_STATUS_SUCCESS;
}

ggml_guid_t backend_guid() {
    static ggml_guid guid = {0x73, 0x73, 0x6d, 0x6b, 0x2d, 0x67, 0x67, 0x6d, 0x6c, 0x2d, 0x62, 0x61, 0x63, 0x6b, 0x65, 0x6e};
    return &guid;
}

const ggml_backend_i backend_interface = {
    /* .get_name            = */ backend_get_name,
    /* .free                = */ backend_free,
    /* .set_tensor_async    = */ nullptr,
    /* .get_tensor_async    = */ nullptr,
    /* .set_tensor_2d_async = */ nullptr,
    /* .get_tensor_2d_async = */ nullptr,
    /* .cpy_tensor_async    = */ nullptr,
    /* .synchronize         = */ nullptr,
    /* .graph_plan_create   = */ nullptr,
    /* .graph_plan_free     = */ nullptr,
    /* .graph_plan_update   = */ nullptr,
    /* .graph_plan_compute  = */ nullptr,
    /* .graph_compute       = */ backend_graph_compute,
    /* .event_record        = */ nullptr,
    /* .event_wait          = */ nullptr,
    /* .graph_optimize      = */ nullptr,
};

// llama.cpp passes its thread count before each compute (found through get_proc_address).
void backend_set_n_threads(ggml_backend_t backend, int n_threads) {
    if (ggml_guid_matches(backend->guid, backend_guid())) {
        ((BackendContext *) backend->context)->n_threads = n_threads > 0 ? n_threads : 1;
    }
}

// ---------------------------------------------------------------- device

const char * device_get_name(ggml_backend_dev_t) { return kName; }

const char * device_get_description(ggml_backend_dev_t) { return "ssmk recurrent-layer kernels"; }

void device_get_memory(ggml_backend_dev_t, size_t * free, size_t * total) {
    *free = 0;
    *total = 0;
}

enum ggml_backend_dev_type device_get_type(ggml_backend_dev_t) { return GGML_BACKEND_DEVICE_TYPE_ACCEL; }

void device_get_props(ggml_backend_dev_t dev, ggml_backend_dev_props * props) {
    props->name = device_get_name(dev);
    props->description = device_get_description(dev);
    props->type = device_get_type(dev);
    device_get_memory(dev, &props->memory_free, &props->memory_total);
    props->caps = {
        /* .async                = */ false,
        /* .host_buffer          = */ false,
        /* .buffer_from_host_ptr = */ true,
        /* .events               = */ false,
        /* .mmap_support         = */ true,
    };
}

ggml_backend_reg_t reg();

ggml_backend_t device_init_backend(ggml_backend_dev_t dev, const char *) {
    return new ggml_backend{backend_guid(), backend_interface, dev, new BackendContext};
}

// The CPU buffer type (it lives in ggml-base): the scheduler then shares one allocator between
// this device and the CPU, and no tensor is ever copied between them.
ggml_backend_buffer_type_t device_get_buffer_type(ggml_backend_dev_t) { return ggml_backend_cpu_buffer_type(); }

ggml_backend_buffer_t device_buffer_from_host_ptr(ggml_backend_dev_t, void * ptr, size_t size, size_t) {
    return ggml_backend_cpu_buffer_from_ptr(ptr, size);
}

// One-token steps (every sequence one token) that ggml's CPU backend computes faster than this
// backend, measured by ssmk-op-bench (1 thread, Zen 3): SSM_CONV 0.43x, Mamba-2 SSM_SCAN 0.52x,
// RWKV_WKV7 0.55x. These ops are out of place, so the backend first copies each state (or
// transposes the conv window), as many bytes as the update itself moves, where ggml reads the old
// state and writes the new one in one pass. Left to ggml, a decode graph also has fewer splits.
// Mamba-1 SSM_SCAN (2x) and GATED_DELTA_NET (1.1x) stay. SSMK_GGML_DECODES=all claims them too.
bool decode_left_to_cpu(const ggml_tensor * op) {
    static const bool claim_all = [] {
        const char * env = std::getenv("SSMK_GGML_DECODES");
        return env != nullptr && std::strcmp(env, "all") == 0;
    }();
    if (claim_all) {
        return false;
    }
    switch (op->op) {
        case GGML_OP_SSM_CONV: return op->ne[1] == 1;
        case GGML_OP_SSM_SCAN: return op->src[1]->ne[2] == 1 && op->src[3]->ne[0] == 1;
        case GGML_OP_RWKV_WKV7: return op->src[2]->ne[2] == op->src[6]->ne[1];
        default: return false;
    }
}

// Called with 0-byte dummy buffers while the model loads: decides on shapes and types only.
bool device_supports_op(ggml_backend_dev_t dev, const ggml_tensor * op) {
    if (is_view(op)) {
        return true;
    }
    if (op->type != GGML_TYPE_F32 || decode_left_to_cpu(op)) {
        return false;
    }
    switch (op->op) {
        case GGML_OP_SSM_CONV: return enabled_ops().conv && supports_ssm_conv(op);
        case GGML_OP_SSM_SCAN: return enabled_ops().scan && supports_ssm_scan(op);
        case GGML_OP_GATED_DELTA_NET: return enabled_ops().gdn && supports_gated_delta_net(op);
        case GGML_OP_RWKV_WKV7: return enabled_ops().wkv7 && supports_rwkv_wkv7(op);
        case GGML_OP_CPY: {
            // The copy of a claimed GATED_DELTA_NET's or RWKV_WKV7's new states into the cache
            // (see find_cache_rows); no other copy.
            const ggml_tensor * from = storage(op->src[0]);
            return op->src[0]->type == GGML_TYPE_F32 && op->src[1]->type == GGML_TYPE_F32 &&
                   (from->op == GGML_OP_GATED_DELTA_NET || from->op == GGML_OP_RWKV_WKV7) &&
                   device_supports_op(dev, from);
        }
        default: return false;
    }
}

bool device_supports_buft(ggml_backend_dev_t, ggml_backend_buffer_type_t buft) { return ggml_backend_buft_is_host(buft); }

const ggml_backend_device_i device_interface = {
    /* .get_name             = */ device_get_name,
    /* .get_description      = */ device_get_description,
    /* .get_memory           = */ device_get_memory,
    /* .get_type             = */ device_get_type,
    /* .get_props            = */ device_get_props,
    /* .init_backend         = */ device_init_backend,
    /* .get_buffer_type      = */ device_get_buffer_type,
    /* .get_host_buffer_type = */ nullptr,
    /* .buffer_from_host_ptr = */ device_buffer_from_host_ptr,
    /* .supports_op          = */ device_supports_op,
    /* .supports_buft        = */ device_supports_buft,
    /* .offload_op           = */ nullptr,
    /* .event_new            = */ nullptr,
    /* .event_free           = */ nullptr,
    /* .event_synchronize    = */ nullptr,
};

// ---------------------------------------------------------------- registry

const char * reg_get_name(ggml_backend_reg_t) { return kName; }

size_t reg_get_device_count(ggml_backend_reg_t) { return 1; }

ggml_backend_dev_t reg_get_device(ggml_backend_reg_t r, size_t index) {
    GGML_ASSERT(index == 0);
    static ggml_backend_device device = {device_interface, r, nullptr};
    return &device;
}

void * reg_get_proc_address(ggml_backend_reg_t, const char * name) {
    if (std::strcmp(name, "ggml_backend_set_n_threads") == 0) {
        return (void *) backend_set_n_threads;
    }
    return nullptr;
}

const ggml_backend_reg_i reg_interface = {
    /* .get_name         = */ reg_get_name,
    /* .get_device_count = */ reg_get_device_count,
    /* .get_device       = */ reg_get_device,
    /* .get_proc_address = */ reg_get_proc_address,
};

ggml_backend_reg_t reg() {
    static ggml_backend_reg r = {GGML_BACKEND_API_VERSION, reg_interface, nullptr};
    return &r;
}

// The backend includes ggml's internal interface structs and uses the ggml_op values of the build
// it was compiled against, which nothing else checks: the running ggml must be that build.
bool running_ggml_matches() {
    struct {
        ggml_op op;
        const char * name;
    } const ops[] = {
        {GGML_OP_SSM_CONV, "SSM_CONV"},
        {GGML_OP_SSM_SCAN, "SSM_SCAN"},
        {GGML_OP_GATED_DELTA_NET, "GATED_DELTA_NET"},
        {GGML_OP_RWKV_WKV7, "RWKV_WKV7"},
        {GGML_OP_GLU, "GLU"},  // the last op: nothing was inserted before it
    };
    bool ok = std::strcmp(ggml_version(), kPinnedGgmlVersion) == 0;
    for (const auto & o : ops) {
        ok = ok && std::strcmp(ggml_op_name(o.op), o.name) == 0;
    }
    if (!ok) {
        std::fprintf(stderr,
                     "ggml-ssmk: not registering: built for ggml %s (llama-cpp-python 0.3.36's llama.cpp), "
                     "but the running ggml is %s (commit %s) or its op list differs; rebuild the backend "
                     "against this llama.cpp\n",
                     kPinnedGgmlVersion, ggml_version(), ggml_commit());
    }
    return ok;
}

}  // namespace

// Entry point of ggml's backend loader (GGML_BACKEND_PATH, ggml_backend_load).
extern "C" __attribute__((visibility("default"))) ggml_backend_reg_t ggml_backend_init(void) {
    return running_ggml_matches() ? reg() : nullptr;
}
