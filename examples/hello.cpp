// hello.cpp: one rank of a tpfabric host group, in C++.
//
// Opens a group over the TCP bootstrap, runs an all-gather and a bf16 sum,
// and checks both against a reference computed here from every rank's
// inputs. Start WORLD copies, one per rank, against a running tpfabricd:
//
//   c++ -std=c++20 hello.cpp $(pkg-config --cflags --libs libtpfabric) -o hello
//   for r in 0 1 2; do ./hello $r 3 127.0.0.1:29500 & done; wait
//
// Exit status 0 when every check passed, 1 on any failure (printed), 2 on
// bad arguments.
#include <tpfabric/tpfabric.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr std::size_t kGatherBytes = 4096; // one rank's shard
constexpr std::size_t kSumCount = 2048;    // bf16 elements

int fail(const char* what, const tpf::Error& e) {
    std::fprintf(stderr, "hello: %s: %s\n", what, e.describe().c_str());
    return 1;
}

// bf16 is the upper half of an f32; rounding to nearest even, as the library does.
float fromBf16(std::uint16_t b) {
    const std::uint32_t u = std::uint32_t(b) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}
std::uint16_t toBf16(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return std::uint16_t((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

// Every rank's inputs, so that any rank can compute the expected results.
std::uint8_t gatherByte(std::uint32_t rank, std::size_t i) { return std::uint8_t(rank * 31 + i * 7); }
std::uint16_t sumInput(std::uint32_t rank, std::size_t i) {
    return toBf16(float(int((i * 13 + rank * 29) % 101) - 50) * 0.37f);
}

} // namespace

int main(int argc, char** argv) {
    if (argc != 4 && !(argc == 6 && std::strcmp(argv[4], "--socket") == 0)) {
        std::fprintf(stderr, "usage: %s RANK WORLD HOST:PORT [--socket PATH]\n", argv[0]);
        return 2;
    }
    const auto rank = std::uint32_t(std::strtoul(argv[1], nullptr, 10));
    const auto world = std::uint32_t(std::strtoul(argv[2], nullptr, 10));
    tpf::Options options;
    if (argc == 6) options.socketPath = argv[5]; // default: $TPF_SOCKET, else /run/tpfabric/tpfabricd.sock

    // Rank 0 listens on HOST:PORT, the others connect. An engine passes its
    // own communicator or store instead (docs/integration.md).
    auto boot = tpf::TcpBootstrap::create(rank, world, argv[3]);
    if (!boot) return fail("bootstrap", boot.error());
    auto opened = tpf::Group::open(**boot, rank, world, /*maxBytes=*/64 * 1024, options);
    if (!opened) return fail("open", opened.error());
    tpf::Group& group = **opened;

    // All-gather: recv holds world shards in rank order. Buffers must be
    // 16-byte aligned; operator new (and so std::vector) guarantees that.
    std::vector<std::uint8_t> send(kGatherBytes), recv(world * kGatherBytes);
    for (std::size_t i = 0; i < kGatherBytes; ++i) send[i] = gatherByte(rank, i);
    if (!group.fits(kGatherBytes)) { // above the cap a device group would call NCCL instead
        std::fprintf(stderr, "hello: %zu B is above the agreed cap %llu B\n", kGatherBytes,
                     static_cast<unsigned long long>(group.agreedCap()));
        return 1;
    }
    if (auto s = group.allGather(send.data(), recv.data(), kGatherBytes); !s) return fail("all-gather", s.error());
    for (std::uint32_t r = 0; r < world; ++r)
        for (std::size_t i = 0; i < kGatherBytes; ++i)
            if (recv[r * kGatherBytes + i] != gatherByte(r, i)) {
                std::fprintf(stderr, "hello: all-gather: byte %zu of rank %u's shard differs\n", i, r);
                return 1;
            }

    // bf16 sum: added in rank order in f32 and rounded once, so every rank
    // (and this reference) gets the same bits.
    std::vector<std::uint16_t> in(kSumCount), out(kSumCount);
    for (std::size_t i = 0; i < kSumCount; ++i) in[i] = sumInput(rank, i);
    if (auto s = group.allReduceSum(in.data(), out.data(), kSumCount, tpf::DType::BF16); !s)
        return fail("bf16 sum", s.error());
    for (std::size_t i = 0; i < kSumCount; ++i) {
        float acc = fromBf16(sumInput(0, i));
        for (std::uint32_t r = 1; r < world; ++r) acc += fromBf16(sumInput(r, i));
        if (out[i] != toBf16(acc)) {
            std::fprintf(stderr, "hello: bf16 sum: element %zu is 0x%04x, expected 0x%04x\n", i, out[i], toBf16(acc));
            return 1;
        }
    }

    // The health word, once per step after the engine's own synchronisation
    // point (device groups: where the step's sampled tokens reach the host):
    // a few loads of host memory, no stream sync, no system call. A device
    // call that failed inside a kernel, also one replayed in a CUDA graph,
    // sets it before the kernel ends. When it is set, the outputs of the
    // failed call and every later one were not written: drop the step's
    // results, stop the other ranks (abort(), or the engine's teardown),
    // then on every rank close, reopen, capture the graphs again and redo
    // the step. check() (after synchronising) gives the detail.
    if (const tpf::Health h = group.health(); !h.ok()) {
        std::fprintf(stderr, "hello: the group is broken: %s naming rank %d; reopen it on every rank\n",
                     std::string(tpf::errcName(h.code)).c_str(), h.rank == tpf::Health::kNoRank ? -1 : int(h.rank));
        return fail("check", group.check().error());
    }
    // A call that failed broke the group; check() says so (and, for device
    // groups, what a kernel recorded). Then close it and open a new one.
    if (auto s = group.check(); !s) return fail("check", s.error());

    std::string routes;
    for (std::uint32_t p = 0; p < world; ++p) routes += (p ? " " : "") + group.route(p);
    std::printf("hello: rank %u of %u, path %s (routes %s): all-gather of %zu B ok, bf16 sum of %zu ok\n", rank, world,
                group.path().c_str(), routes.c_str(), kGatherBytes, kSumCount);
    return 0;
}
