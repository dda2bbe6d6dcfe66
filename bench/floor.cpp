// The floor: what moving `size` bytes between two processes through shared
// memory costs with nothing in between — no daemon, no doorbell, no futex.
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

#include "bench/bench.hpp"
#include "bench/launch.hpp"
#include "common/cpu_relax.hpp"

namespace tpf::bench {

namespace {

// Region: three 128-byte lines (ready, ping, pong), then the ping and pong buffers.
constexpr std::size_t kReadyOff = 0, kPingOff = 128, kPongOff = 256, kDataOff = 4096;
constexpr std::uint64_t kWaitNs = 10ull * 1000 * 1000 * 1000;

std::size_t roundPage(std::size_t n) { return (n + 4095) / 4096 * 4096; }
std::size_t regionBytes(std::uint64_t maxSize) { return kDataOff + 2 * roundPage(maxSize); }

std::uint64_t maxOf(const std::vector<std::uint64_t>& v) {
    std::uint64_t m = 0;
    for (auto x : v) m = std::max(m, x);
    return m;
}

struct Region {
    std::uint8_t* base = nullptr;
    std::size_t bytes = 0;
    std::uint64_t* word(std::size_t off) const { return reinterpret_cast<std::uint64_t*>(base + off); }
    std::uint8_t* ping() const { return base + kDataOff; }
    std::uint8_t* pong(std::uint64_t maxSize) const { return base + kDataOff + roundPage(maxSize); }
    ~Region() {
        if (base) ::munmap(base, bytes);
    }
};

void mapRegion(Region& r, int fd, std::size_t bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) throw std::runtime_error(std::string("floor: mmap: ") + std::strerror(errno));
    r.base = static_cast<std::uint8_t*>(p);
    r.bytes = bytes;
}

void publish(std::uint64_t* w, std::uint64_t v) { std::atomic_ref(*w).store(v, std::memory_order_release); }

// Pure spinning; sched_yield between bursts so that an oversubscribed box
// still lets the other side run.
bool spinFor(std::uint64_t* w, std::uint64_t want) {
    const std::uint64_t deadline = nowNs() + kWaitNs;
    for (;;) {
        for (int i = 0; i < 256; ++i) {
            if (std::atomic_ref(*w).load(std::memory_order_acquire) >= want) return true;
            cpuRelax();
        }
        ::sched_yield();
        if (nowNs() > deadline) return false;
    }
}

} // namespace

std::vector<Point> measureFloor(const std::vector<std::uint64_t>& sizes, std::uint64_t iters, std::uint64_t warmup,
                                std::string& pinning) {
    // Pinned as two processes on two physical cores: the peer inherits the
    // second CPU at fork, this process then takes the first; restored at the end.
    FloorPins pins;
    pinning = pins.describe();
    const std::uint64_t maxSize = maxOf(sizes);
    const std::size_t bytes = regionBytes(maxSize);
    const int fd = ::memfd_create("tpf-bench-floor", MFD_CLOEXEC);
    if (fd < 0 || ::ftruncate(fd, off_t(bytes)) != 0) throw std::runtime_error(std::string("floor: memfd: ") + std::strerror(errno));
    Region r;
    mapRegion(r, fd, bytes);

    std::vector<std::string> args{"floor-peer", "--fd", "3", "--iters", std::to_string(iters), "--warmup",
                                  std::to_string(warmup), "--sizes", joinSizes(sizes)};
    const pid_t peer = spawnSelf(args, fd);
    ::close(fd);
    pins.afterSpawn();
    auto fail = [&](const std::string& why) -> std::runtime_error {
        ::kill(peer, SIGKILL);
        ::waitpid(peer, nullptr, 0);
        return std::runtime_error("floor: " + why);
    };
    if (!spinFor(r.word(kReadyOff), 1)) throw fail("the floor-peer process did not start");

    std::vector<std::uint8_t> src(maxSize), dst(maxSize);
    for (std::size_t i = 0; i < maxSize; ++i) src[i] = std::uint8_t(i * 7 + 1);
    std::vector<Point> out;
    for (const std::uint64_t size : sizes) out.push_back(Point{Op::Gather, size, {}});
    std::uint64_t seq = 0;
    for (std::uint32_t b = 0; b < kFloorBursts; ++b) {
        for (Point& p : out) {
            const std::uint64_t size = p.size, first = p.ns.size();
            std::memset(dst.data(), 0, size);
            for (std::uint64_t i = 0; i < floorBurstWarmup(warmup) + floorBurstIters(iters); ++i) {
                ++seq;
                const std::uint64_t t0 = nowNs();
                std::memcpy(r.ping(), src.data(), size);
                publish(r.word(kPingOff), seq);
                if (!spinFor(r.word(kPongOff), seq)) throw fail("no answer from the floor-peer process");
                std::memcpy(dst.data(), r.pong(maxSize), size);
                const std::uint64_t t1 = nowNs();
                if (i >= floorBurstWarmup(warmup)) p.ns.push_back((t1 - t0) / 2);
            }
            if (std::memcmp(src.data(), dst.data(), size) != 0) throw fail("the echoed bytes differ at size " + std::to_string(size));
            const double median = percentile(std::vector<std::uint64_t>(p.ns.begin() + std::ptrdiff_t(first), p.ns.end()), 0.5);
            p.bestBurstP50Ns = b == 0 ? median : std::min(p.bestBurstP50Ns, median);
        }
    }
    int st = 0;
    ::waitpid(peer, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) throw std::runtime_error("floor: the floor-peer process failed");
    return out;
}

int runFloorPeer(int fd, const std::vector<std::uint64_t>& sizes, std::uint64_t iters, std::uint64_t warmup) {
    const std::uint64_t maxSize = maxOf(sizes);
    Region r;
    mapRegion(r, fd, regionBytes(maxSize));
    ::close(fd);
    std::vector<std::uint8_t> tmp(maxSize);
    publish(r.word(kReadyOff), 1);
    std::uint64_t seq = 0;
    for (std::uint32_t b = 0; b < kFloorBursts; ++b) {
        for (const std::uint64_t size : sizes) {
            for (std::uint64_t i = 0; i < floorBurstWarmup(warmup) + floorBurstIters(iters); ++i) {
                ++seq;
                if (!spinFor(r.word(kPingOff), seq)) return 1;
                std::memcpy(tmp.data(), r.ping(), size);
                std::memcpy(r.pong(maxSize), tmp.data(), size);
                publish(r.word(kPongOff), seq);
            }
        }
    }
    return 0;
}

} // namespace tpf::bench
