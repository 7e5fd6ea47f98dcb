/* Compiled alone as strict C11 and as C++17 (-Wall -Wextra -Werror -pedantic): the generated
 * header must be clean for both, and its layout must match DLPack's DLTensor. */
#include "ssmk.h"

#ifdef __cplusplus
#define STATIC_ASSERT static_assert
#else
#define STATIC_ASSERT _Static_assert
#endif

STATIC_ASSERT(sizeof(ssmk_device) == 8, "DLDevice is two int32");
STATIC_ASSERT(sizeof(ssmk_dtype) == 4, "DLDataType is u8, u8, u16");
STATIC_ASSERT(sizeof(ssmk_tensor) == 48, "DLTensor is 48 bytes on LP64");
STATIC_ASSERT(offsetof(ssmk_tensor, ndim) == 16 && offsetof(ssmk_tensor, dtype) == 20, "DLTensor field order");
STATIC_ASSERT(offsetof(ssmk_tensor, shape) == 24 && offsetof(ssmk_tensor, byte_offset) == 40, "DLTensor field order");
STATIC_ASSERT(SSMK_VERSION_NUMBER == ((SSMK_VERSION_MAJOR << 16) | (SSMK_VERSION_MINOR << 8) | SSMK_VERSION_PATCH),
              "version number packs major/minor/patch");
#if defined(EXPECT_MAJOR) && defined(EXPECT_MINOR) && defined(EXPECT_PATCH)
STATIC_ASSERT(SSMK_VERSION_MAJOR == EXPECT_MAJOR && SSMK_VERSION_MINOR == EXPECT_MINOR &&
                  SSMK_VERSION_PATCH == EXPECT_PATCH,
              "header version macros match Cargo.toml");
#endif
STATIC_ASSERT(SSMK_OK == 0 && SSMK_ERR_PANIC == -99, "status codes are fixed");

int ssmk_header_compiles(void);
int ssmk_header_compiles(void) { return SSMK_OK; }
