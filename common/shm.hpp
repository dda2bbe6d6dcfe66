// Shared memory between daemon and clients: sealed memfds and their mappings,
// and the futex calls that let either side sleep on a word in them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "common/fd.hpp"
#include <tpfabric/error.hpp>

namespace tpf {

/// A MAP_SHARED mapping, unmapped on destruction.
class Mapping {
public:
    Mapping() = default;
    Mapping(void* base, std::size_t bytes) : base_(base), bytes_(bytes) {}
    Mapping(Mapping&& o) noexcept : base_(std::exchange(o.base_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
    Mapping& operator=(Mapping&& o) noexcept;
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
    ~Mapping();

    std::uint8_t* data() const { return static_cast<std::uint8_t*>(base_); }
    std::size_t size() const { return bytes_; }
    explicit operator bool() const { return base_ != nullptr; }

private:
    void* base_ = nullptr;
    std::size_t bytes_ = 0;
};

/// A zero-filled memfd of `bytes`, sealed against shrinking, growing and
/// further sealing, so a peer that maps it can never make the creator's
/// mapping fault.
Result<UniqueFd> createSealedMemfd(const std::string& name, std::size_t bytes);

/// Map a whole memfd read-write, shared. Checks that the file is exactly
/// `bytes` long and, when `requireSeals`, that shrinking is sealed.
Result<Mapping> mapShared(int fd, std::size_t bytes, bool requireSeals);

/// Sleep while *word == expected, at most timeoutNs (0 = do not sleep).
/// Returns false on timeout. Process-shared (not FUTEX_PRIVATE).
bool futexWait(std::uint32_t* word, std::uint32_t expected, std::uint64_t timeoutNs);
/// Wake every sleeper on *word.
void futexWakeAll(std::uint32_t* word);
/// The writer's side of a region's sleep protocol (ControlBlock waiters and
/// wakeSeq), after it stored flags: when some thread announced that it
/// sleeps, bump *wakeSeq and wake every sleeper on it. The seq_cst fence
/// pairs with the sleeper's seq_cst increment of *waiters before it re-checks
/// the flags, so a sleeper either sees the flags or is woken.
void wakeIfWaiting(std::uint32_t* waiters, std::uint32_t* wakeSeq);

/// CLOCK_MONOTONIC in nanoseconds.
std::uint64_t monotonicNs();

} // namespace tpf
