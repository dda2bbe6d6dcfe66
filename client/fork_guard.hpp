// What a fork() child does to its parent's groups. A child made by fork()
// inherits a copy of every open Group, but its daemon socket, rings and
// regions are the parent's: a call from the child would stage rows into the
// parent's slots, and the socket copy kept the daemon from seeing the parent
// die (a rank leaves when its socket closes, and the child's copy held it open
// for as long as the child lived). So, in the child, right after fork():
//   - every open group's daemon socket is replaced by /dev/null (dup2 on the
//     same descriptor number, so nothing else of the child's is touched);
//   - forkGeneration() advances, and each group compares it with the one it
//     was opened in: any call in the child ends Closed, naming the parent,
//     and close() releases the child's copies only (no message, no CUDA call,
//     nothing written to the shared regions).
// A group the child opens itself is the child's own, as usual.
#pragma once

#include <sys/types.h>

#include <cstdint>

#include "common/fd.hpp"

namespace tpf {

/// fork() children this process descends from since the library was loaded
/// (0 in a process that never was one); read with a relaxed load.
std::uint32_t forkGeneration();

/// A group's daemon socket, registered for the fork handler while open.
/// Move-only; the same use as UniqueFd.
class DaemonSocket {
public:
    DaemonSocket() = default;
    explicit DaemonSocket(UniqueFd fd) { reset(std::move(fd)); }
    DaemonSocket(DaemonSocket&& o) noexcept { reset(UniqueFd(o.release())); }
    DaemonSocket& operator=(DaemonSocket&& o) noexcept {
        if (this != &o) reset(UniqueFd(o.release()));
        return *this;
    }
    DaemonSocket(const DaemonSocket&) = delete;
    DaemonSocket& operator=(const DaemonSocket&) = delete;
    ~DaemonSocket() { reset(); }

    int get() const { return fd_.get(); }
    explicit operator bool() const { return bool(fd_); }
    void reset(UniqueFd fd = UniqueFd());

private:
    int release();
    UniqueFd fd_;
};

} // namespace tpf
