/* C++ harness: drives libssmk.so through the raw C API and through ssmk.hpp, exactly as a C++
 * inference runtime would. Built and run by tests/c_harness.rs against the real shared library. */
#include "ssmk.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "check.hpp"

static bool contains(const char* haystack, const char* needle) { return std::strstr(haystack, needle) != nullptr; }

TEST_CASE(version_macros_match_runtime) {
  std::string expected = std::to_string(SSMK_VERSION_MAJOR) + "." + std::to_string(SSMK_VERSION_MINOR) + "." +
                         std::to_string(SSMK_VERSION_PATCH);
  CHECK(expected == ssmk_version());
  std::string isa = ssmk_active_isa();
  CHECK(isa == "scalar" || isa == "avx2" || isa == "avx512" || isa == "avx512_bf16" || isa == "neon");
  std::printf("active isa: %s\n", isa.c_str());
}

TEST_CASE(status_strings) {
  const int32_t codes[] = {SSMK_OK, SSMK_ERR_NULL_POINTER, SSMK_ERR_INVALID_ARGUMENT, SSMK_ERR_UNSUPPORTED_DTYPE,
                           SSMK_ERR_OUT_OF_BOUNDS, SSMK_ERR_OVERFLOW, SSMK_ERR_ALIASING,
                           SSMK_ERR_UNSUPPORTED_DEVICE, SSMK_ERR_ALLOCATION, SSMK_ERR_PANIC};
  for (int32_t c : codes) CHECK(std::strncmp(ssmk_status_str(c), "SSMK_", 5) == 0);
  CHECK(std::string(ssmk_status_str(42)) == "unknown ssmk status");
}

TEST_CASE(raw_c_context_and_batch_memcpy) {
  ssmk_context* ctx = ssmk_context_create(2);
  CHECK(ctx != nullptr);
  CHECK(ssmk_context_num_threads(ctx) == 2);
  std::vector<unsigned char> pool(1 << 16);
  std::iota(pool.begin(), pool.end(), 0);
  std::vector<unsigned char> want = pool;
  // Overlapping entries: the result must equal memmove in order.
  void* dst[3] = {pool.data() + 100, pool.data() + 0, pool.data() + 5000};
  const void* src[3] = {pool.data() + 0, pool.data() + 150, pool.data() + 5100};
  size_t sizes[3] = {1000, 500, 20000};
  for (int i = 0; i < 3; ++i)
    std::memmove(want.data() + ((unsigned char*)dst[i] - pool.data()),
                 want.data() + ((const unsigned char*)src[i] - pool.data()), sizes[i]);
  CHECK_STATUS(ssmk_batch_memcpy(ctx, dst, src, sizes, 3), SSMK_OK);
  CHECK(pool == want);
  CHECK(std::string(ssmk_last_error_message()).empty());
  ssmk_context_destroy(ctx);
  ssmk_context_destroy(nullptr);
}

TEST_CASE(raw_c_zero_blocks_rejects_out_of_range_id) {
  std::vector<float> cache(4 * 8, 1.0f);
  int64_t shape[2] = {4, 8};
  ssmk_tensor t{cache.data(), {SSMK_DEVICE_CPU, 0}, 2, {SSMK_DTYPE_CODE_FLOAT, 32, 1}, shape, nullptr, 0};
  int32_t ids[2] = {1, 7};
  int64_t id_shape[1] = {2};
  ssmk_tensor idt{ids, {SSMK_DEVICE_CPU, 0}, 1, {SSMK_DTYPE_CODE_INT, 32, 1}, id_shape, nullptr, 0};
  CHECK_STATUS(ssmk_zero_blocks(nullptr, &t, &idt), SSMK_ERR_OUT_OF_BOUNDS);
  CHECK(contains(ssmk_last_error_message(), "block_ids[1] = 7"));
  for (float v : cache) CHECK(v == 1.0f);
  ids[1] = 3;
  CHECK_STATUS(ssmk_zero_blocks(nullptr, &t, &idt), SSMK_OK);
  for (int b = 0; b < 4; ++b)
    for (int i = 0; i < 8; ++i) CHECK(cache[b * 8 + i] == ((b == 1 || b == 3) ? 0.0f : 1.0f));
}

TEST_CASE(hpp_context_views_and_errors) {
  ssmk::context ctx(1);
  CHECK(ctx.num_threads() == 1);
  ssmk::context moved = std::move(ctx);
  CHECK(moved.get() != nullptr && ctx.get() == nullptr);

  std::vector<ssmk::bf16> kv(6 * 2 * 16);
  for (auto& x : kv) x = ssmk::bf16::from_float(2.5f);
  // K = kv[:, 0, :], V = kv[:, 1, :] as strided views of one buffer.
  ssmk::view<ssmk::bf16> k(kv.data(), {6, 16}, {32, 1});
  ssmk::view<ssmk::bf16> v(kv.data() + 16, {6, 16}, {32, 1});
  std::vector<int64_t> ids = {0, 5};
  ssmk::view<int64_t> idv(ids.data(), {2});
  ssmk::tensor* caches[2] = {&k, &v};
  ssmk::zero_blocks_multi(moved, caches, 2, idv);
  for (int b = 0; b < 6; ++b)
    for (int i = 0; i < 32; ++i) CHECK(kv[b * 32 + i].to_float() == ((b == 0 || b == 5) ? 0.0f : 2.5f));

  ids[1] = 6;
  bool threw = false;
  try {
    ssmk::zero_blocks(moved, k, idv);
  } catch (const ssmk::error& e) {
    threw = true;
    CHECK(e.status() == SSMK_ERR_OUT_OF_BOUNDS);
    CHECK(contains(e.what(), "block_ids[1] = 6"));
    CHECK(contains(e.what(), "SSMK_ERR_OUT_OF_BOUNDS"));
  }
  CHECK(threw);
  // Copies of a view keep their own shape storage.
  ssmk::tensor copy = k;
  CHECK(copy.get()->shape != k.get()->shape && copy.dim(1) == 16);
}

TEST_CASE(hpp_half_conversions_round_to_nearest_even) {
  CHECK(ssmk::bf16::from_float(1.0f).bits == 0x3f80);
  float tie_even, tie_odd;
  uint32_t a = 0x3f808000u, b = 0x3f818000u;
  std::memcpy(&tie_even, &a, 4);
  std::memcpy(&tie_odd, &b, 4);
  CHECK(ssmk::bf16::from_float(tie_even).bits == 0x3f80);
  CHECK(ssmk::bf16::from_float(tie_odd).bits == 0x3f82);
  CHECK(std::isnan(ssmk::bf16::from_float(NAN).to_float()));
  CHECK(ssmk::f16::from_float(1.0f).bits == 0x3c00);
  CHECK(ssmk::f16::from_float(65504.0f).bits == 0x7bff);
  CHECK(ssmk::f16::from_float(65520.0f).bits == 0x7c00);
  CHECK(ssmk::f16::from_float(5.960464477539063e-08f).bits == 0x0001);
  CHECK(ssmk::f16::from_float(-2.0f).bits == 0xc000);
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    ssmk::f16 x{static_cast<uint16_t>(h)};
    CHECK(ssmk::f16::from_float(x.to_float()).bits == h);
  }
}

static float sigmoid_silu(double v) { return static_cast<float>(v / (1.0 + std::exp(-v))); }

TEST_CASE(hpp_causal_conv1d_fwd_matches_double_reference_and_keeps_state) {
  // Two sequences (lengths 5 and 3), D = 20 channels (vector body + scalar tail), W = 4, silu.
  const int T = 8, D = 20, W = 4, S = 3, L = W - 1;
  std::vector<float> x(T * D), w(D * W), b(D), st(S * L * D), out(T * D, -7.0f);
  for (int i = 0; i < T * D; ++i) x[i] = std::sin(0.37 * i);
  for (int i = 0; i < D * W; ++i) w[i] = std::cos(0.11 * i) * 0.5f;
  for (int i = 0; i < D; ++i) b[i] = 0.01f * i;
  for (int i = 0; i < S * L * D; ++i) st[i] = std::cos(0.05 * i);
  const std::vector<float> st0 = st;
  std::vector<int32_t> qsl = {0, 5, 8}, idx = {2, 0};
  std::vector<uint8_t> init = {1, 0};
  ssmk::context ctx(2);
  ssmk::view<float> xv(x.data(), {T, D}), wv(w.data(), {D, W}), bv(b.data(), {D}), sv(st.data(), {S, L, D}),
      ov(out.data(), {T, D});
  ssmk::view<int32_t> qv(qsl.data(), {3}), iv(idx.data(), {2});
  ssmk::view<uint8_t> hv(init.data(), {2});
  ssmk::causal_conv1d_fwd(ctx, xv, wv, &bv, &sv, &qv, &iv, &hv, SSMK_ACTIVATION_SILU, -1, ov);
  for (int seq = 0; seq < 2; ++seq) {
    int start = qsl[seq], len = qsl[seq + 1] - start, slot = idx[seq];
    for (int c = 0; c < D; ++c) {
      auto input = [&](int rel) -> double {  // relative time, negative = history
        if (rel >= 0) return x[(start + rel) * D + c];
        return init[seq] ? st0[(slot * L + (L + rel)) * D + c] : 0.0;
      };
      for (int t = 0; t < len; ++t) {
        double acc = b[c];
        for (int k = 0; k < W; ++k) acc += w[c * W + k] * input(t + k - (W - 1));
        float want = sigmoid_silu(acc), got = out[(start + t) * D + c];
        CHECK(std::fabs(got - want) <= 1e-5f * (1 + std::fabs(want)));
      }
      for (int j = 0; j < L; ++j) CHECK(st[(slot * L + j) * D + c] == static_cast<float>(input(len - L + j)));
    }
  }
  for (int c = 0; c < D; ++c) CHECK(st[(1 * L) * D + c] == st0[(1 * L) * D + c]);  // slot 1 unused

  // A slot out of range: ssmk::error with the argument named, nothing written.
  idx[1] = 7;
  std::vector<float> before = out;
  bool threw = false;
  try {
    ssmk::causal_conv1d_fwd(ctx, xv, wv, nullptr, &sv, &qv, &iv, nullptr, SSMK_ACTIVATION_NONE, -1, ov);
  } catch (const ssmk::error& e) {
    threw = e.status() == SSMK_ERR_OUT_OF_BOUNDS && contains(e.what(), "cache_indices[1] = 7");
  }
  CHECK(threw);
  CHECK(out == before);
}

TEST_CASE(raw_c_update_equals_fwd_on_one_token) {
  const int B = 3, D = 16, W = 3, L = 2;
  std::vector<ssmk::bf16> x(B * D), w(D * W), st(B * L * D), st2, out1(B * D), out2(B * D);
  for (int i = 0; i < B * D; ++i) x[i] = ssmk::bf16::from_float(std::sin(1.3 * i));
  for (int i = 0; i < D * W; ++i) w[i] = ssmk::bf16::from_float(std::cos(0.7 * i));
  for (int i = 0; i < B * L * D; ++i) st[i] = ssmk::bf16::from_float(std::sin(0.3 * i));
  st2 = st;
  ssmk::context ctx(1);
  ssmk::view<ssmk::bf16> xv(x.data(), {B, D}), wv(w.data(), {D, W}), sv(st.data(), {B, L, D}),
      sv2(st2.data(), {B, L, D}), o1(out1.data(), {B, D}), o2(out2.data(), {B, D});
  ssmk::causal_conv1d_update(ctx, xv, sv, wv, nullptr, nullptr, nullptr, SSMK_ACTIVATION_NONE, -1, o1);
  std::vector<int64_t> qsl = {0, 1, 2, 3};
  std::vector<int32_t> init = {1, 1, 1};
  ssmk::view<int64_t> qv(qsl.data(), {4});
  ssmk::view<int32_t> hv(init.data(), {3});
  CHECK_STATUS(ssmk_causal_conv1d_fwd(ctx.get(), xv.get(), wv.get(), nullptr, sv2.get(), qv.get(), nullptr, hv.get(),
                                      SSMK_ACTIVATION_NONE, -1, o2.get(), nullptr, nullptr),
               SSMK_OK);
  CHECK(std::memcmp(out1.data(), out2.data(), out1.size() * 2) == 0);
  CHECK(std::memcmp(st.data(), st2.data(), st.size() * 2) == 0);
  // A checkpoint (ABI.md §4.10): one 3-token sequence in slot 0 with its state after token 2 in
  // slot 2 equals a 2-token call's final state; a checkpoint in the sequence's own slot is refused.
  {
    std::vector<ssmk::bf16> st3 = st, st4 = st, o3(3 * D), o4(2 * D);
    std::vector<int64_t> one = {0, 3}, two = {0, 2}, offs = {2}, slots = {2};
    ssmk::view<ssmk::bf16> x3(x.data(), {3, D}), x2(x.data(), {2, D}), s3(st3.data(), {B, L, D}),
        s4(st4.data(), {B, L, D}), ov3(o3.data(), {3, D}), ov4(o4.data(), {2, D});
    ssmk::view<int64_t> q3(one.data(), {2}), q2(two.data(), {2}), co(offs.data(), {1, 1}), cs(slots.data(), {1, 1});
    ssmk::causal_conv1d_fwd(ctx, x3, wv, nullptr, &s3, &q3, nullptr, nullptr, SSMK_ACTIVATION_NONE, -1, ov3, &co, &cs);
    ssmk::causal_conv1d_fwd(ctx, x2, wv, nullptr, &s4, &q2, nullptr, nullptr, SSMK_ACTIVATION_NONE, -1, ov4);
    CHECK(std::memcmp(&st3[2 * L * D], &st4[0], (W - 1) * D * 2) == 0);
    slots[0] = 0;
    CHECK_STATUS(ssmk_causal_conv1d_fwd(ctx.get(), x3.get(), wv.get(), nullptr, s3.get(), q3.get(), nullptr, nullptr,
                                        SSMK_ACTIVATION_NONE, -1, ov3.get(), co.get(), cs.get()),
                 SSMK_ERR_INVALID_ARGUMENT);
    CHECK(contains(ssmk_last_error_message(), "checkpoint_slots[0][0] = 0"));
  }
  // Unknown activation value: refused, named.
  CHECK_STATUS(ssmk_causal_conv1d_update(ctx.get(), xv.get(), sv.get(), wv.get(), nullptr, nullptr, nullptr, 5, -1,
                                         o1.get()),
               SSMK_ERR_INVALID_ARGUMENT);
  CHECK(contains(ssmk_last_error_message(), "activation = 5"));
}

TEST_CASE(short_conv_equals_composition) {
  const int T = 6, D = 24, W = 3;
  std::vector<float> bcx(T * 3 * D), w(D * W), fused(T * D), bx(T * D), y(T * D), composed(T * D);
  for (int i = 0; i < T * 3 * D; ++i) bcx[i] = std::sin(0.29 * i);
  for (int i = 0; i < D * W; ++i) w[i] = std::cos(0.17 * i);
  std::vector<float> st1(1 * (W - 1) * D, 0.0f), st2 = st1;
  ssmk::context ctx(2);
  ssmk::view<float> bv(bcx.data(), {T, 3 * D}), wv(w.data(), {D, W}), fv(fused.data(), {T, D}),
      s1(st1.data(), {1, W - 1, D}), s2(st2.data(), {1, W - 1, D});
  ssmk::short_conv(ctx, bv, wv, nullptr, &s1, nullptr, nullptr, nullptr, -1, fv);
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < D; ++c) bx[t * D + c] = bcx[t * 3 * D + c] * bcx[t * 3 * D + 2 * D + c];
  ssmk::view<float> xv(bx.data(), {T, D}), yv(y.data(), {T, D});
  ssmk::causal_conv1d_fwd(ctx, xv, wv, nullptr, &s2, nullptr, nullptr, nullptr, SSMK_ACTIVATION_NONE, -1, yv);
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < D; ++c) composed[t * D + c] = bcx[t * 3 * D + D + c] * y[t * D + c];
  CHECK(fused == composed);
  CHECK(st1 == st2);
}

TEST_CASE(hpp_gated_delta_rule_decode_matches_double_recurrence) {
  // One decode token for two sequences (slots 1 and 0), H = 1, HV = 2 (GQA), K = 8, V = 4.
  const int B = 2, H = 1, HV = 2, K = 8, V = 4, S = 2;
  std::vector<float> q(B * H * K), k(B * H * K), v(B * HV * V), g(B * HV), beta(B * HV), out(B * HV * V);
  std::vector<float> state(S * HV * K * V);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.5 * i), k[i] = std::cos(0.3 * i);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.7 * i + 1);
  for (size_t i = 0; i < g.size(); ++i) g[i] = -0.1f * (i + 1), beta[i] = 0.3f + 0.1f * i;
  for (size_t i = 0; i < state.size(); ++i) state[i] = 0.05f * std::cos(0.2 * i);
  const std::vector<float> state0 = state;
  std::vector<int32_t> cu = {0, 1, 2}, idx = {1, 0};
  std::vector<uint8_t> init = {1, 1};
  ssmk::context ctx(2);
  ssmk::view<float> qv(q.data(), {B, H, K}), kv(k.data(), {B, H, K}), vv(v.data(), {B, HV, V}), gv(g.data(), {B, HV}),
      bv(beta.data(), {B, HV}), sv(state.data(), {S, HV, K, V}), ov(out.data(), {B, HV, V});
  ssmk::view<int32_t> cv(cu.data(), {3}), iv(idx.data(), {2});
  ssmk::view<uint8_t> hv(init.data(), {2});
  const float scale = 0.25f;
  ssmk::gated_delta_rule(ctx, qv, kv, vv, gv, bv, scale, &sv, &cv, &iv, &hv, nullptr, 0, 1e-6f, -1, ov);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < HV; ++h) {
      const int slot = idx[b], qh = h / (HV / H);
      const double a = std::exp(static_cast<double>(g[b * HV + h]));
      std::vector<double> s(K * V);
      for (int i = 0; i < K * V; ++i) s[i] = a * state0[(slot * HV + h) * K * V + i];
      for (int j = 0; j < V; ++j) {
        double kts = 0;
        for (int i = 0; i < K; ++i) kts += s[i * V + j] * k[(b * H + qh) * K + i];
        const double delta = beta[b * HV + h] * (v[(b * HV + h) * V + j] - kts);
        for (int i = 0; i < K; ++i) s[i * V + j] += k[(b * H + qh) * K + i] * delta;
      }
      for (int j = 0; j < V; ++j) {
        double o = 0;
        for (int i = 0; i < K; ++i) o += s[i * V + j] * q[(b * H + qh) * K + i];
        CHECK(std::fabs(out[(b * HV + h) * V + j] - scale * o) <= 1e-5 * (1 + std::fabs(o)));
      }
      for (int i = 0; i < K * V; ++i)
        CHECK(std::fabs(state[(slot * HV + h) * K * V + i] - s[i]) <= 1e-5 * (1 + std::fabs(s[i])));
    }
  // HV not a multiple of H is refused with the argument named.
  ssmk::view<float> v3(v.data(), {B, 3, 2});
  bool threw = false;
  try {
    ssmk::gated_delta_rule(ctx, qv, kv, v3, gv, bv, scale, &sv, &cv, &iv, &hv, nullptr, 0, 1e-6f, -1, ov);
  } catch (const ssmk::error& e) {
    threw = e.status() == SSMK_ERR_INVALID_ARGUMENT;
  }
  CHECK(threw);
}

TEST_CASE(hpp_dplr_delta_rule_ggml_state_matches_double_recurrence) {
  // RWKV-7 as llama.cpp runs it: w as decay factors (SSMK_DPLR_W_LINEAR), the state of each head
  // kept [v][k] (ggml's wkv7 rows) and passed as a strided [S, H, K, V] view. Two sequences: 5
  // tokens continuing slot 1's state, then a 1-token decode from zeros into slot 0; H = 2,
  // K = 8, V = 4, a = -kk, b = kk * 0.5 with kk a unit vector.
  const int T = 6, H = 2, K = 8, V = 4, S = 2;
  std::vector<float> r(T * H * K), w(T * H * K), k(T * H * K), a(T * H * K), b(T * H * K), v(T * H * V),
      out(T * H * V), state(S * H * V * K);
  for (int th = 0; th < T * H; ++th) {
    double norm = 0;
    for (int i = 0; i < K; ++i) norm += std::pow(std::sin(0.37 * (th * K + i) + 0.2), 2);
    for (int i = 0; i < K; ++i) {
      const int x = th * K + i;
      const double kk = std::sin(0.37 * x + 0.2) / std::sqrt(norm);
      r[x] = static_cast<float>(0.3 * std::cos(0.11 * x));
      k[x] = static_cast<float>(0.3 * std::sin(0.23 * x));
      w[x] = static_cast<float>(std::exp(-0.6 * (0.5 + 0.5 * std::sin(0.7 * x))));
      a[x] = static_cast<float>(-kk);
      b[x] = static_cast<float>(0.5 * kk);
    }
  }
  for (int i = 0; i < T * H * V; ++i) v[i] = static_cast<float>(std::sin(0.41 * i));
  for (int i = 0; i < S * H * V * K; ++i) state[i] = static_cast<float>(0.2 * std::cos(0.13 * i));
  const std::vector<float> state0 = state;
  std::vector<int32_t> cu = {0, 5, 6}, idx = {1, 0};
  std::vector<uint8_t> init = {1, 0};
  ssmk::context ctx(2);
  ssmk::view<float> rv(r.data(), {T, H, K}), wv(w.data(), {T, H, K}), kv(k.data(), {T, H, K}),
      av(a.data(), {T, H, K}), bv(b.data(), {T, H, K}), vv(v.data(), {T, H, V}), ov(out.data(), {T, H, V}),
      sv(state.data(), {S, H, K, V}, {H * V * K, V * K, 1, K});
  ssmk::view<int32_t> cv(cu.data(), {3}), iv(idx.data(), {2});
  ssmk::view<uint8_t> hv(init.data(), {2});
  ssmk::dplr_delta_rule(ctx, rv, wv, kv, vv, av, bv, 0.0f, &sv, &cv, &iv, &hv, nullptr, SSMK_DPLR_W_LINEAR, -1, ov);
  for (int seq = 0; seq < 2; ++seq)
    for (int h = 0; h < H; ++h) {
      const int slot = idx[seq];
      // s[i][j]: key i, value j; memory [slot][h][j][i].
      std::vector<double> s(K * V, 0.0);
      if (init[seq])
        for (int i = 0; i < K; ++i)
          for (int j = 0; j < V; ++j) s[i * V + j] = state0[((slot * H + h) * V + j) * K + i];
      for (int t = cu[seq]; t < cu[seq + 1]; ++t) {
        const int row = (t * H + h) * K;
        std::vector<double> sa(V, 0.0);
        for (int i = 0; i < K; ++i)
          for (int j = 0; j < V; ++j) sa[j] += a[row + i] * s[i * V + j];
        for (int i = 0; i < K; ++i)
          for (int j = 0; j < V; ++j)
            s[i * V + j] = w[row + i] * s[i * V + j] + b[row + i] * sa[j] + k[row + i] * v[(t * H + h) * V + j];
        for (int j = 0; j < V; ++j) {
          double o = 0;
          for (int i = 0; i < K; ++i) o += r[row + i] * s[i * V + j];
          CHECK(std::fabs(out[(t * H + h) * V + j] - o) <= 1e-5 * (1 + std::fabs(o)));
        }
      }
      for (int i = 0; i < K; ++i)
        for (int j = 0; j < V; ++j) {
          const double got = state[((slot * H + h) * V + j) * K + i];
          CHECK(std::fabs(got - s[i * V + j]) <= 1e-5 * (1 + std::fabs(s[i * V + j])));
        }
    }
  // out of another dtype than v is refused with both named; nothing written.
  std::vector<ssmk::bf16> out16(T * H * V);
  ssmk::view<ssmk::bf16> o16(out16.data(), {T, H, V});
  const std::vector<float> state_before = state;
  bool threw = false;
  try {
    ssmk::dplr_delta_rule(ctx, rv, wv, kv, vv, av, bv, 0.0f, &sv, &cv, &iv, &hv, nullptr, 0, -1, o16);
  } catch (const ssmk::error& e) {
    threw = e.status() == SSMK_ERR_UNSUPPORTED_DTYPE && contains(e.what(), "out.dtype");
  }
  CHECK(threw);
  CHECK(state == state_before);
}

TEST_CASE(hpp_gdn_gating_matches_formula) {
  const int N = 3, HV = 4;
  std::vector<float> a_log = {0.1f, -0.5f, 0.0f, 1.0f}, dt = {0.2f, 0.0f, -0.3f, 25.0f}, a(N * HV), b(N * HV),
                     g(N * HV), beta(N * HV);
  for (int i = 0; i < N * HV; ++i) a[i] = std::sin(1.1 * i) * 3, b[i] = std::cos(0.9 * i) * 2;
  ssmk::context ctx(1);
  ssmk::view<float> al(a_log.data(), {HV}), av(a.data(), {N, HV}), bv(b.data(), {N, HV}), dv(dt.data(), {HV}),
      gv(g.data(), {N, HV}), betav(beta.data(), {N, HV});
  ssmk::gdn_gating(ctx, al, av, bv, dv, 1.0f, 20.0f, gv, betav);
  for (int n = 0; n < N; ++n)
    for (int h = 0; h < HV; ++h) {
      const double x = a[n * HV + h] + dt[h];
      const double sp = x > 20.0 ? x : std::log1p(std::exp(x));
      const double want_g = -std::exp(static_cast<double>(a_log[h])) * sp;
      const double want_beta = 1.0 / (1.0 + std::exp(-static_cast<double>(b[n * HV + h])));
      CHECK(std::fabs(g[n * HV + h] - want_g) <= 1e-5 * (1 + std::fabs(want_g)));
      CHECK(std::fabs(beta[n * HV + h] - want_beta) <= 1e-6);
    }
}

TEST_CASE(hpp_kda_gating_both_forms) {
  const int N = 2, HV = 2, K = 3;
  std::vector<float> a_log = {0.3f, -0.2f}, dt(HV * K), a(N * HV * K), b(N * HV), g(N * HV * K), beta(N * HV);
  for (int i = 0; i < HV * K; ++i) dt[i] = 0.1f * i - 0.2f;
  for (int i = 0; i < N * HV * K; ++i) a[i] = std::sin(0.7 * i) * 4;
  for (int i = 0; i < N * HV; ++i) b[i] = std::cos(1.3 * i);
  ssmk::context ctx(1);
  ssmk::view<float> al(a_log.data(), {HV}), av(a.data(), {N, HV, K}), dv(dt.data(), {HV * K}),
      bv(b.data(), {N, HV}), gv(g.data(), {N, HV, K}), betav(beta.data(), {N, HV});
  for (float lower : {0.0f, -5.0f}) {
    ssmk::kda_gating(ctx, al, av, &dv, lower, &bv, gv, &betav);
    for (int n = 0; n < N; ++n)
      for (int h = 0; h < HV; ++h)
        for (int k = 0; k < K; ++k) {
          const int i = (n * HV + h) * K + k;
          const double x = a[i] + dt[h * K + k], e = std::exp(static_cast<double>(a_log[h]));
          const double want = lower == 0.0f ? -e * (x > 20.0 ? x : std::log1p(std::exp(x)))
                                            : lower / (1.0 + std::exp(-e * x));
          CHECK(std::fabs(g[i] - want) <= 1e-5 * (1 + std::fabs(want)));
        }
    for (int i = 0; i < N * HV; ++i) CHECK(std::fabs(beta[i] - 1.0 / (1.0 + std::exp(-b[i]))) <= 1e-6);
  }
  bool threw = false;
  try {
    ssmk::kda_gating(ctx, al, av, &dv, 0.0f, &bv, gv, nullptr);
  } catch (const ssmk::error& e) {
    threw = e.status() == SSMK_ERR_INVALID_ARGUMENT;
  }
  CHECK(threw);
}

static float as_float(float v) { return v; }
static float as_float(ssmk::bf16 v) { return v.to_float(); }
static void store(float& d, float v) { d = v; }
static void store(ssmk::bf16& d, float v) { d = ssmk::bf16::from_float(v); }

// ssmk_mamba2_scan with x, z and out of type E against the double-precision per-token recurrence
// of its doc comment: D, dt_bias, softplus, both dt limits reached, z gate, NH/G = 2 heads per
// group, two sequences (3 tokens from a zero state; 67 from slot 0's state: the chunked form, two
// chunks), slot 1 untouched. Then NH % G != 0 is refused with nothing written.
template <class E>
static void mamba2_scan_case(double out_atol, double out_rtol) {
  const int NH = 4, P = 5, G = 2, N = 7, T = 70, S = 3, SL = NH * P * N;
  std::vector<E> x(T * NH * P), z(T * NH * P), out(T * NH * P);
  std::vector<float> dt(T * NH), Bm(T * G * N), Cm(T * G * N), A(NH), Dv(NH), bias(NH), st(S * SL);
  for (int i = 0; i < T * NH * P; ++i) {
    store(x[i], static_cast<float>(std::sin(0.37 * i)));
    store(z[i], static_cast<float>(2 * std::cos(0.23 * i)));
    store(out[i], -7.0f);
  }
  for (int i = 0; i < T * NH; ++i) dt[i] = static_cast<float>(2.5 * std::sin(0.61 * i) - 1.5);  // [-4, 1]
  for (int i = 0; i < T * G * N; ++i) Bm[i] = 0.5f * std::cos(0.13 * i), Cm[i] = 0.5f * std::sin(0.29 * i + 1);
  for (int h = 0; h < NH; ++h) A[h] = -0.5f - 0.5f * h, Dv[h] = 0.3f * h - 0.4f, bias[h] = 0.1f * h - 0.15f;
  for (int i = 0; i < S * SL; ++i) st[i] = 0.5f * std::cos(0.07 * i);
  const std::vector<float> st0 = st;
  std::vector<int32_t> cu = {0, 3, 70}, idx = {2, 0};
  std::vector<uint8_t> init = {0, 1};
  const float dt_min = 0.1f, dt_max = 0.8f;
  ssmk::context ctx(2);
  ssmk::view<E> xv(x.data(), {T, NH, P}), zv(z.data(), {T, NH, P}), ov(out.data(), {T, NH, P});
  ssmk::view<float> dtv(dt.data(), {T, NH}), av(A.data(), {NH}), bv(Bm.data(), {T, G, N}), cv(Cm.data(), {T, G, N}),
      dv(Dv.data(), {NH}), biasv(bias.data(), {NH}), sv(st.data(), {S, NH, P, N});
  ssmk::view<int32_t> cuv(cu.data(), {3}), iv(idx.data(), {2});
  ssmk::view<uint8_t> hv(init.data(), {2});
  ssmk::mamba2_scan(ctx, xv, dtv, av, bv, cv, &dv, &zv, &biasv, dt_min, dt_max, SSMK_MAMBA2_DT_SOFTPLUS, &sv, &cuv,
                    &iv, &hv, nullptr, -1, ov);
  int below_min = 0, above_max = 0;
  for (int seq = 0; seq < 2; ++seq) {
    const int slot = idx[seq];
    std::vector<double> h(SL, 0.0);
    if (init[seq])
      for (int i = 0; i < SL; ++i) h[i] = st0[slot * SL + i];
    for (int t = cu[seq]; t < cu[seq + 1]; ++t)
      for (int hh = 0; hh < NH; ++hh) {
        const int g = hh / (NH / G);
        double d = static_cast<double>(dt[t * NH + hh]) + bias[hh];
        d = d > 20.0 ? d : std::log1p(std::exp(d));
        below_min += d < dt_min;
        above_max += d > dt_max;
        d = std::min(std::max(d, static_cast<double>(dt_min)), static_cast<double>(dt_max));
        const double decay = std::exp(d * A[hh]);
        for (int p = 0; p < P; ++p) {
          const int i = (t * NH + hh) * P + p;
          const double xi = as_float(x[i]), zi = as_float(z[i]);
          double y = Dv[hh] * xi;
          for (int n = 0; n < N; ++n) {
            double& s = h[(hh * P + p) * N + n];
            s = decay * s + d * xi * Bm[(t * G + g) * N + n];
            y += s * Cm[(t * G + g) * N + n];
          }
          y *= zi / (1.0 + std::exp(-zi));
          CHECK(std::fabs(as_float(out[i]) - y) <= out_atol + out_rtol * std::fabs(y));
        }
      }
    for (int i = 0; i < SL; ++i) CHECK(std::fabs(st[slot * SL + i] - h[i]) <= 1e-4 * (1 + std::fabs(h[i])));
  }
  CHECK(below_min > 0 && above_max > 0);  // both limits of the clamp were exercised
  for (int i = 0; i < SL; ++i) CHECK(st[1 * SL + i] == st0[1 * SL + i]);  // slot 1 unused

  // NH = 4 heads over G = 3 groups: refused with B.shape[1] named; out and state untouched.
  std::vector<float> b3(T * 3 * N, 0.25f), c3(T * 3 * N, 0.25f);
  ssmk::view<float> b3v(b3.data(), {T, 3, N}), c3v(c3.data(), {T, 3, N});
  const std::vector<E> out_before = out;
  const std::vector<float> st_before = st;
  bool threw = false;
  try {
    ssmk::mamba2_scan(ctx, xv, dtv, av, b3v, c3v, &dv, &zv, &biasv, dt_min, dt_max, SSMK_MAMBA2_DT_SOFTPLUS, &sv,
                      &cuv, &iv, &hv, nullptr, -1, ov);
  } catch (const ssmk::error& e) {
    threw = e.status() == SSMK_ERR_INVALID_ARGUMENT && contains(e.what(), "B.shape[1]");
  }
  CHECK(threw);
  CHECK(std::memcmp(out.data(), out_before.data(), out.size() * sizeof(E)) == 0);
  CHECK(st == st_before);
}

TEST_CASE(hpp_mamba2_scan_matches_double_recurrence) {
  mamba2_scan_case<float>(1e-4, 1e-4);
  // bf16 x/z/out: the reference reads the rounded inputs; out carries one bf16 rounding (2^-9 rel).
  mamba2_scan_case<ssmk::bf16>(1e-4, 4e-3);
}

int main() { return check::run_all(); }
