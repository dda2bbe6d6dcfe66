// A NIC in memory behind daemon/verbs/qp.hpp, for driving the real proxy
// (daemon/proxy/) without RDMA hardware. fake_nic.cpp implements every
// function qp.hpp leaves to a backend (qp.cpp with libibverbs, qp_stub.cpp
// without): a post is queued on its HCA's completion queue and lands (payload
// copied, then the epoch flag stored with release) only when the proxy polls
// and the NIC chooses to complete it; the bookkeeping of a post is the real
// one (QpLink::notePosted, retireOne, the InflightGate).
//
// The NIC checks, from its own count of what was posted and not completed,
// never from the gate: a post finds fewer bytes outstanding on its queue pair
// than the in-flight cap, and room in the send queue and in the CQ. Every
// check runs on the proxy thread; the test reads the results after
// Proxy::stop().
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace tpf::testing {

/// What the NIC saw; written on the proxy thread only.
struct NicReport {
    std::uint64_t posts = 0;
    std::uint64_t completions = 0;
    std::uint64_t capExceeded = 0; ///< posts that found the cap already reached
    std::uint64_t sendQueueFull = 0;
    std::uint64_t cqOverrun = 0;
    std::uint64_t wrongBytes = 0; ///< payload bytes that were not what the rank staged for that epoch
    std::uint64_t largestOutstanding = 0; ///< bytes on one queue pair at once (payloads + flags)
    std::uint64_t largestPost = 0;
    std::vector<std::string> notes; ///< the first few failures, in words
};

struct FakeNic {
    /// Of every poll, how many completions the NIC delivers at most (0..this,
    /// random): small values keep posts outstanding, so the caps bind.
    std::uint32_t maxPerPoll = 3;
    std::mt19937_64 rng{7};
    NicReport report;
    /// What a rank staged for an epoch, byte by byte: the NIC checks the
    /// payload it copies against it. Unset: no check.
    std::uint8_t (*expected)(std::uint64_t epoch, std::uint32_t src, std::uint64_t offset) = nullptr;
};

/// The one NIC every fake HCA belongs to (one test at a time).
FakeNic& fakeNic();
/// Forget every post, queue pair and report (between tests, proxy stopped).
void resetFakeNic();

} // namespace tpf::testing
