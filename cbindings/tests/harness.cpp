/* C++ harness: drives libssmk.so through the raw C API and through ssmk.hpp, exactly as a C++
 * inference runtime would. Built and run by tests/c_harness.rs against the real shared library. */
#include "ssmk.hpp"

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
  CHECK(isa == "scalar" || isa == "avx2" || isa == "avx512");
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

int main() { return check::run_all(); }
