// The fork() child handler and the table of daemon sockets it replaces
// (fork_guard.hpp). The handler runs in the child of a multi-threaded
// process, so it only loads atomics and makes async-signal-safe calls
// (open, dup3, close): no lock, no allocation.
#include "client/fork_guard.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <mutex>

namespace tpf {

namespace {

// Sockets of the open groups, as fd + 1 (0: a free entry, so that the table
// is zero-initialised before any constructor runs). A process with more open
// groups than this (none measured above a handful) keeps the others' sockets
// in its children, as before this table existed; it is said once on stderr.
constexpr std::size_t kWatched = 256;
std::array<std::atomic<int>, kWatched> watched{};
std::atomic<std::uint32_t> generation{0};

void inChild() {
    generation.fetch_add(1, std::memory_order_relaxed);
    int null = -1;
    for (auto& e : watched) {
        const int fd = e.load(std::memory_order_relaxed) - 1;
        if (fd < 0) continue;
        if (null < 0) null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
        if (null < 0) return; // no /dev/null: the child keeps its copies (nothing else to put there safely)
        (void)::dup3(null, fd, O_CLOEXEC);
    }
    if (null >= 0) ::close(null);
}

void watch(int fd) {
    static std::once_flag installed;
    std::call_once(installed, [] { (void)::pthread_atfork(nullptr, nullptr, inChild); });
    for (auto& e : watched) {
        int free = 0;
        if (e.compare_exchange_strong(free, fd + 1, std::memory_order_relaxed)) return;
    }
    static std::once_flag said;
    std::call_once(said, [] {
        std::fprintf(stderr, "tpfabric: more than %zu groups open in this process: a fork()ed child keeps the "
                             "daemon sockets of the newer ones until it exits\n", kWatched);
    });
}

void unwatch(int fd) {
    for (auto& e : watched) {
        int mine = fd + 1;
        if (e.compare_exchange_strong(mine, 0, std::memory_order_relaxed)) return;
    }
}

} // namespace

std::uint32_t forkGeneration() { return generation.load(std::memory_order_relaxed); }

void DaemonSocket::reset(UniqueFd fd) {
    if (fd_) unwatch(fd_.get());
    fd_ = std::move(fd);
    if (fd_) watch(fd_.get());
}

int DaemonSocket::release() {
    if (fd_) unwatch(fd_.get());
    return fd_.release();
}

} // namespace tpf
