// HCA selection (daemon/verbs/hca_select.hpp) and the text forms of daemon/verbs/hca.hpp,
// built with and without verbs.
#include "daemon/verbs/hca_select.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <tuple>

#include "common/quoted.hpp"
#include "daemon/verbs/hca.hpp"
#include "proto/layout.hpp"

namespace tpf::daemon {
namespace {

using Gid = std::array<std::uint8_t, 16>;

constexpr std::uint32_t kPortActive = 4; // IBV_PORT_ACTIVE

bool linkLocal(const Gid& g) { return g[0] == 0xfe && (g[1] & 0xc0) == 0x80; }

std::string ipText(const Gid& g) {
    char buf[INET6_ADDRSTRLEN] = {};
    if (isIpv4Mapped(g)) ::inet_ntop(AF_INET, g.data() + 12, buf, sizeof buf);
    else ::inet_ntop(AF_INET6, g.data(), buf, sizeof buf);
    return buf;
}

std::string portName(const CandidatePort& p) { return p.device + ":" + std::to_string(p.port); }

// The addresses a port is chosen with when it is named or taken by default.
std::vector<const PortAddress*> usableAddresses(const CandidatePort& p) {
    std::vector<const PortAddress*> v4, v6;
    for (const auto& a : p.addresses) {
        if (isIpv4Mapped(a.gid)) v4.push_back(&a);
        else if (!linkLocal(a.gid)) v6.push_back(&a);
    }
    return v4.empty() ? v6 : v4;
}

// Why no address of a port can be chosen, or "" when it can serve.
std::string unfit(const CandidatePort& p) {
    if (!p.ethernet) return portName(p) + " is InfiniBand, not RoCE (link layer Ethernet)";
    if (p.device.size() >= sizeof(client_proto::HcaCard::device))
        return portName(p) + ": device name longer than 15 bytes does not fit the node card";
    return {};
}

// Why a port named or taken by default gives no card, or "" when it gives some.
std::string unusable(const CandidatePort& p) {
    if (std::string u = unfit(p); !u.empty()) return u;
    if (usableAddresses(p).empty()) return portName(p) + " has no RoCE v2 GID of an IPv4 or global IPv6 address";
    return {};
}

std::string deviceList(std::span<const CandidatePort> ports) {
    std::vector<std::string> names;
    for (const auto& p : ports)
        if (std::find(names.begin(), names.end(), p.device) == names.end()) names.push_back(p.device);
    std::string out;
    for (const auto& n : names) out += (out.empty() ? "devices: " : ", ") + n;
    return out.empty() ? "no RDMA devices at all" : out;
}

std::string stateNote(const CandidatePort& p) { return portName(p) + " is " + portStateName(p.state); }

/// One parsed entry of verbs.hcas, $TPF_HCA or $NCCL_IB_HCA.
struct Entry {
    std::string text;       ///< as written, for messages
    std::optional<Gid> ip;  ///< an IP literal
    std::string name;       ///< else a device name (or NCCL prefix)
    std::uint32_t port = 0; ///< 0 = every port
};

Result<Entry> parseEntry(std::string_view text, std::string_view source, bool allowIp) {
    Entry e;
    e.text = std::string(text);
    const auto bad = [&](const std::string& why) -> Result<Entry> {
        return {Errc::ConfigError, std::string(source) + " entry " + quote(text) + ": " + why};
    };
    const std::string s(text);
    if (allowIp) {
        Gid g{};
        if (::inet_pton(AF_INET, s.c_str(), g.data() + 12) == 1) {
            g[10] = g[11] = 0xff;
            e.ip = g;
            return e;
        }
        if (::inet_pton(AF_INET6, s.c_str(), g.data()) == 1) {
            e.ip = g;
            return e;
        }
    }
    const auto colon = s.find(':');
    e.name = s.substr(0, colon);
    if (e.name.empty()) return bad("no device name; write a name (\"mlx5_0\"), \"name:port\"" +
                                   std::string(allowIp ? " or an IP address" : ""));
    if (colon != std::string::npos) {
        const std::string p = s.substr(colon + 1);
        const bool digits = !p.empty() && p.size() <= 3 && p.find_first_not_of("0123456789") == std::string::npos;
        const unsigned long n = digits ? std::stoul(p) : 0;
        if (n < 1 || n > 255) return bad("port " + quote(p) + " is not a number from 1 to 255");
        e.port = std::uint32_t(n);
    }
    return e;
}

// A comma list; blanks around items and empty items are ignored.
std::vector<std::string> splitList(std::string_view s) {
    std::vector<std::string> out;
    while (true) {
        const auto comma = s.find(',');
        std::string_view item = s.substr(0, comma);
        const auto b = item.find_first_not_of(" \t");
        const auto e = item.find_last_not_of(" \t");
        if (b != std::string_view::npos) out.emplace_back(item.substr(b, e - b + 1));
        if (comma == std::string_view::npos) return out;
        s.remove_prefix(comma + 1);
    }
}

bool blank(const std::optional<std::string>& v) {
    return !v || v->find_first_not_of(" \t,") == std::string::npos;
}

/// Collects cards in order, each (device, port, GID index) once.
class Chooser {
public:
    void add(const CandidatePort& p, const PortAddress& a) {
        if (seen_.insert({p.device, p.port, a.gidIndex}).second) sel_.hcas.push_back(makeHcaCard(p, a));
    }
    void addUsable(const CandidatePort& p) {
        for (const PortAddress* a : usableAddresses(p)) add(p, *a);
    }
    void warn(std::string w) { sel_.warnings.push_back(std::move(w)); }
    std::size_t count() const { return sel_.hcas.size(); }

    Result<HcaSelection> finish(HcaSource source, const std::vector<std::string>& misses) {
        sel_.source = source;
        if (sel_.hcas.empty()) {
            std::string why;
            for (const auto& m : misses) why += (why.empty() ? "" : "; ") + m;
            const std::string what = source == HcaSource::AllActive
                                         ? "no ACTIVE RoCE port with an IP address"
                                         : "no HCA chosen by " + std::string(hcaSourceName(source));
            return {Errc::Unavailable, what + (why.empty() ? std::string() : ": " + why)};
        }
        if (sel_.hcas.size() > kMaxStripes) {
            std::string dropped;
            for (std::size_t i = kMaxStripes; i < sel_.hcas.size(); ++i) {
                std::string dev;
                getText(sel_.hcas[i].device, dev);
                dropped += (dropped.empty() ? "" : ", ") + dev + ":" + std::to_string(sel_.hcas[i].port) + " " +
                           hcaIp(sel_.hcas[i]);
            }
            warn(std::to_string(sel_.hcas.size()) + " HCAs chosen by " + std::string(hcaSourceName(source)) +
                 ", at most " + std::to_string(kMaxStripes) + " are served; dropped " + dropped +
                 " (name the ones to use in verbs.hcas)");
            sel_.hcas.resize(kMaxStripes);
        }
        return std::move(sel_);
    }

private:
    HcaSelection sel_;
    std::set<std::tuple<std::string, std::uint32_t, std::uint32_t>> seen_;
};

// verbs.hcas / $TPF_HCA: exact names, name:port, IPs; named ports in any state.
Result<HcaSelection> byEntries(std::span<const CandidatePort> ports, const std::vector<std::string>& texts,
                               HcaSource source) {
    const std::string src(hcaSourceName(source));
    std::vector<Entry> entries;
    for (const auto& t : texts) {
        auto e = parseEntry(t, src, true);
        if (!e) return e.error();
        entries.push_back(std::move(*e));
    }
    Chooser c;
    std::vector<std::string> misses;
    for (const auto& e : entries) {
        bool matched = false;
        std::vector<std::string> why;
        const auto notActive = [&](const CandidatePort& p) {
            if (p.state != kPortActive)
                c.warn(src + " entry " + quote(e.text) + ": " + stateNote(p) +
                       "; listed, but it carries no traffic until ACTIVE");
        };
        if (e.ip) {
            for (const auto& p : ports)
                for (const auto& a : p.addresses) {
                    if (a.gid != *e.ip) continue;
                    if (std::string u = unfit(p); !u.empty()) {
                        why.push_back(u);
                    } else if (linkLocal(a.gid)) {
                        why.push_back(portName(p) + " GID " + std::to_string(a.gidIndex) +
                                      " is link-local, the same subnet on every rail; name a routable address");
                    } else {
                        matched = true;
                        c.add(p, a);
                        notActive(p);
                    }
                }
            if (!matched && why.empty()) why.push_back("no port has a RoCE v2 GID of " + ipText(*e.ip));
        } else {
            bool device = false, port = false;
            for (const auto& p : ports) {
                if (p.device != e.name) continue;
                device = true;
                if (e.port && p.port != e.port) continue;
                port = true;
                if (std::string u = unusable(p); !u.empty()) {
                    why.push_back(u);
                    continue;
                }
                matched = true;
                c.addUsable(p);
                notActive(p);
            }
            if (!device) why.push_back("no RDMA device of that name (" + deviceList(ports) + ")");
            else if (!port) why.push_back(e.name + " has no port " + std::to_string(e.port));
        }
        if (!matched) {
            std::string w = src + " entry " + quote(e.text) + " matched no HCA port: ";
            for (std::size_t i = 0; i < why.size(); ++i) w += (i ? "; " : "") + why[i];
            c.warn(w);
            misses.push_back(w);
        }
    }
    return c.finish(source, misses);
}

bool ncclMatch(const Entry& e, const CandidatePort& p, bool exact) {
    if (e.port && e.port != p.port) return false;
    return exact ? p.device == e.name : p.device.compare(0, e.name.size(), e.name) == 0;
}

// $NCCL_IB_HCA as NCCL reads it; like NCCL, ACTIVE ports only.
Result<HcaSelection> byNccl(std::span<const CandidatePort> ports, std::string_view spec) {
    const std::string src(hcaSourceName(HcaSource::NcclIbHca));
    std::string_view s = spec;
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    const bool exclude = !s.empty() && s.front() == '^';
    if (exclude) s.remove_prefix(1);
    const bool exact = !s.empty() && s.front() == '=';
    if (exact) s.remove_prefix(1);
    std::vector<Entry> entries;
    for (const auto& t : splitList(s)) {
        auto e = parseEntry(t, src, false);
        if (!e) return e.error();
        entries.push_back(std::move(*e));
    }
    if (entries.empty())
        return {Errc::ConfigError, src + " " + quote(spec) + " names no device; unset it or write e.g. \"mlx5_0:1,mlx5_1:1\""};

    Chooser c;
    std::vector<std::string> misses;
    std::vector<std::string> skipped; // ports that matched but cannot serve
    for (const auto& p : ports) {
        const bool hit = std::any_of(entries.begin(), entries.end(), [&](const Entry& e) { return ncclMatch(e, p, exact); });
        if (hit == exclude) continue;
        if (std::string u = unusable(p); !u.empty()) skipped.push_back(u);
        else if (p.state != kPortActive) skipped.push_back(stateNote(p));
        else c.addUsable(p);
    }
    for (const auto& e : entries) {
        if (std::any_of(ports.begin(), ports.end(), [&](const CandidatePort& p) { return ncclMatch(e, p, exact); }))
            continue;
        // The entry as written, with the list's '^' and '=': an exclusion that matches nothing excludes nothing.
        std::string w = src + " entry " + quote(std::string(exclude ? "^" : "") + (exact ? "=" : "") + e.text) +
                        " matched no HCA port" + (exclude ? ", so it excludes nothing" : "");
        c.warn(w);
        misses.push_back(w);
    }
    if (c.count() == 0)
        for (const auto& sk : skipped) misses.push_back(sk);
    return c.finish(HcaSource::NcclIbHca, misses);
}

} // namespace

std::string_view hcaSourceName(HcaSource s) {
    switch (s) {
    case HcaSource::Config: return "verbs.hcas";
    case HcaSource::TpfHca: return "TPF_HCA";
    case HcaSource::NcclIbHca: return "NCCL_IB_HCA";
    case HcaSource::AllActive: return "every ACTIVE RoCE port";
    }
    return "?";
}

bool isIpv4Mapped(const std::array<std::uint8_t, 16>& gid) {
    return std::all_of(gid.begin(), gid.begin() + 10, [](std::uint8_t b) { return b == 0; }) && gid[10] == 0xff &&
           gid[11] == 0xff;
}

client_proto::HcaCard makeHcaCard(const CandidatePort& port, const PortAddress& address) {
    client_proto::HcaCard card{};
    std::memcpy(card.gid, address.gid.data(), 16);
    const bool v4 = isIpv4Mapped(address.gid);
    const unsigned prefix = std::min<unsigned>(v4 ? 96u + std::min<unsigned>(address.ipPrefixLen, 32u)
                                                   : address.ipPrefixLen, 128u);
    for (unsigned i = 0; i < 16; ++i) {
        const unsigned keep = prefix > i * 8 ? std::min(prefix - i * 8, 8u) : 0u;
        card.subnet[i] = std::uint8_t(address.gid[i] & std::uint8_t(0xff00u >> keep));
    }
    setText(card.device, port.device);
    card.port = port.port;
    card.prefixLen = std::uint8_t(prefix);
    card.mtu = port.mtu;
    card.speedMbps = port.speedMbps;
    card.state = port.state;
    card.gidIndex = address.gidIndex;
    return card;
}

Result<HcaSelection> selectHcas(std::span<const CandidatePort> ports, const HcaRequest& request) {
    if (!request.config.empty()) return byEntries(ports, request.config, HcaSource::Config);
    if (!blank(request.tpfHca)) return byEntries(ports, splitList(*request.tpfHca), HcaSource::TpfHca);
    if (!blank(request.ncclIbHca)) return byNccl(ports, *request.ncclIbHca);

    Chooser c;
    std::vector<std::string> why;
    for (const auto& p : ports) {
        if (std::string u = unusable(p); !u.empty()) why.push_back(u);
        else if (p.state != kPortActive) why.push_back(stateNote(p));
        else c.addUsable(p);
    }
    if (ports.empty()) why.push_back("no RDMA device found");
    return c.finish(HcaSource::AllActive, why);
}

// ---- daemon/verbs/hca.hpp text forms ------------------------------------------

std::string portStateName(std::uint32_t state) {
    static constexpr const char* kNames[] = {"NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"};
    if (state < std::size(kNames)) return kNames[state];
    return "UNKNOWN(" + std::to_string(state) + ")";
}

std::string gidText(const std::uint8_t (&gid)[16]) {
    char buf[INET6_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET6, gid, buf, sizeof buf);
    return buf;
}

std::string hcaIp(const client_proto::HcaCard& card) {
    Gid g;
    std::memcpy(g.data(), card.gid, 16);
    return ipText(g);
}

HcaAddress hcaAddress(const client_proto::HcaCard& card) {
    HcaAddress a;
    std::memcpy(a.gid.data(), card.gid, 16);
    std::memcpy(a.subnet.data(), card.subnet, 16);
    a.prefixLen = card.prefixLen;
    return a;
}

std::string hcaSubnetText(const client_proto::HcaCard& card) { return subnetText(hcaAddress(card)); }

} // namespace tpf::daemon
