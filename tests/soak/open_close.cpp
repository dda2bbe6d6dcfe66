// Soak: open and close a W=2 group on the real daemon, over and over. Two
// threads are the two ranks, each with its own loopback bootstrap (kept for
// the whole run, so what is measured is the daemon's open/close path).
//   tpf-soak-openclose --socket PATH --cycles N [--port P]
// Prints "RESULT ok cycles=N elapsed_s=T" or the first failure; exit 0/1.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <tpfabric/tpfabric.hpp>

using namespace tpf;

namespace {

struct Rank {
    std::uint32_t rank;
    std::string error;
    std::uint64_t done = 0;
};

void runRank(Rank& me, const std::string& socket, const std::string& boot, std::uint64_t cycles) {
    auto b = TcpBootstrap::create(me.rank, 2, boot);
    if (!b) {
        me.error = "bootstrap: " + b.error().describe();
        return;
    }
    Options o;
    o.socketPath = socket;
    o.fallback = Fallback::Error;
    alignas(64) std::uint8_t send[64] = {}, recv[128];
    for (std::uint64_t c = 0; c < cycles; ++c) {
        auto g = Group::open(**b, me.rank, 2, 4096, o);
        if (!g) {
            me.error = "open #" + std::to_string(c) + ": " + g.error().describe();
            return;
        }
        // One call per cycle proves the group works before it closes.
        std::memset(send, int(c & 0xff), sizeof send);
        if (auto s = (*g)->allGather(send, recv, sizeof send); !s) {
            me.error = "allGather #" + std::to_string(c) + ": " + s.error().describe();
            return;
        }
        (*g)->close();
        ++me.done;
    }
}

} // namespace

int main(int argc, char** argv) {
    std::string socket;
    std::uint64_t cycles = 10000;
    int port = 29611;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string k = argv[i];
        if (k == "--socket") socket = argv[i + 1];
        else if (k == "--cycles") cycles = std::strtoull(argv[i + 1], nullptr, 10);
        else if (k == "--port") port = std::atoi(argv[i + 1]);
    }
    if (socket.empty()) {
        std::fprintf(stderr, "usage: tpf-soak-openclose --socket PATH [--cycles N] [--port P]\n");
        return 2;
    }
    const std::string boot = "127.0.0.1:" + std::to_string(port);
    const auto t0 = std::chrono::steady_clock::now();
    Rank r0{0, {}}, r1{1, {}};
    std::thread a(runRank, std::ref(r0), socket, boot, cycles);
    std::thread b(runRank, std::ref(r1), socket, boot, cycles);
    a.join();
    b.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!r0.error.empty() || !r1.error.empty()) {
        std::printf("RESULT error cycles=%llu rank0=%s rank1=%s\n", (unsigned long long)std::min(r0.done, r1.done),
                    r0.error.c_str(), r1.error.c_str());
        return 1;
    }
    std::printf("RESULT ok cycles=%llu elapsed_s=%.1f\n", (unsigned long long)cycles, s);
    return 0;
}
