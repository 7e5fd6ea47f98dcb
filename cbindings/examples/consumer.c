/* The smallest program linked the documented way:
 *   cc consumer.c $(pkg-config --cflags --libs ssmk)
 * It zeroes two blocks of a small cache and checks the result and the error path. */
#include <ssmk.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  float cache[4][8];
  for (int b = 0; b < 4; ++b)
    for (int i = 0; i < 8; ++i) cache[b][i] = 1.0f;
  int64_t shape[2] = {4, 8}, id_shape[1] = {2};
  int32_t ids[2] = {0, 2};
  ssmk_tensor t = {cache, {SSMK_DEVICE_CPU, 0}, 2, {SSMK_DTYPE_CODE_FLOAT, 32, 1}, shape, NULL, 0};
  ssmk_tensor idt = {ids, {SSMK_DEVICE_CPU, 0}, 1, {SSMK_DTYPE_CODE_INT, 32, 1}, id_shape, NULL, 0};
  ssmk_context *ctx = ssmk_context_create(1);
  int32_t status = ssmk_zero_blocks(ctx, &t, &idt);
  if (status != SSMK_OK) {
    fprintf(stderr, "ssmk_zero_blocks: %s: %s\n", ssmk_status_str(status), ssmk_last_error_message());
    return 1;
  }
  for (int b = 0; b < 4; ++b)
    for (int i = 0; i < 8; ++i)
      if (cache[b][i] != ((b == 0 || b == 2) ? 0.0f : 1.0f)) return 1;
  ids[1] = 9;
  status = ssmk_zero_blocks(ctx, &t, &idt);
  if (status != SSMK_ERR_OUT_OF_BOUNDS || strstr(ssmk_last_error_message(), "block_ids[1] = 9") == NULL) return 1;
  ssmk_context_destroy(ctx);
  printf("consumer: ssmk %s (%s) ok\n", ssmk_version(), ssmk_active_isa());
  return 0;
}
