// HCA discovery with libibverbs: every port of every device, its state, MTU
// and speed, its RoCE v2 GIDs and the IP prefix of each (getifaddrs on the
// GID's netdev); then selectHcas (daemon/verbs/hca_select.hpp) decides.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <infiniband/verbs.h>
#include <net/if.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>

#include "daemon/verbs/hca.hpp"
#include "daemon/verbs/hca_select.hpp"
#include "daemon/verbs/verbs_check.hpp"

namespace tpf::daemon {
namespace {

using Gid = std::array<std::uint8_t, 16>;

/// One address of an interface, as getifaddrs reports it.
struct IfAddress {
    unsigned ifindex = 0;
    Gid gid{};              ///< IPv4-mapped for IPv4
    std::uint8_t prefix = 0; ///< of the IP: 0..32 or 0..128
};

unsigned prefixOf(const std::uint8_t* mask, std::size_t bytes) {
    unsigned n = 0;
    for (std::size_t i = 0; i < bytes; ++i) n += unsigned(std::popcount(mask[i]));
    return n;
}

Result<std::vector<IfAddress>> interfaceAddresses() {
    ifaddrs* list = nullptr;
    if (::getifaddrs(&list) != 0)
        return {Errc::SystemError, std::string("getifaddrs: ") + std::strerror(errno)};
    std::unique_ptr<ifaddrs, void (*)(ifaddrs*)> guard(list, ::freeifaddrs);
    std::vector<IfAddress> out;
    for (const ifaddrs* a = list; a; a = a->ifa_next) {
        if (!a->ifa_addr || !a->ifa_netmask) continue;
        IfAddress ia;
        // An IPv4 alias is listed as "eth0:1"; its index is eth0's.
        std::string name = a->ifa_name ? a->ifa_name : "";
        ia.ifindex = ::if_nametoindex(name.substr(0, name.find(':')).c_str());
        if (a->ifa_addr->sa_family == AF_INET) {
            const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
            const auto* mask = reinterpret_cast<const sockaddr_in*>(a->ifa_netmask);
            ia.gid[10] = ia.gid[11] = 0xff;
            std::memcpy(ia.gid.data() + 12, &in->sin_addr, 4);
            ia.prefix = std::uint8_t(prefixOf(reinterpret_cast<const std::uint8_t*>(&mask->sin_addr), 4));
        } else if (a->ifa_addr->sa_family == AF_INET6) {
            const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a->ifa_addr);
            const auto* mask = reinterpret_cast<const sockaddr_in6*>(a->ifa_netmask);
            std::memcpy(ia.gid.data(), &in6->sin6_addr, 16);
            ia.prefix = std::uint8_t(prefixOf(reinterpret_cast<const std::uint8_t*>(&mask->sin6_addr), 16));
        } else {
            continue;
        }
        out.push_back(ia);
    }
    return out;
}

// The prefix of the IP behind a GID: on the GID's own netdev first, else on any.
std::optional<std::uint8_t> ipPrefix(const std::vector<IfAddress>& addrs, const Gid& gid, unsigned ifindex) {
    for (const auto& a : addrs)
        if (a.gid == gid && ifindex && a.ifindex == ifindex) return a.prefix;
    for (const auto& a : addrs)
        if (a.gid == gid) return a.prefix;
    return std::nullopt;
}

std::uint16_t mtuBytes(ibv_mtu m) { return m >= IBV_MTU_256 && m <= IBV_MTU_4096 ? std::uint16_t(128u << m) : 0; }

// Mb/s per lane for active_speed, lanes for active_width (IBTA encodings).
std::uint32_t speedMbps(std::uint8_t speed, std::uint8_t width) {
    std::uint32_t lane = 0, lanes = 0;
    switch (speed) {
    case 1: lane = 2500; break;    // SDR
    case 2: lane = 5000; break;    // DDR
    case 4: lane = 10000; break;   // QDR
    case 8: lane = 10000; break;   // FDR10
    case 16: lane = 14000; break;  // FDR
    case 32: lane = 25000; break;  // EDR
    case 64: lane = 50000; break;  // HDR
    case 128: lane = 100000; break; // NDR
    }
    switch (width) {
    case 1: lanes = 1; break;
    case 2: lanes = 4; break;
    case 4: lanes = 8; break;
    case 8: lanes = 12; break;
    case 16: lanes = 2; break;
    }
    return lane * lanes;
}

// Every RoCE v2 entry of the device's GID table (all ports), with its netdev.
std::vector<ibv_gid_entry> roceV2Gids(ibv_context* ctx, const std::string& dev, std::uint8_t ports, std::size_t tableLen) {
    std::vector<ibv_gid_entry> all(tableLen);
    ssize_t n = tableLen ? ibv_query_gid_table(ctx, all.data(), all.size(), 0) : 0;
    if (n < 0) {
        // Older kernels lack the table ioctl: ask entry by entry (empty ones answer ENODATA).
        spdlog::debug("verbs: ibv_query_gid_table({}): {}; querying GIDs one by one", dev, std::strerror(int(-n)));
        all.clear();
        for (std::uint8_t p = 1; p <= ports; ++p) {
            ibv_port_attr pa{};
            if (!TPF_VERBS(Errc::SystemError, ibv_query_port(ctx, p, &pa))) continue;
            for (int i = 0; i < pa.gid_tbl_len; ++i) {
                ibv_gid_entry e{};
                if (ibv_query_gid_ex(ctx, p, std::uint32_t(i), &e, 0) == 0) all.push_back(e);
            }
        }
        n = ssize_t(all.size());
    }
    all.resize(std::size_t(n));
    std::erase_if(all, [](const ibv_gid_entry& e) { return e.gid_type != IBV_GID_TYPE_ROCE_V2; });
    return all;
}

// The ports of one device; a device that cannot be opened or queried is logged and skipped.
void devicePorts(ibv_device* device, const std::vector<IfAddress>& addrs, std::vector<CandidatePort>& out) {
    const std::string dev = ibv_get_device_name(device);
    std::unique_ptr<ibv_context, int (*)(ibv_context*)> ctx(ibv_open_device(device), ibv_close_device);
    if (!ctx) {
        spdlog::warn("HCA {}: ibv_open_device failed ({}); skipped. Check /dev/infiniband permissions and the driver",
                     dev, std::strerror(errno ? errno : EIO));
        return;
    }
    ibv_device_attr attr{};
    if (auto s = TPF_VERBS(Errc::SystemError, ibv_query_device(ctx.get(), &attr)); !s) {
        spdlog::warn("HCA {}: skipped: {}", dev, s.error().describe());
        return;
    }
    std::vector<std::pair<std::uint8_t, ibv_port_attr>> portAttrs;
    std::size_t tableLen = 0;
    for (std::uint8_t p = 1; p <= attr.phys_port_cnt && p != 0; ++p) {
        ibv_port_attr pa{};
        if (auto s = TPF_VERBS(Errc::SystemError, ibv_query_port(ctx.get(), p, &pa)); !s) {
            spdlog::warn("HCA {} port {}: skipped: {}", dev, p, s.error().describe());
            continue;
        }
        portAttrs.emplace_back(p, pa);
        tableLen += std::size_t(pa.gid_tbl_len);
    }
    const auto gids = roceV2Gids(ctx.get(), dev, attr.phys_port_cnt, tableLen);
    for (const auto& [p, pa] : portAttrs) {
        CandidatePort cp;
        cp.device = dev;
        cp.port = p;
        cp.state = pa.state;
        cp.ethernet = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
        cp.mtu = mtuBytes(pa.active_mtu);
        cp.speedMbps = speedMbps(pa.active_speed, pa.active_width);
        for (const auto& e : gids) {
            if (e.port_num != p) continue;
            Gid g;
            std::memcpy(g.data(), e.gid.raw, 16);
            const auto prefix = ipPrefix(addrs, g, e.ndev_ifindex);
            if (!prefix) {
                spdlog::debug("HCA {}:{} GID[{}] {}: no interface holds this address; not used", dev, p, e.gid_index,
                              gidText(e.gid.raw));
                continue;
            }
            cp.addresses.push_back({g, e.gid_index, *prefix});
        }
        out.push_back(std::move(cp));
    }
}

Result<std::vector<CandidatePort>> findPorts() {
    std::vector<CandidatePort> ports;
    int n = 0;
    errno = 0;
    std::unique_ptr<ibv_device*, void (*)(ibv_device**)> list(ibv_get_device_list(&n), ibv_free_device_list);
    if (!list) {
        // ENOSYS: the kernel has no RDMA support; that is "no devices", not a failure.
        if (errno == ENOSYS || errno == 0) return ports;
        return {Errc::SystemError, std::string("ibv_get_device_list: ") + std::strerror(errno)};
    }
    if (n == 0) return ports;
    auto addrs = interfaceAddresses();
    if (!addrs) return addrs.error();
    for (int i = 0; i < n; ++i) devicePorts(list.get()[i], *addrs, ports);
    std::sort(ports.begin(), ports.end(), [](const CandidatePort& a, const CandidatePort& b) {
        return a.device != b.device ? a.device < b.device : a.port < b.port;
    });
    return ports;
}

std::optional<std::string> env(const char* name) {
    const char* v = std::getenv(name);
    if (!v) return std::nullopt;
    return std::string(v);
}

} // namespace

std::vector<client_proto::HcaCard> discoverHcas(const DaemonConfig& cfg, std::string* noneWhy) {
    if (noneWhy) noneWhy->clear();
    auto ports = findPorts();
    if (!ports) {
        spdlog::error("HCA discovery failed: {}; {}", ports.error().describe(), withoutHcas(cfg));
        if (noneWhy) *noneWhy = "HCA discovery failed: " + ports.error().describe();
        return {};
    }
    const HcaRequest request{cfg.hcas, env("TPF_HCA"), env("NCCL_IB_HCA")};
    auto sel = selectHcas(*ports, request);
    if (!sel) {
        // By default, no RoCE port is an ordinary machine; a selection that finds nothing is a mistake.
        const bool asked = !request.config.empty() || (request.tpfHca && !request.tpfHca->empty()) ||
                           (request.ncclIbHca && !request.ncclIbHca->empty());
        const auto level = sel.code() == Errc::ConfigError ? spdlog::level::err
                           : asked                          ? spdlog::level::warn
                                                            : spdlog::level::info;
        spdlog::log(level, "HCAs: none: {}; {}", sel.error().describe(), withoutHcas(cfg));
        if (noneWhy) *noneWhy = sel.error().describe();
        return {};
    }
    for (const auto& w : sel->warnings) spdlog::warn("HCAs: {}", w);
    for (const auto& h : sel->hcas) {
        std::string dev;
        getText(h.device, dev);
        spdlog::info("HCA {} port {}: {}, GID[{}] {} ({} in {}), MTU {}, {} Mb/s (chosen by {})", dev, h.port,
                     portStateName(h.state), h.gidIndex, gidText(h.gid), hcaIp(h), hcaSubnetText(h), h.mtu,
                     h.speedMbps, hcaSourceName(sel->source));
    }
    return sel->hcas;
}

std::uint32_t livePortState(const client_proto::HcaCard& card) {
    std::string dev;
    if (!getText(card.device, dev) || dev.empty() || dev.find('/') != std::string::npos) return card.state;
    // "4: ACTIVE"
    std::ifstream f("/sys/class/infiniband/" + dev + "/ports/" + std::to_string(card.port) + "/state");
    std::uint32_t state = 0;
    if (f >> state) return state;
    return card.state;
}

} // namespace tpf::daemon
