// `tpfabricctl status` human form (ctl/status_print.hpp): the example document
// of docs/status.md, documents with fields missing, of the wrong type, from a
// newer daemon, and JSON values that are no document at all.
#include <sstream>
#include <string>
#include <vector>

#include "catch.hpp"
#include "ctl/status_print.hpp"

using json = nlohmann::ordered_json;
using namespace tpf::ctl;

namespace {

// The example of docs/status.md, verbatim.
constexpr const char* kExample = R"json({
  "status_version": 2,
  "daemon": {
    "version": "0.1.0", "pid": 1234, "uptime_s": 12.5, "started_unix_ns": 0,
    "node_id": "32 hex digits", "socket": "/run/tpfabric/tpfabricd.sock",
    "config_source": "built-in defaults", "peer_wire": "verbs|tcp|",
    "proxy": {"state": "sleeping|polling", "cpu": -1, "doorbells": 0}
  },
  "hcas": [
    {"device": "rxe0", "port": 1, "state": "ACTIVE", "gid": "::ffff:10.77.0.1", "gid_index": 1,
     "ip": "10.77.0.1", "subnet": "10.77.0.0/24", "mtu": 1024, "speed_mbps": 10000}
  ],
  "peers": [
    {"group": "32 hex digits", "node_id": "hex", "endpoint": "10.77.0.2:18515", "role": "connect|accept",
     "ranks": "1,3", "state": "connecting|handshake|negotiating|ready|waiting|failed|closed", "wire": "verbs",
     "qps": [{"local_rank": 0, "remote_rank": 1, "rail": 0, "hca": "rxe0", "qpn": 17, "remote_qpn": 18,
              "posts": 2000, "inflight_cap": 1048576, "inflight_high_water": 65544}],
     "tcp": null, "last_error": ""},
    {"group": "32 hex digits", "node_id": "hex", "endpoint": "127.0.0.1:18516", "role": "accept",
     "ranks": "2", "state": "ready", "wire": "tcp", "qps": [],
     "tcp": {"sent_bytes": 4096, "received_bytes": 8192, "frames_sent": 2, "frames_received": 4,
             "send_buffer": 4194304, "failed": ""},
     "last_error": ""}
  ],
  "groups": [
    {"id": "32 hex digits", "world": 4, "state": "pending|negotiating|open|broken",
     "agreed_cap": 524288, "slot_bytes": 528384, "stripes": 1,
     "ranks": [{"rank": 0, "local": true, "pid": 4321, "uid": 1000, "route": "shm", "host_direct": true},
               {"rank": 1, "local": true, "pid": 4322, "uid": 1000, "route": "shm", "host_direct": false}],
     "calls": 2000, "bytes": 8192000, "errors": 0,
     "latency_us": {"p50": 12.0, "p99": 40.0},
     "last_error": ""}
  ],
  "regions": {"count": 2, "host_bytes": 8462336, "device_bytes": 0},
  "clients": 5
})json";

std::string render(const json& doc) {
    std::ostringstream out;
    printStatus(doc, out);
    return out.str();
}

bool has(const std::string& out, const std::string& part) { return out.find(part) != std::string::npos; }

std::vector<std::string> linesOf(const std::string& s) {
    std::vector<std::string> lines;
    std::istringstream in(s);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    return lines;
}

// The line that contains `part`, or "" when none does.
std::string lineWith(const std::string& out, const std::string& part) {
    for (const auto& l : linesOf(out))
        if (has(l, part)) return l;
    return {};
}

} // namespace

TEST_CASE("the example document of docs/status.md prints every section") {
    const std::string out = render(json::parse(kExample));
    INFO(out);

    // Header block.
    CHECK(has(out, "tpfabricd\n"));
    CHECK(has(out, "  version       0.1.0\n"));
    CHECK(has(out, "  pid           1234\n"));
    CHECK(has(out, "  uptime        12.5s\n")); // started_unix_ns 0: no start time
    CHECK(has(out, "  node id       32 hex digits\n"));
    CHECK(has(out, "  socket        /run/tpfabric/tpfabricd.sock\n"));
    CHECK(has(out, "  config        built-in defaults\n"));
    CHECK(has(out, "  proxy         sleeping|polling, cpu not pinned, 0 doorbells\n"));
    CHECK_FALSE(has(out, "status format")); // the version this tool knows: no note

    // HCAs: a header row and one row, columns aligned.
    CHECK(has(out, "\nHCAs: 1\n"));
    const std::string hcaHead = lineWith(out, "DEVICE");
    const std::string hcaRow = lineWith(out, "rxe0");
    REQUIRE_FALSE(hcaRow.empty());
    for (const char* cell : {"ACTIVE", "::ffff:10.77.0.1", "10.77.0.0/24", "1024", "10 Gb/s"}) CHECK(has(hcaRow, cell));
    CHECK(hcaHead.find("GID ") == hcaRow.find("::ffff:10.77.0.1"));
    CHECK(hcaHead.find("SPEED") == hcaRow.find("10 Gb/s"));
    CHECK(hcaHead.find("IP ") == hcaRow.find(" 10.77.0.1 ") + 1);
    CHECK(hcaHead.find("SUBNET") == hcaRow.find("10.77.0.0/24"));

    // Peers: the empty last_error prints as "-".
    CHECK(has(out, "\nPeers: 2\n"));
    const std::string peerRow = lineWith(out, "10.77.0.2:18515");
    CHECK(has(peerRow, "connecting|handshake|negotiating|ready|waiting|failed|closed"));
    CHECK(has(peerRow, "  verbs  "));
    CHECK(has(peerRow, "  1  ")); // one QP listed
    CHECK(peerRow.substr(peerRow.size() - 1) == "-");
    // A tcp link: its wire, then its data link's bytes and frames each way.
    CHECK(has(lineWith(out, "127.0.0.1:18516"), "  tcp  "));
    const std::string dataRow = lineWith(out, "4MiB");
    CHECK(has(dataRow, "4.0KiB"));
    CHECK(has(dataRow, "8.0KiB"));
    CHECK(has(out, "FRAMES RECEIVED"));
    const std::string qpRow = lineWith(out, "65544");
    CHECK(has(qpRow, "rxe0"));
    CHECK(has(qpRow, "1048576"));
    CHECK(has(out, "HIGH WATER"));

    // Groups: full id, numbers in human units, then the ranks.
    CHECK(has(out, "\nGroups: 1\n  32 hex digits\n"));
    CHECK(has(out, "    world 4, state pending|negotiating|open|broken, agreed cap 512KiB (slot 516KiB), stripes 1\n"));
    CHECK(has(out, "    calls 2000, bytes 7.8MiB, errors 0, latency p50 12.0 µs, p99 40.0 µs\n"));
    CHECK(has(out, "    last error -\n"));
    const std::string rankHead = lineWith(out, "RANK  LOCAL");
    const std::string rankRow = lineWith(out, "4321");
    CHECK(rankHead.rfind("    RANK", 0) == 0);
    CHECK(has(rankRow, "yes"));
    CHECK(has(rankRow, "1000"));
    CHECK(has(rankRow, "shm (direct)"));
    CHECK(has(lineWith(out, "4322"), "shm (proxy)"));
    CHECK(rankHead.find("PID") == rankRow.find("4321"));

    CHECK(has(out, "\nRegions: 2 (host 8.1MiB, device 0B)\n"));
    CHECK(has(out, "Clients: 5\n"));
}

TEST_CASE("absent fields and sections print as '-', empty lists as 'none'") {
    SECTION("nothing but the version") {
        const std::string out = render(json::parse(R"({"status_version": 2})"));
        INFO(out);
        CHECK(has(out, "  version       -\n"));
        CHECK(has(out, "  uptime        -\n"));
        CHECK(has(out, "  proxy         -\n"));
        CHECK(has(out, "HCAs: -\n"));
        CHECK(has(out, "Peers: -\n"));
        CHECK(has(out, "Groups: -\n"));
        CHECK(has(out, "Regions: -\n"));
        CHECK(has(out, "Clients: -\n"));
    }
    SECTION("empty lists, sparse records") {
        const std::string out = render(json::parse(R"({
            "status_version": 2,
            "daemon": {"version": "0.2.0", "proxy": {"state": "polling", "cpu": 3}},
            "hcas": [], "peers": [],
            "groups": [{"id": "abc", "ranks": [], "latency_us": {"p50": 7}},
                       {"id": "def", "ranks": [{"rank": 1, "local": false, "pid": null, "uid": null, "route": "verbs"}]}],
            "regions": {"count": 0}
        })"));
        INFO(out);
        CHECK(has(out, "  version       0.2.0\n"));
        CHECK(has(out, "  pid           -\n"));
        CHECK(has(out, "  proxy         polling, cpu 3, - doorbells\n"));
        CHECK(has(out, "HCAs: none\n"));
        const std::string carry = render(json::parse(R"({"status_version": 2, "daemon": {"proxy":
            {"state": "polling", "cpu": -1, "doorbells": 9, "carry_threads": 2, "carry_parts": 40}}})"));
        CHECK(has(carry, "  proxy         polling, cpu not pinned, 9 doorbells, 2 carry threads (40 parts)\n"));
        CHECK(has(out, "Peers: none\n"));
        CHECK(has(out, "Groups: 2\n  abc\n"));
        CHECK(has(out, "    world -, state -, agreed cap - (slot -), stripes -\n"));
        CHECK(has(out, "    calls -, bytes -, errors -, latency p50 7.00 µs, p99 -\n"));
        CHECK(has(out, "    ranks: none\n"));
        const std::string remote = lineWith(out, "verbs");
        CHECK(has(remote, "1  "));
        CHECK(has(remote, "no"));
        CHECK(has(remote, "-  "));
        CHECK(has(out, "Regions: 0 (host -, device -)\n"));
    }
}

TEST_CASE("fields of the wrong type never throw and print as '-' or as their text") {
    const json doc = json::parse(R"({
        "status_version": "one",
        "daemon": {"version": 2, "pid": "1234", "uptime_s": "long", "node_id": ["x"], "socket": {},
                   "config_source": true, "proxy": "busy", "started_unix_ns": -5},
        "hcas": [1, "rxe9", null, {"device": 5, "port": "one", "speed_mbps": -3, "mtu": 1.5}],
        "peers": {"not": "a list"},
        "groups": [7, {"id": 7, "world": "four", "ranks": "x", "latency_us": [1], "agreed_cap": "big",
                       "bytes": -1, "calls": 1e30, "slot_bytes": 4096.0, "errors": 18446744073709551615}],
        "regions": [],
        "clients": "many"
    })");
    std::string out;
    REQUIRE_NOTHROW(out = render(doc));
    INFO(out);
    CHECK(has(out, "  status format one (this tpfabricctl reads 2;"));
    CHECK(has(out, "  version       2\n"));
    CHECK(has(out, "  pid           1234\n"));
    CHECK(has(out, "  uptime        long\n"));
    CHECK(has(out, "  node id       -\n"));
    CHECK(has(out, "  socket        -\n"));
    CHECK(has(out, "  config        yes\n"));
    CHECK(has(out, "  proxy         -\n"));
    CHECK(has(out, "HCAs: 4\n"));
    const std::string odd = lineWith(out, "1.50");
    CHECK(has(odd, "one"));
    CHECK(has(odd, "5  "));
    CHECK(has(odd, "-3"));
    CHECK(has(odd, "1.50"));
    CHECK(has(out, "Peers: -\n"));
    CHECK(has(out, "Groups: 2\n  -\n"));
    CHECK(has(out, "    world four, state -, agreed cap big (slot 4KiB), stripes -\n"));
    CHECK(has(out, "    calls 1e+30, bytes -1, errors 18446744073709551615,"));
    CHECK(has(out, "latency p50 -, p99 -\n"));
    CHECK(has(out, "    ranks: -\n"));
    CHECK(has(out, "Regions: -\n"));
    CHECK(has(out, "Clients: many\n"));
}

TEST_CASE("a JSON value that is no status document still prints a skeleton") {
    for (const char* text : {"null", "[]", "[1,2]", "42", "\"status\"", "{}"}) {
        const json doc = json::parse(text);
        std::string out;
        REQUIRE_NOTHROW(out = render(doc));
        INFO(text << "\n" << out);
        CHECK(has(out, "tpfabricd\n"));
        CHECK(has(out, "HCAs: -\n"));
        CHECK(has(out, "Clients: -\n"));
    }
}

TEST_CASE("a newer daemon's document prints what this tool knows and says so") {
    json doc = json::parse(kExample);
    doc["status_version"] = 3;
    doc["daemon"]["hugepages"] = true;
    doc["hcas"][0]["rate_limit"] = {{"gbps", 100}};
    doc["future_section"] = json::array({1, 2, 3});
    const std::string out = render(doc);
    INFO(out);
    CHECK(has(out, "  status format 3 (this tpfabricctl reads 2; what it does not know is left out: --json shows all)\n"));
    CHECK(has(out, "  version       0.1.0\n"));
    CHECK(has(lineWith(out, "rxe0"), "10 Gb/s"));
    CHECK_FALSE(has(out, "hugepages"));
    CHECK_FALSE(has(out, "future_section"));
}

TEST_CASE("daemon text with control characters stays on its line") {
    json doc = json::parse(kExample);
    doc["groups"][0]["last_error"] = "PeerLost: rank 3\nclosed\x1b[2J";
    doc["peers"][0]["last_error"] = "line\rbreak";
    const std::string out = render(doc);
    INFO(out);
    CHECK(has(out, "    last error PeerLost: rank 3?closed?[2J\n"));
    CHECK(has(lineWith(out, "10.77.0.2:18515"), "line?break"));
    CHECK_FALSE(has(out, "\r"));
    CHECK_FALSE(has(out, "\x1b"));
}

TEST_CASE("a start time is shown beside the uptime when the daemon gives one") {
    json doc = json::parse(kExample);
    doc["daemon"]["started_unix_ns"] = 1700000000000000000ull;
    doc["daemon"]["uptime_s"] = 3725;
    const std::string line = lineWith(render(doc), "uptime");
    CHECK(line.rfind("  uptime        1h 02m 05s (since 2023-11-", 0) == 0);
}

TEST_CASE("units: uptime, link speed, approximate bytes") {
    CHECK(formatUptime(0) == "0.0s");
    CHECK(formatUptime(12.5) == "12.5s");
    CHECK(formatUptime(245) == "4m 05s");
    CHECK(formatUptime(3 * 3600 + 2 * 60 + 7) == "3h 02m 07s");
    CHECK(formatUptime(2 * 86400 + 3 * 3600 + 4 * 60 + 59) == "2d 03h 04m");
    CHECK(formatUptime(-1) == "-");

    CHECK(formatSpeed(100) == "100 Mb/s");
    CHECK(formatSpeed(10000) == "10 Gb/s");
    CHECK(formatSpeed(2500) == "2.5 Gb/s");
    CHECK(formatSpeed(400000) == "400 Gb/s");

    CHECK(formatBytesApprox(0) == "0B");
    CHECK(formatBytesApprox(1023) == "1023B");
    CHECK(formatBytesApprox(1024) == "1.0KiB");
    CHECK(formatBytesApprox(8192000) == "7.8MiB");
    CHECK(formatBytesApprox(1ull << 30) == "1.0GiB");
    CHECK(formatBytesApprox(~0ull) == "16.0EiB");
}

TEST_CASE("Device groups: buffers, the proxy's polling, each rank's peer routes and device region") {
    const std::string out = render(json::parse(R"({"status_version": 2, "groups": [
        {"id": "g", "world": 3, "state": "open", "buffers": "device", "proxy_polls": true,
         "agreed_cap": 4096, "slot_bytes": 8192, "stripes": 1,
         "ranks": [{"rank": 0, "local": true, "pid": 11, "uid": 0, "route": "ipc", "routes": ["self", "ipc", "proxy"], "device_bytes": 2097152},
                   {"rank": 1, "local": true, "pid": 12, "uid": 0, "route": "ipc", "routes": null, "device_bytes": null},
                   {"rank": 2, "local": false, "pid": null, "uid": null, "route": "proxy", "routes": null, "device_bytes": null}]},
        {"id": "h", "world": 2, "state": "open", "buffers": "host", "proxy_polls": false,
         "agreed_cap": 4096, "slot_bytes": 8192, "stripes": 1,
         "ranks": [{"rank": 0, "local": true, "pid": 21, "uid": 0, "route": "shm", "routes": null, "device_bytes": null}]}],
        "regions": {"count": 3, "host_bytes": 1, "device_bytes": 2097152}})"));
    INFO(out);
    CHECK(has(out, "    world 3, state open, device buffers (the proxy polls their rings), agreed cap 4KiB"));
    CHECK(has(out, "    world 2, state open, host buffers, agreed cap 4KiB"));
    const std::string head = lineWith(out, "PEER ROUTES");
    const std::string row = lineWith(out, "1:ipc 2:proxy");
    CHECK(head.find("PEER ROUTES") == row.find("1:ipc 2:proxy"));
    CHECK(head.find("DEVICE REGION") == row.find("2.0MiB"));
    const std::string unreported = lineWith(out, "    12  ");
    CHECK(unreported.substr(row.find("1:ipc"), 1) == "-"); // rank 1 has not reported yet
    std::vector<std::string> heads;
    for (const auto& l : linesOf(out))
        if (l.rfind("    RANK", 0) == 0) heads.push_back(l);
    REQUIRE(heads.size() == 2);
    CHECK(!has(heads[1], "PEER")); // a host group has no GPU columns
    CHECK(has(out, "Regions: 3 (host 1B, device 2.0MiB)\n"));
}

TEST_CASE("a Device group's calls handed to NCCL get their own line, only when there are some") {
    const json doc = json::parse(R"({"groups": [{"id": "d", "buffers": "device", "calls": 10, "bytes": 40960, "errors": 0,
                                                "nccl_calls": 3, "nccl_bytes": 3145728,
                                                "latency_us": {"p50": null, "p99": null}, "ranks": []},
                                               {"id": "e", "buffers": "device", "calls": 10, "bytes": 40960, "errors": 0,
                                                "nccl_calls": 0, "nccl_bytes": 0,
                                                "latency_us": {"p50": null, "p99": null}, "ranks": []}]})");
    const std::string out = render(doc);
    INFO(out);
    CHECK(has(out, "    handed to NCCL (above the agreed cap): calls 3, bytes 3.0MiB\n"));
    CHECK(out.find("handed to NCCL") == out.rfind("handed to NCCL")); // group e: none
}

TEST_CASE("a group whose calls were not timed says so, never 0 µs") {
    const json device = json::parse(R"({"groups": [{"id": "d", "buffers": "device", "calls": 640, "bytes": 2621440, "errors": 0,
                                                   "latency_us": {"p50": null, "p99": null}, "ranks": []},
                                                  {"id": "h", "buffers": "host", "calls": 0, "bytes": 0, "errors": 0,
                                                   "latency_us": {"p50": null, "p99": null}, "ranks": []}]})");
    const std::string out = render(device);
    INFO(out);
    CHECK(has(out, "    calls 640, bytes 2.5MiB, errors 0, latency not measured (device calls are not timed)\n"));
    CHECK(has(out, "    calls 0, bytes 0B, errors 0, latency not measured (no call completed yet)\n"));
    CHECK_FALSE(has(out, "0.00"));
}


TEST_CASE("a re-adopted group shows its gap; one waiting for its ranks says so; an opened one shows nothing of it") {
    const json doc = json::parse(R"({"groups": [
        {"id": "a", "ranks": [], "adoption": {"lost_unix_ns": 1000, "adopted_unix_ns": 313001000, "gap_ms": 313.0}},
        {"id": "p", "ranks": [], "adoption": {"lost_unix_ns": 1000, "adopted_unix_ns": null, "gap_ms": null}},
        {"id": "o", "ranks": [], "adoption": null}]})");
    const std::string out = render(doc);
    INFO(out);
    CHECK(has(out, "  a\n"));
    CHECK(has(out, "    re-adopted after a daemon restart: gap 313.0 ms (from its ranks losing the old daemon to every rank "
                   "re-adopted)\n"));
    CHECK(has(out, "    re-adopting after a daemon restart: waiting for every local rank to ask\n"));
    CHECK(linesOf(out).size() > 0);
    std::size_t mentions = 0;
    for (const auto& l : linesOf(out)) mentions += has(l, "daemon restart");
    CHECK(mentions == 2);
}
