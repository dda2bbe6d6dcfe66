// Shared by the libFuzzer targets: a check that survives NDEBUG and names the
// broken invariant before trapping, so a crash report says what went wrong.
#pragma once

#include <cstdio>
#include <cstdlib>

#define TPF_FUZZ_CHECK(cond)                                                                  \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            std::fprintf(stderr, "fuzz invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
            std::abort();                                                                     \
        }                                                                                     \
    } while (0)
