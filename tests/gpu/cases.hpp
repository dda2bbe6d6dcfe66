// Test cases of test_gpu_collectives and the few helpers they share.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tests/common/reference.hpp"
#include "tests/gpu/sim_group.hpp"

namespace tpf::gputest {

using namespace tpf::testref; // the host references, shared with tests/integration

struct Stats {
    std::uint32_t passed = 0, failed = 0;
};
extern Stats g_stats;
/// Counts a check; prints "FAIL: what" when !ok.
void check(bool ok, const std::string& what);

inline constexpr std::uint8_t kPoison = 0xa5;

/// A cudaMalloc'd buffer (at least 16 bytes).
struct DevBuf {
    void* p = nullptr;
    std::uint64_t bytes = 0;
    explicit DevBuf(std::uint64_t n);
    ~DevBuf();
    DevBuf(const DevBuf&) = delete;
    DevBuf& operator=(const DevBuf&) = delete;
    void upload(const std::vector<std::uint8_t>& v) const;
    std::vector<std::uint8_t> download(std::uint64_t n) const;
    void poison() const;
};

std::vector<std::uint8_t> randomBytes(std::mt19937_64& rng, std::uint64_t n);
bool allPoison(const std::vector<std::uint8_t>& v);
std::string tag(const SimGroup& g);

// cases_data.cu: results checked against host references.
void testGather(const SimOptions& o);
void testSum(const SimOptions& o, Elem t);
void testGraph(const SimOptions& o);
void testMixed();
void testLlEpochWrap();
// cases_fault.cu: failures, and many calls in a row.
void testTimeout(const SimOptions& o);
void testCallMismatches(const SimOptions& o); // ipc groups: ranks that disagree on a call's size, dtype or op
void testDaemonStop(const SimOptions& o, bool abort);
void testBackToBack(const SimOptions& o, std::uint32_t calls);
// cases_primitives.cu: kernels the test composes from kernels/device/.
void preloadComposedKernels();
void testComposed(const SimOptions& o);
// bench.cu
void runLatencyBench();

} // namespace tpf::gputest
