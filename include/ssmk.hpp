/* ssmk: header-only C++17 wrapper over the C ABI in ssmk.h. SPDX-License-Identifier: MIT OR Apache-2.0
 *
 * - ssmk::context   RAII owner of an ssmk_context (move-only).
 * - ssmk::tensor    a DLPack descriptor that owns copies of its shape and strides, so it can be
 *                   built from a pointer + initializer lists and passed to any ssmk_* function.
 * - ssmk::view<T>   a typed tensor whose dtype comes from T (float, ssmk::bf16, ssmk::f16,
 *                   int32_t, int64_t, uint8_t, bool).
 * - ssmk::error     thrown by every wrapper on a non-zero status; carries the status and the
 *                   message of ssmk_last_error_message().
 * Wrappers take required tensors by reference and optional ones by pointer (nullptr = absent).
 * No wrapper allocates tensor memory: all data stays the caller's.
 */
#ifndef SSMK_HPP
#define SSMK_HPP

#include "ssmk.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace ssmk {

/** Error thrown by the wrappers: the ssmk status code and the library's message. */
class error : public std::runtime_error {
 public:
  error(int32_t status, const std::string& message)
      : std::runtime_error(std::string(ssmk_status_str(status)) + ": " + message), status_(status) {}
  int32_t status() const noexcept { return status_; }

 private:
  int32_t status_;
};

/** Throws ssmk::error unless `status` is SSMK_OK. */
inline void check(int32_t status) {
  if (status != SSMK_OK) throw error(status, ssmk_last_error_message());
}

/** bfloat16 storage (the upper half of an IEEE float). Conversions round to nearest even. */
struct bf16 {
  uint16_t bits;
  static bf16 from_float(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((x >> 16) | 0x40u)};
    x += 0x7fffu + ((x >> 16) & 1u);
    return bf16{static_cast<uint16_t>(x >> 16)};
  }
  float to_float() const {
    uint32_t x = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &x, 4);
    return f;
  }
};

/** IEEE binary16 storage. Conversions round to nearest even. */
struct f16 {
  uint16_t bits;
  static f16 from_float(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    uint16_t out;
    if (x >= 0x47800000u) {  // overflow, inf or nan
      out = x > 0x7f800000u ? 0x7e00u : 0x7c00u;
    } else if (x < 0x38800000u) {  // subnormal or zero: let the FPU round at the 2^-24 grid
      float a;
      std::memcpy(&a, &x, 4);
      a += 0.5f;
      uint32_t r;
      std::memcpy(&r, &a, 4);
      out = static_cast<uint16_t>(r - 0x3f000000u);
    } else {
      const uint32_t odd = (x >> 13) & 1u;
      x += 0xc8000fffu + odd;  // rebias the exponent and round half to even
      out = static_cast<uint16_t>(x >> 13);
    }
    return f16{static_cast<uint16_t>(out | sign)};
  }
  float to_float() const {
    const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
    const uint32_t exp = (bits >> 10) & 0x1fu, mant = bits & 0x3ffu;
    uint32_t x;
    if (exp == 0) {
      float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
      std::memcpy(&x, &v, 4);
      x |= sign;
    } else if (exp == 31) {
      x = sign | 0x7f800000u | (mant << 13);
    } else {
      x = sign | ((exp + 112u) << 23) | (mant << 13);
    }
    float f;
    std::memcpy(&f, &x, 4);
    return f;
  }
};
static_assert(sizeof(bf16) == 2 && sizeof(f16) == 2, "16-bit storage types");

/** DLPack dtype of a C++ element type. */
template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr ssmk_dtype value{SSMK_DTYPE_CODE_FLOAT, 32, 1}; };
template <> struct dtype_of<f16> { static constexpr ssmk_dtype value{SSMK_DTYPE_CODE_FLOAT, 16, 1}; };
template <> struct dtype_of<bf16> { static constexpr ssmk_dtype value{SSMK_DTYPE_CODE_BFLOAT, 16, 1}; };
template <> struct dtype_of<int32_t> { static constexpr ssmk_dtype value{SSMK_DTYPE_CODE_INT, 32, 1}; };
template <> struct dtype_of<int64_t> { static constexpr ssmk_dtype value{SSMK_DTYPE_CODE_INT, 64, 1}; };
template <> struct dtype_of<uint8_t> { static constexpr ssmk_dtype value{SSMK_DTYPE_CODE_UINT, 8, 1}; };
template <> struct dtype_of<bool> { static constexpr ssmk_dtype value{SSMK_DTYPE_CODE_BOOL, 8, 1}; };

/** RAII context: `context(1)` runs every kernel on the calling thread; `context()` uses the default. */
class context {
 public:
  explicit context(uint32_t num_threads = 0) : ctx_(ssmk_context_create(num_threads)) {
    if (!ctx_) throw error(SSMK_ERR_ALLOCATION, "ssmk_context_create returned NULL");
  }
  ~context() { ssmk_context_destroy(ctx_); }
  context(context&& other) noexcept : ctx_(std::exchange(other.ctx_, nullptr)) {}
  context& operator=(context&& other) noexcept {
    if (this != &other) {
      ssmk_context_destroy(ctx_);
      ctx_ = std::exchange(other.ctx_, nullptr);
    }
    return *this;
  }
  context(const context&) = delete;
  context& operator=(const context&) = delete;
  ssmk_context* get() const noexcept { return ctx_; }
  uint32_t num_threads() const noexcept { return ssmk_context_num_threads(ctx_); }

 private:
  ssmk_context* ctx_;
};

/** A descriptor owning copies of its shape and strides (up to 6 dimensions). Copyable. */
class tensor {
 public:
  static constexpr int max_ndim = 6;

  tensor(void* data, ssmk_dtype dtype, std::initializer_list<int64_t> shape,
         std::initializer_list<int64_t> strides = {}) {
    if (shape.size() > max_ndim || (strides.size() != 0 && strides.size() != shape.size()))
      throw error(SSMK_ERR_INVALID_ARGUMENT, "ssmk::tensor: at most 6 dims, strides empty or one per dim");
    std::copy(shape.begin(), shape.end(), shape_.begin());
    std::copy(strides.begin(), strides.end(), strides_.begin());
    t_ = ssmk_tensor{data, ssmk_device{SSMK_DEVICE_CPU, 0}, static_cast<int32_t>(shape.size()), dtype,
                     nullptr, nullptr, 0};
    has_strides_ = strides.size() != 0;
    relink();
  }
  tensor(const tensor& other) : shape_(other.shape_), strides_(other.strides_), t_(other.t_),
                                has_strides_(other.has_strides_) { relink(); }
  tensor& operator=(const tensor& other) {
    shape_ = other.shape_;
    strides_ = other.strides_;
    t_ = other.t_;
    has_strides_ = other.has_strides_;
    relink();
    return *this;
  }

  /** The C descriptor, valid while this object lives. */
  ssmk_tensor* get() noexcept { return &t_; }
  const ssmk_tensor* get() const noexcept { return &t_; }
  int64_t dim(int i) const { return shape_.at(static_cast<size_t>(i)); }
  /** Marks the memory as CUDA host-pinned (device_type 3); still read and written by the CPU. */
  tensor& pinned() noexcept {
    t_.device.device_type = SSMK_DEVICE_CUDA_HOST;
    return *this;
  }

 private:
  void relink() noexcept {
    t_.shape = shape_.data();
    t_.strides = has_strides_ ? strides_.data() : nullptr;
  }
  std::array<int64_t, max_ndim> shape_{};
  std::array<int64_t, max_ndim> strides_{};
  ssmk_tensor t_{};
  bool has_strides_ = false;
};

/** A tensor whose dtype is fixed by T at compile time. */
template <class T> class view : public tensor {
 public:
  view(T* data, std::initializer_list<int64_t> shape, std::initializer_list<int64_t> strides = {})
      : tensor(const_cast<void*>(static_cast<const void*>(data)), dtype_of<std::remove_const_t<T>>::value,
               shape, strides) {}
};

namespace detail {
inline const ssmk_tensor* opt(const tensor* t) noexcept { return t ? t->get() : nullptr; }
inline ssmk_tensor* opt(tensor* t) noexcept { return t ? t->get() : nullptr; }
}  // namespace detail

/** ssmk_batch_memcpy; throws ssmk::error. */
inline void batch_memcpy(const context& ctx, void* const* dst, const void* const* src, const size_t* sizes,
                         size_t n) {
  check(ssmk_batch_memcpy(ctx.get(), dst, src, sizes, n));
}

/** ssmk_zero_blocks; throws ssmk::error. */
inline void zero_blocks(const context& ctx, tensor& cache, const tensor& block_ids) {
  check(ssmk_zero_blocks(ctx.get(), cache.get(), block_ids.get()));
}

/** ssmk_zero_blocks_multi over `n` caches; throws ssmk::error. */
inline void zero_blocks_multi(const context& ctx, tensor* const* caches, size_t n, const tensor& block_ids) {
  std::vector<ssmk_tensor*> raw(n);
  for (size_t i = 0; i < n; ++i) raw[i] = caches[i] ? caches[i]->get() : nullptr;
  check(ssmk_zero_blocks_multi(ctx.get(), raw.data(), n, block_ids.get()));
}

/** ssmk_causal_conv1d_fwd; optional arguments are nullptr when absent (the checkpoint tables of
 *  ABI.md §4.10 by default). Throws ssmk::error. */
inline void causal_conv1d_fwd(const context& ctx, const tensor& x, const tensor& weight, const tensor* bias,
                              tensor* conv_states, const tensor* query_start_loc, const tensor* cache_indices,
                              const tensor* has_initial_state, uint32_t activation, int64_t pad_slot_id,
                              tensor& out, const tensor* checkpoint_offsets = nullptr,
                              const tensor* checkpoint_slots = nullptr) {
  check(ssmk_causal_conv1d_fwd(ctx.get(), x.get(), weight.get(), detail::opt(bias), detail::opt(conv_states),
                               detail::opt(query_start_loc), detail::opt(cache_indices),
                               detail::opt(has_initial_state), activation, pad_slot_id, out.get(),
                               detail::opt(checkpoint_offsets), detail::opt(checkpoint_slots)));
}

/** ssmk_causal_conv1d_update; throws ssmk::error. */
inline void causal_conv1d_update(const context& ctx, const tensor& x, tensor& conv_states, const tensor& weight,
                                 const tensor* bias, const tensor* conv_state_indices,
                                 const tensor* num_accepted_tokens, uint32_t activation, int64_t pad_slot_id,
                                 tensor& out) {
  check(ssmk_causal_conv1d_update(ctx.get(), x.get(), conv_states.get(), weight.get(), detail::opt(bias),
                                  detail::opt(conv_state_indices), detail::opt(num_accepted_tokens), activation,
                                  pad_slot_id, out.get()));
}

/** ssmk_short_conv (LFM2: out = C * conv(B * x)); throws ssmk::error. */
inline void short_conv(const context& ctx, const tensor& bcx, const tensor& weight, const tensor* bias,
                       tensor* conv_states, const tensor* query_start_loc, const tensor* cache_indices,
                       const tensor* has_initial_state, int64_t pad_slot_id, tensor& out,
                       const tensor* checkpoint_offsets = nullptr, const tensor* checkpoint_slots = nullptr) {
  check(ssmk_short_conv(ctx.get(), bcx.get(), weight.get(), detail::opt(bias), detail::opt(conv_states),
                        detail::opt(query_start_loc), detail::opt(cache_indices), detail::opt(has_initial_state),
                        pad_slot_id, out.get(), detail::opt(checkpoint_offsets), detail::opt(checkpoint_slots)));
}

/** ssmk_gdn_gating: g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b). Throws ssmk::error. */
inline void gdn_gating(const context& ctx, const tensor& a_log, const tensor& a, const tensor& b,
                       const tensor& dt_bias, float softplus_beta, float softplus_threshold, tensor& g,
                       tensor& beta) {
  check(ssmk_gdn_gating(ctx.get(), a_log.get(), a.get(), b.get(), dt_bias.get(), softplus_beta, softplus_threshold,
                        g.get(), beta.get()));
}

/** ssmk_kda_gating: Kimi Delta Attention's per-channel gates (and beta = sigmoid(b)); optional
 *  arguments are nullptr when absent. Throws ssmk::error. */
inline void kda_gating(const context& ctx, const tensor& a_log, const tensor& a, const tensor* dt_bias,
                       float lower_bound, const tensor* b, tensor& g, tensor* beta) {
  check(ssmk_kda_gating(ctx.get(), a_log.get(), a.get(), detail::opt(dt_bias), lower_bound, detail::opt(b),
                        g.get(), detail::opt(beta)));
}

/** ssmk_gated_delta_rule; optional arguments are nullptr when absent. Throws ssmk::error. */
inline void gated_delta_rule(const context& ctx, const tensor& q, const tensor& k, const tensor& v, const tensor& g,
                             const tensor& beta, float scale, tensor* state, const tensor* cu_seqlens,
                             const tensor* state_indices, const tensor* has_initial_state,
                             const tensor* num_accepted_tokens, uint32_t flags, float l2norm_eps,
                             int64_t pad_slot_id, tensor& out, const tensor* checkpoint_offsets = nullptr,
                             const tensor* checkpoint_slots = nullptr) {
  check(ssmk_gated_delta_rule(ctx.get(), q.get(), k.get(), v.get(), g.get(), beta.get(), scale, detail::opt(state),
                              detail::opt(cu_seqlens), detail::opt(state_indices), detail::opt(has_initial_state),
                              detail::opt(num_accepted_tokens), flags, l2norm_eps, pad_slot_id, out.get(),
                              detail::opt(checkpoint_offsets), detail::opt(checkpoint_slots)));
}

/** ssmk_mamba2_scan (Mamba-2 selective-state scan); optional arguments are nullptr when absent.
 *  `flags` is SSMK_MAMBA2_DT_SOFTPLUS or 0; dt_min/dt_max of -INFINITY/INFINITY mean no limit.
 *  Throws ssmk::error. */
inline void mamba2_scan(const context& ctx, const tensor& x, const tensor& dt, const tensor& A, const tensor& B,
                        const tensor& C, const tensor* D, const tensor* z, const tensor* dt_bias, float dt_min,
                        float dt_max, uint32_t flags, tensor* state, const tensor* cu_seqlens,
                        const tensor* state_indices, const tensor* has_initial_state,
                        const tensor* num_accepted_tokens, int64_t pad_slot_id, tensor& out,
                        const tensor* checkpoint_offsets = nullptr, const tensor* checkpoint_slots = nullptr) {
  check(ssmk_mamba2_scan(ctx.get(), x.get(), dt.get(), A.get(), B.get(), C.get(), detail::opt(D), detail::opt(z),
                         detail::opt(dt_bias), dt_min, dt_max, flags, detail::opt(state), detail::opt(cu_seqlens),
                         detail::opt(state_indices), detail::opt(has_initial_state),
                         detail::opt(num_accepted_tokens), pad_slot_id, out.get(), detail::opt(checkpoint_offsets),
                         detail::opt(checkpoint_slots)));
}

/** ssmk_dplr_delta_rule (RWKV-7's generalized delta rule); optional arguments are nullptr when
 *  absent. `flags` is SSMK_DPLR_W_LINEAR (w holds the decay factor) or 0 (w is its log).
 *  Throws ssmk::error. */
inline void dplr_delta_rule(const context& ctx, const tensor& r, const tensor& w, const tensor& k, const tensor& v,
                            const tensor& a, const tensor& b, float scale, tensor* state, const tensor* cu_seqlens,
                            const tensor* state_indices, const tensor* has_initial_state,
                            const tensor* num_accepted_tokens, uint32_t flags, int64_t pad_slot_id, tensor& out,
                            const tensor* checkpoint_offsets = nullptr, const tensor* checkpoint_slots = nullptr) {
  check(ssmk_dplr_delta_rule(ctx.get(), r.get(), w.get(), k.get(), v.get(), a.get(), b.get(), scale,
                             detail::opt(state), detail::opt(cu_seqlens), detail::opt(state_indices),
                             detail::opt(has_initial_state), detail::opt(num_accepted_tokens), flags, pad_slot_id,
                             out.get(), detail::opt(checkpoint_offsets), detail::opt(checkpoint_slots)));
}

}  // namespace ssmk

#endif /* SSMK_HPP */
