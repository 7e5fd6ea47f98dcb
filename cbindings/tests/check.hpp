/* A minimal test framework for the C++ harness: named test cases, CHECK macros that record
 * failures without aborting, and a closing "N passed, M failed" line. */
#pragma once
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace check {
struct registry {
  std::vector<std::pair<std::string, std::function<void()>>> tests;
  int failures_in_current = 0;
  static registry& get() {
    static registry r;
    return r;
  }
};
struct add {
  add(const char* name, std::function<void()> fn) { registry::get().tests.emplace_back(name, std::move(fn)); }
};
inline void fail(const char* file, int line, const std::string& what) {
  std::fprintf(stderr, "  %s:%d: CHECK failed: %s\n", file, line, what.c_str());
  registry::get().failures_in_current++;
}
inline int run_all() {
  int passed = 0, failed = 0;
  for (auto& [name, fn] : registry::get().tests) {
    registry::get().failures_in_current = 0;
    try {
      fn();
    } catch (const std::exception& e) {
      fail(__FILE__, __LINE__, std::string("uncaught exception: ") + e.what());
    }
    bool ok = registry::get().failures_in_current == 0;
    std::printf("test %s ... %s\n", name.c_str(), ok ? "ok" : "FAILED");
    (ok ? passed : failed)++;
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
}  // namespace check

#define CHECK_CONCAT2(a, b) a##b
#define CHECK_CONCAT(a, b) CHECK_CONCAT2(a, b)
#define TEST_CASE(name)                                                     \
  static void name();                                                       \
  static check::add CHECK_CONCAT(check_add_, name)(#name, name);            \
  static void name()
#define CHECK(cond)                                         \
  do {                                                      \
    if (!(cond)) check::fail(__FILE__, __LINE__, #cond);    \
  } while (0)
#define CHECK_STATUS(expr, expected)                                                           \
  do {                                                                                         \
    int32_t check_status_ = (expr);                                                            \
    if (check_status_ != (expected))                                                           \
      check::fail(__FILE__, __LINE__, std::string(#expr) + " = " + std::to_string(check_status_) + \
                                          ", expected " #expected ": " + ssmk_last_error_message()); \
  } while (0)
