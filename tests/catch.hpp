// Catch2 2.x (Debian 12, CI) and 3.x (the GPU machine) behind one include.
#pragma once
#if __has_include(<catch2/catch_test_macros.hpp>)
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#else
#include <catch2/catch.hpp>
#endif
