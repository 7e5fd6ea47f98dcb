/* Loads libssmk with dlopen/dlsym alone (no header, no link-time dependency) and runs a kernel:
 * what a runtime that probes for ssmk at start-up does.
 * Usage: dlopen_demo /path/to/libssmk.so */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef int32_t (*batch_memcpy_fn)(const void *, void *const *, const void *const *, const size_t *, size_t);
typedef const char *(*string_fn)(void);

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s libssmk.so\n", argv[0]);
    return 2;
  }
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen failed: %s\n", dlerror());
    return 1;
  }
  /* POSIX blesses this cast from void* to a function pointer via memcpy-free assignment. */
  batch_memcpy_fn batch_memcpy;
  string_fn version, last_error;
  *(void **)&batch_memcpy = dlsym(lib, "ssmk_batch_memcpy");
  *(void **)&version = dlsym(lib, "ssmk_version");
  *(void **)&last_error = dlsym(lib, "ssmk_last_error_message");
  if (!batch_memcpy || !version || !last_error) {
    fprintf(stderr, "missing symbol: %s\n", dlerror());
    return 1;
  }
  char a[32] = "hello from ssmk", b[32] = {0}, c[8] = {0};
  void *dst[2] = {b, c};
  const void *src[2] = {a, a + 6};
  size_t sizes[2] = {16, 4};
  int32_t status = batch_memcpy(NULL, dst, src, sizes, 2);
  if (status != 0 || strcmp(b, "hello from ssmk") != 0 || memcmp(c, "from", 4) != 0) {
    fprintf(stderr, "batch_memcpy: status %d, got '%s'\n", status, b);
    return 1;
  }
  /* A NULL destination with a non-zero size must be refused with a message, touching nothing. */
  dst[1] = NULL;
  memset(b, 0, sizeof b);
  status = batch_memcpy(NULL, dst, src, sizes, 2);
  if (status != -1 || b[0] != 0 || strstr(last_error(), "dst[1]") == NULL) {
    fprintf(stderr, "expected SSMK_ERR_NULL_POINTER naming dst[1], got %d: %s\n", status, last_error());
    return 1;
  }
  printf("dlopen_demo: ssmk %s ok\n", version());
  return 0;
}
