// TPF_* variables of the client: parsed strictly, in one place.
#include "client/env.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>
#include <vector>

#include "client/impl.hpp"
#include "common/byte_size.hpp"
#include "proto/bootstrap.hpp"

extern char** environ;

namespace tpf {

namespace {

// The variables the client reads (readClientEnv below).
constexpr std::string_view kClientNames[] = {"TPF_SOCKET", "TPF_DISABLE", "TPF_FALLBACK", "TPF_GPU_ROUTE",
                                             "TPF_NCCL_ABOVE", "TPF_GPU_LL", "TPF_GPU_LL_CHUNKS", "TPF_GPU_PDL",
                                             "TPF_GPU_POLLERS", "TPF_HOST_DIRECT"};

// Edit distance counting a swap of neighbours as one edit (optimal string
// alignment): TPF_DISBALE and TPF_DISABLED are both one from TPF_DISABLE.
std::size_t distance(std::string_view a, std::string_view b) {
    std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
    for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
    for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i)
        for (std::size_t j = 1; j <= b.size(); ++j) {
            d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
        }
    return d[a.size()][b.size()];
}

const char* get(const char* name) {
    const char* v = std::getenv(name);
    return v && *v ? v : nullptr;
}

Error bad(const char* name, const char* value, const char* accepted) {
    return Error{Errc::ConfigError, std::string(name) + "=" + value + ": accepted values are " + accepted};
}

// A TPF_* name one edit away from a client variable is almost certainly a
// typo of it (TPF_DISBALE=1 would otherwise be silently ignored).
// Tools and tests set other TPF_* names of their own; those pass unremarked.
void warnMisspelledNames() {
    static std::once_flag once;
    std::call_once(once, [] {
        for (char** e = environ; e && *e; ++e) {
            const std::string_view kv(*e);
            if (kv.substr(0, 4) != "TPF_") continue;
            const std::string_view name = kv.substr(0, kv.find('='));
            if (std::find(std::begin(kClientNames), std::end(kClientNames), name) != std::end(kClientNames)) continue;
            for (auto known : kClientNames)
                if (distance(name, known) == 1) {
                    std::fprintf(stderr, "tpfabric: warning: %.*s is not a tpfabric variable and is ignored; did you mean %.*s?\n",
                                 int(name.size()), name.data(), int(known.size()), known.data());
                    break;
                }
        }
    });
}

} // namespace

Result<ClientEnv> readClientEnv() {
    warnMisspelledNames();
    ClientEnv env;
    if (const char* v = get("TPF_SOCKET")) env.socket = v;
    if (const char* v = get("TPF_DISABLE")) {
        if (std::strcmp(v, "1") == 0) env.disable = true;
        else if (std::strcmp(v, "0") != 0)
            return bad("TPF_DISABLE", v,
                       "1 (keep every group off the fabric: NCCL takes a device group with a communicator, any other "
                       "open is Unavailable) and 0");
    }
    if (const char* v = get("TPF_FALLBACK")) {
        if (std::strcmp(v, "nccl") == 0) env.fallback = Fallback::Nccl;
        else if (std::strcmp(v, "error") == 0) env.fallback = Fallback::Error;
        else return bad("TPF_FALLBACK", v, "nccl, error");
    }
    if (const char* v = get("TPF_GPU_ROUTE")) {
        if (std::strcmp(v, "auto") == 0) env.gpuRoute = GpuRoute::Auto;
        else if (std::strcmp(v, "ipc") == 0) env.gpuRoute = GpuRoute::Ipc;
        else if (std::strcmp(v, "proxy") == 0) env.gpuRoute = GpuRoute::Proxy;
        else return bad("TPF_GPU_ROUTE", v, "auto, ipc, proxy");
    }
    if (const char* v = get("TPF_NCCL_ABOVE")) {
        if (std::strcmp(v, "never") == 0) env.ncclAbove = ~0ull;
        else if (auto n = parseByteSize(v)) env.ncclAbove = *n;
        else return bad("TPF_NCCL_ABOVE", v, "a byte size (4096, 64KiB, 1MiB) or never");
    }
    if (const char* v = get("TPF_GPU_LL")) {
        if (std::strcmp(v, "0") == 0) env.lowLatency = false;
        else if (std::strcmp(v, "1") != 0) return bad("TPF_GPU_LL", v, "1 (use the LL path where it fits) and 0");
    }
    if (const char* v = get("TPF_GPU_LL_CHUNKS")) {
        if (std::strcmp(v, "1") == 0 || std::strcmp(v, "2") == 0 || std::strcmp(v, "4") == 0) env.llChunks = std::uint32_t(*v - '0');
        else return bad("TPF_GPU_LL_CHUNKS", v, "1, 2, 4");
    }
    if (const char* v = get("TPF_GPU_PDL")) {
        if (std::strcmp(v, "0") == 0) env.pdl = false;
        else if (std::strcmp(v, "1") != 0)
            return bad("TPF_GPU_PDL", v, "1 (device calls use programmatic dependent launch where the GPU has it) and 0");
    }
    if (const char* v = get("TPF_GPU_POLLERS")) {
        if (v[0] >= '1' && v[0] <= '4' && v[1] == '\0') env.pollWarps = std::uint32_t(v[0] - '0');
        else return bad("TPF_GPU_POLLERS", v, "1, 2, 3, 4 (warps that poll a proxy-route flag in host memory)");
    }
    if (const char* v = get("TPF_HOST_DIRECT")) {
        if (std::strcmp(v, "0") == 0) env.hostDirect = false;
        else if (std::strcmp(v, "1") != 0)
            return bad("TPF_HOST_DIRECT", v, "1 (write same-node peers' regions directly) and 0 (the proxy carries every shard)");
    }
    return env;
}

} // namespace tpf

namespace tpf::testing {
namespace {
std::atomic<int> sabotagedRank{-1};
std::vector<std::uint32_t> nodesOfRanks; // set before any open, by test programs only
std::atomic<bool> countDeviceCalls{true};
std::atomic<std::uint16_t> announcedProtocol{bootstrap_proto::kDataProtocol};
} // namespace
void setProbeSabotage(int rank) { sabotagedRank.store(rank, std::memory_order_relaxed); }
int probeSabotage() { return sabotagedRank.load(std::memory_order_relaxed); }
void setTestNodes(std::vector<std::uint32_t> nodes) { nodesOfRanks = std::move(nodes); }
const std::vector<std::uint32_t>& testNodes() { return nodesOfRanks; }
void setDeviceStats(bool on) { countDeviceCalls.store(on, std::memory_order_relaxed); }
bool deviceStats() { return countDeviceCalls.load(std::memory_order_relaxed); }
void setDataProtocol(std::uint16_t protocol) { announcedProtocol.store(protocol, std::memory_order_relaxed); }
std::uint16_t dataProtocol() { return announcedProtocol.load(std::memory_order_relaxed); }
} // namespace tpf::testing
