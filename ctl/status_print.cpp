#include "ctl/status_print.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <iterator>
#include <optional>
#include <string_view>
#include <vector>

#include "common/byte_size.hpp"

namespace tpf::ctl {

namespace {

using json = nlohmann::ordered_json;

const std::string kNone = "-";
const json kEmptyObject = json::object();

// The member `key` of `obj`, or nullptr when obj is no object or the member is absent or null.
// Never operator[] or at(): on a const json they assert or throw.
const json* field(const json& obj, std::string_view key) {
    if (!obj.is_object()) return nullptr;
    const auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return nullptr;
    return &*it;
}

// Daemon text made safe for a one-line cell.
std::string clean(std::string_view s) {
    if (s.empty()) return kNone;
    std::string out(s);
    for (char& c : out)
        if ((unsigned char)c < 0x20 || c == 0x7f) c = '?';
    return out;
}

std::string realText(double v) {
    char buf[32];
    if (!std::isfinite(v)) return kNone;
    const double a = std::fabs(v);
    std::snprintf(buf, sizeof buf, a < 10 ? "%.2f" : a < 100 ? "%.1f" : a < 1e15 ? "%.0f" : "%.3g", v);
    return buf;
}

// Any scalar as text; absent, null, arrays and objects as "-".
std::string text(const json* v) {
    if (!v) return kNone;
    if (v->is_string()) return clean(v->get_ref<const std::string&>());
    if (v->is_boolean()) return v->get<bool>() ? "yes" : "no";
    if (v->is_number_unsigned()) return std::to_string(v->get<std::uint64_t>());
    if (v->is_number_integer()) return std::to_string(v->get<std::int64_t>());
    if (v->is_number_float()) return realText(v->get<double>());
    return kNone;
}
std::string text(const json& obj, std::string_view key) { return text(field(obj, key)); }

std::optional<double> real(const json* v) {
    if (!v || !v->is_number()) return std::nullopt;
    const double d = v->get<double>();
    if (!std::isfinite(d)) return std::nullopt;
    return d;
}

// A non-negative whole number, however the daemon typed it.
std::optional<std::uint64_t> count(const json* v) {
    if (!v) return std::nullopt;
    if (v->is_number_unsigned()) return v->get<std::uint64_t>();
    if (v->is_number_integer()) {
        const auto i = v->get<std::int64_t>();
        return i < 0 ? std::nullopt : std::optional<std::uint64_t>(std::uint64_t(i));
    }
    if (v->is_number_float()) {
        const double d = v->get<double>();
        if (d >= 0 && d < 18446744073709551616.0 && d == std::floor(d)) return std::uint64_t(d);
    }
    return std::nullopt;
}

std::string bytesApprox(const json& obj, std::string_view key) {
    const json* v = field(obj, key);
    if (auto n = count(v)) return formatBytesApprox(*n);
    return text(v);
}

std::string bytesExact(const json& obj, std::string_view key) {
    const json* v = field(obj, key);
    if (auto n = count(v)) return formatByteSize(*n);
    return text(v);
}

std::string micros(const json& obj, std::string_view key) {
    if (auto d = real(field(obj, key))) return realText(*d) + " µs";
    return text(obj, key);
}

// Terminal columns of UTF-8 text (every character one column; enough for what we print).
std::size_t columns(std::string_view s) {
    std::size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
}

class Table {
public:
    explicit Table(std::vector<std::string> headers) : rows_{std::move(headers)} {}
    void add(std::vector<std::string> row) {
        row.resize(rows_.front().size(), kNone);
        rows_.push_back(std::move(row));
    }
    void print(std::ostream& out, std::string_view indent) const {
        std::vector<std::size_t> width(rows_.front().size(), 0);
        for (const auto& r : rows_)
            for (std::size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], columns(r[c]));
        for (const auto& r : rows_) {
            std::string line(indent);
            for (std::size_t c = 0; c < r.size(); ++c) {
                line += r[c];
                if (c + 1 < r.size()) line.append(width[c] - columns(r[c]) + 2, ' ');
            }
            out << line << '\n';
        }
    }

private:
    std::vector<std::vector<std::string>> rows_;
};

// "Title: N" then the table, "Title: none" for an empty list, "Title: -" for no list.
// Returns the list to fill the table from, or nullptr when there is nothing to print.
const json* section(std::ostream& out, const json& doc, std::string_view key, std::string_view title) {
    const json* list = field(doc, key);
    out << '\n' << title << ": ";
    if (!list || !list->is_array()) {
        out << kNone << '\n';
        return nullptr;
    }
    if (list->empty()) {
        out << "none\n";
        return nullptr;
    }
    out << list->size() << '\n';
    return list;
}

void keyValue(std::ostream& out, std::string_view key, const std::string& value) {
    std::string line = "  ";
    line += key;
    line.append(key.size() < 14 ? 14 - key.size() : 1, ' ');
    out << line << value << '\n';
}

std::string startedText(const json* ns) {
    const auto v = count(ns);
    if (!v || *v == 0) return {};
    const std::time_t t = std::time_t(*v / 1000000000ull);
    std::tm tm{};
    if (!localtime_r(&t, &tm)) return {};
    char buf[64];
    if (std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S %z", &tm) == 0) return {};
    return std::string(" (since ") + buf + ")";
}

std::string proxyText(const json* proxy) {
    if (!proxy || !proxy->is_object()) return kNone;
    std::string s = text(*proxy, "state");
    const json* cpu = field(*proxy, "cpu");
    if (cpu && cpu->is_number_integer() && cpu->get<std::int64_t>() < 0) s += ", cpu not pinned";
    else s += ", cpu " + text(cpu);
    s += ", " + text(*proxy, "doorbells") + " doorbells";
    if (const json* carry = field(*proxy, "carry_threads"); carry && carry->is_number_integer())
        s += ", " + text(carry) + " carry threads (" + text(*proxy, "carry_parts") + " parts)";
    return s;
}

void printHeader(const json& doc, std::ostream& out) {
    const json* daemon = field(doc, "daemon");
    const json& d = daemon ? *daemon : kEmptyObject;
    out << "tpfabricd\n";
    keyValue(out, "version", text(d, "version"));
    keyValue(out, "pid", text(d, "pid"));
    const auto up = real(field(d, "uptime_s"));
    keyValue(out, "uptime", (up ? formatUptime(*up) : text(d, "uptime_s")) + startedText(field(d, "started_unix_ns")));
    keyValue(out, "node id", text(d, "node_id"));
    keyValue(out, "socket", text(d, "socket"));
    keyValue(out, "config", text(d, "config_source"));
    const json* wire = field(d, "peer_wire");
    keyValue(out, "peer wire", wire && wire->is_string() && wire->get<std::string>().empty() ? "none (peer.listen unset)"
                                                                                              : text(wire));
    keyValue(out, "proxy", proxyText(field(d, "proxy")));
    const json* version = field(doc, "status_version");
    if (!version || !version->is_number_integer() || version->get<std::int64_t>() != kKnownStatusVersion)
        keyValue(out, "status format", text(version) + " (this tpfabricctl reads " + std::to_string(kKnownStatusVersion) +
                                           "; what it does not know is left out: --json shows all)");
}

void printHcas(const json& doc, std::ostream& out) {
    const json* none = field(doc, "hcas_none_reason");
    const json* hcas = field(doc, "hcas");
    if (hcas && hcas->is_array() && hcas->empty() && none && none->is_string() && !none->get<std::string>().empty()) {
        const json* daemon = field(doc, "daemon");
        const json* wire = daemon ? field(*daemon, "peer_wire") : nullptr;
        const bool tcp = wire && wire->is_string() && wire->get<std::string>() == "tcp";
        out << "\nHCAs: none (" << none->get<std::string>()
            << (tcp ? "; groups spanning nodes use the tcp wire)\n" : "; this node serves groups whose ranks are all on it)\n");
        return;
    }
    const json* list = section(out, doc, "hcas", "HCAs");
    if (!list) return;
    Table t({"DEVICE", "PORT", "STATE", "GID", "GID IDX", "IP", "SUBNET", "MTU", "SPEED"});
    for (const auto& h : *list) {
        const json* speed = field(h, "speed_mbps");
        t.add({text(h, "device"), text(h, "port"), text(h, "state"), text(h, "gid"), text(h, "gid_index"),
               text(h, "ip"), text(h, "subnet"), text(h, "mtu"), count(speed) ? formatSpeed(*count(speed)) : text(speed)});
    }
    t.print(out, "  ");
}

void printPeers(const json& doc, std::ostream& out) {
    const json* list = section(out, doc, "peers", "Peers");
    if (!list) return;
    // One link per group and other node; its queue pairs (verbs) or its data link (tcp) below it.
    for (const auto& p : *list) {
        const json* qps = field(p, "qps");
        const json* wire = field(p, "wire");
        const bool tcpWire = wire && wire->is_string() && wire->get<std::string>() == "tcp";
        const std::string qpCount = tcpWire ? kNone : qps && qps->is_array() ? std::to_string(qps->size()) : text(qps);
        Table t({"NODE", "ENDPOINT", "ROLE", "RANKS", "STATE", "WIRE", "QPS", "GROUP", "LAST ERROR"});
        t.add({text(p, "node_id"), text(p, "endpoint"), text(p, "role"), text(p, "ranks"), text(p, "state"),
               text(p, "wire"), qpCount, text(p, "group").substr(0, 12), text(p, "last_error")});
        t.print(out, "  ");
        if (const json* tcp = field(p, "tcp"); tcp && tcp->is_object()) {
            Table d({"SENT", "FRAMES SENT", "RECEIVED", "FRAMES RECEIVED", "SEND BUFFER", "FAILED"});
            d.add({bytesApprox(*tcp, "sent_bytes"), text(*tcp, "frames_sent"), bytesApprox(*tcp, "received_bytes"),
                   text(*tcp, "frames_received"), bytesExact(*tcp, "send_buffer"), text(*tcp, "failed")});
            d.print(out, "    ");
        }
        if (!qps || !qps->is_array() || qps->empty()) continue;
        Table q({"LOCAL", "REMOTE", "RAIL", "HCA", "QPN", "REMOTE QPN", "POSTS", "INFLIGHT CAP", "HIGH WATER"});
        for (const auto& x : *qps)
            q.add({text(x, "local_rank"), text(x, "remote_rank"), text(x, "rail"), text(x, "hca"), text(x, "qpn"),
                   text(x, "remote_qpn"), text(x, "posts"), text(x, "inflight_cap"), text(x, "inflight_high_water")});
        q.print(out, "    ");
    }
}

void printRanks(const json& g, std::ostream& out) {
    const json* ranks = field(g, "ranks");
    if (!ranks || !ranks->is_array() || ranks->empty()) {
        out << "    ranks: " << (ranks && ranks->is_array() ? "none" : kNone) << '\n';
        return;
    }
    // Device groups: each local rank's routes to its peers ("1:ipc 2:proxy") and its device region.
    bool device = false;
    for (const auto& r : *ranks) device |= field(r, "routes") || field(r, "device_bytes");
    Table t(device ? std::vector<std::string>{"RANK", "LOCAL", "PID", "UID", "ROUTE", "PEER ROUTES", "DEVICE REGION"}
                   : std::vector<std::string>{"RANK", "LOCAL", "PID", "UID", "ROUTE"});
    for (const auto& r : *ranks) {
        // A host group's local rank: whether it exchanges shards with its
        // host-direct peers itself ("direct") or through the daemon's proxy.
        std::string route = text(r, "route");
        if (const json* d = field(r, "host_direct"); d && d->is_boolean()) route += d->get<bool>() ? " (direct)" : " (proxy)";
        std::vector<std::string> row{text(r, "rank"), text(r, "local"), text(r, "pid"), text(r, "uid"), route};
        if (device) {
            std::string peers;
            const json* routes = field(r, "routes");
            if (routes && routes->is_array())
                for (std::size_t q = 0; q < routes->size(); ++q)
                    if (text(&(*routes)[q]) != "self") peers += (peers.empty() ? "" : " ") + std::to_string(q) + ":" + text(&(*routes)[q]);
            row.push_back(peers.empty() ? kNone : peers);
            row.push_back(bytesApprox(r, "device_bytes"));
        }
        t.add(std::move(row));
    }
    t.print(out, "    ");
}

void printGroups(const json& doc, std::ostream& out) {
    const json* list = section(out, doc, "groups", "Groups");
    if (!list) return;
    for (const auto& g : *list) {
        const json* latency = field(g, "latency_us");
        const json& lat = latency ? *latency : kEmptyObject;
        out << "  " << text(g, "id") << '\n';
        out << "    world " << text(g, "world") << ", state " << text(g, "state");
        if (field(g, "buffers"))
            out << ", " << text(g, "buffers") << " buffers" << (text(g, "proxy_polls") == "yes" ? " (the proxy polls their rings)" : "");
        out << ", agreed cap "
            << bytesExact(g, "agreed_cap") << " (slot " << bytesExact(g, "slot_bytes") << "), stripes "
            << text(g, "stripes") << '\n';
        out << "    calls " << text(g, "calls") << ", bytes " << bytesApprox(g, "bytes") << ", errors " << text(g, "errors");
        const auto isNull = [&](const char* key) { return lat.is_object() && lat.contains(key) && lat.find(key)->is_null(); };
        if (isNull("p50") && isNull("p99")) // the daemon timed no call: never shown as 0
            out << ", latency not measured ("
                << (text(g, "buffers") == "device" ? "device calls are not timed" : "no call completed yet") << ")\n";
        else
            out << ", latency p50 " << micros(lat, "p50") << ", p99 " << micros(lat, "p99") << '\n';
        if (const json* n = field(g, "nccl_calls"); n && n->is_number_unsigned() && n->get<std::uint64_t>() > 0)
            out << "    handed to NCCL (above the agreed cap): calls " << text(g, "nccl_calls") << ", bytes "
                << bytesApprox(g, "nccl_bytes") << '\n';
        out << "    last error " << text(g, "last_error") << '\n';
        if (const json* a = field(g, "adoption"); a && a->is_object()) {
            const json* gap = field(*a, "gap_ms");
            if (gap && gap->is_number()) {
                char ms[32];
                std::snprintf(ms, sizeof ms, "%.1f", gap->get<double>());
                out << "    re-adopted after a daemon restart: gap " << ms
                    << " ms (from its ranks losing the old daemon to every rank re-adopted)\n";
            }
            else
                out << "    re-adopting after a daemon restart: waiting for every local rank to ask\n";
        }
        printRanks(g, out);
    }
}

void printTotals(const json& doc, std::ostream& out) {
    const json* regions = field(doc, "regions");
    out << '\n';
    if (regions && regions->is_object())
        out << "Regions: " << text(*regions, "count") << " (host " << bytesApprox(*regions, "host_bytes") << ", device "
            << bytesApprox(*regions, "device_bytes") << ")\n";
    else
        out << "Regions: " << kNone << '\n';
    out << "Clients: " << text(doc, "clients") << '\n';
}

} // namespace

std::string formatUptime(double seconds) {
    if (!std::isfinite(seconds) || seconds < 0) return kNone;
    char buf[64];
    if (seconds < 60) {
        std::snprintf(buf, sizeof buf, "%.1fs", seconds);
        return buf;
    }
    const auto s = static_cast<unsigned long long>(seconds);
    if (s < 3600) std::snprintf(buf, sizeof buf, "%llum %02llus", s / 60, s % 60);
    else if (s < 86400) std::snprintf(buf, sizeof buf, "%lluh %02llum %02llus", s / 3600, s / 60 % 60, s % 60);
    else std::snprintf(buf, sizeof buf, "%llud %02lluh %02llum", s / 86400, s / 3600 % 24, s / 60 % 60);
    return buf;
}

std::string formatSpeed(std::uint64_t mbps) {
    char buf[48];
    if (mbps < 1000) std::snprintf(buf, sizeof buf, "%llu Mb/s", (unsigned long long)mbps);
    else if (mbps % 1000 == 0) std::snprintf(buf, sizeof buf, "%llu Gb/s", (unsigned long long)(mbps / 1000));
    else std::snprintf(buf, sizeof buf, "%.1f Gb/s", double(mbps) / 1000.0);
    return buf;
}

std::string formatBytesApprox(std::uint64_t bytes) {
    static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (bytes < 1024) return std::to_string(bytes) + "B";
    double v = double(bytes) / 1024.0;
    std::size_t u = 0;
    while (v >= 1024.0 && u + 1 < std::size(kUnits)) {
        v /= 1024.0;
        ++u;
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f%s", v, kUnits[u]);
    return buf;
}

void printStatus(const json& doc, std::ostream& out) {
    printHeader(doc, out);
    printHcas(doc, out);
    printPeers(doc, out);
    printGroups(doc, out);
    printTotals(doc, out);
}

} // namespace tpf::ctl
