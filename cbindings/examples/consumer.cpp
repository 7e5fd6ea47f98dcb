// The smallest C++ program linked the documented way:
//   c++ -std=c++17 consumer.cpp $(pkg-config --cflags --libs ssmk)
// It zeroes two blocks of a small cache through ssmk.hpp and checks the result and the error path.
#include <ssmk.hpp>

#include <cstdio>
#include <cstring>

int main() {
  float cache[4][8];
  for (auto& block : cache)
    for (float& x : block) x = 1.0f;
  int32_t ids[2] = {0, 2};
  ssmk::view<float> blocks(&cache[0][0], {4, 8});
  ssmk::view<int32_t> block_ids(ids, {2});
  ssmk::context ctx(1);
  ssmk::zero_blocks(ctx, blocks, block_ids);
  for (int b = 0; b < 4; ++b)
    for (float x : cache[b])
      if (x != ((b == 0 || b == 2) ? 0.0f : 1.0f)) return 1;
  ids[1] = 9;
  try {
    ssmk::zero_blocks(ctx, blocks, block_ids);
    return 1;
  } catch (const ssmk::error& e) {
    if (e.status() != SSMK_ERR_OUT_OF_BOUNDS || std::strstr(e.what(), "block_ids[1] = 9") == nullptr)
      return 1;
  }
  std::printf("consumer.cpp: ssmk %s (%s) ok\n", ssmk_version(), ssmk_active_isa());
  return 0;
}
