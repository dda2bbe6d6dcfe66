// Test runner entry for Catch2 2.x; Catch2 3.x brings its own main.
#if !__has_include(<catch2/catch_test_macros.hpp>)
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
#endif
