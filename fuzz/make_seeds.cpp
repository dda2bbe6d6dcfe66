// Writes the seed corpus of one fuzz target into a directory: valid encoded
// records (and a few near misses), so the fuzzers start from inputs that get
// past the magic and version checks.
//   make_seeds <target> <dir> [<source root>]
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "proto/bootstrap.hpp"
#include "proto/client_msg.hpp"
#include "proto/peer_msg.hpp"
#include "proto/tcp_frame.hpp"
#include "proto/ring.hpp"

using namespace tpf;

namespace {

std::string outDir;
int written = 0;

void put(const std::string& name, const Bytes& b) {
    std::ofstream f(outDir + "/" + name, std::ios::binary);
    f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
    ++written;
}
void put(const std::string& name, const std::string& s) { put(name, Bytes(s.begin(), s.end())); }

Bytes cat(std::initializer_list<Bytes> parts, std::uint8_t prefix) {
    Bytes out{prefix};
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
}

void clientSeeds() {
    using namespace client_proto;
    const Bytes hello = encode(kHello, 1, Hello{kRoleRank, 0, 0});
    HelloReply hr{};
    setText(hr.daemonVersion, "0.1.0");
    hr.protocol = kClientVersion;
    NodeCard card;
    card.fixed.endpointPort = 18515;
    card.fixed.usableCap = 512 * 1024;
    HcaCard hca{};
    setText(hca.device, "rxe0");
    hca.port = 1;
    hca.prefixLen = 120;
    hca.mtu = 1024;
    hca.state = 4;
    card.hcas = {hca, hca};
    GroupOpen open;
    open.fixed.rank = 1;
    open.fixed.world = 2;
    open.fixed.maxBytes = 65536;
    open.fixed.timeoutMs = 30000;
    open.fixed.regionKind = kRegionHost;
    for (std::uint32_t r = 0; r < 2; ++r) {
        RosterEntry e{};
        e.pid = 100 + r;
        e.maxBytes = 65536;
        open.roster.push_back(e);
    }
    Verdict v{};
    v.rank = 1;
    v.world = 2;
    v.stripes = 1;
    v.agreedCap = 65536;
    v.slotBytes = slotBytesFor(v.agreedCap);
    v.ringEntries = 64;
    v.wires[0] = kWireShm;
    ErrorReply er{};
    er.errc = std::uint16_t(Errc::BadMessage);
    er.missingPeer = kNoPeer;
    setText(er.message, "BadMessage: unknown opcode 99");

    // Requests (prefix 0): what a rank and tpfabricctl send, alone and in sequence.
    put("req-hello", cat({hello}, 0));
    put("req-rank-session", cat({hello, encodeEmpty(kNodeCardRequest, 2), encode(3, open), encode(kAbort, 4, Abort{}),
                                 encodeEmpty(kClose, 5)}, 0));
    put("req-control-session", cat({encode(kHello, 1, Hello{kRoleControl, 0, 0}), encode(kStatusRequest, 2, StatusRequest{})}, 0));
    put("req-open", cat({encode(7, open)}, 0));
    put("req-refused-session", cat({hello, encode(3, open),
                                    encode(kOpenReport, 4, OpenReport{std::uint16_t(Errc::Unavailable), kOutcomeUnavailable, 0, 0})},
                                   0));
    // Requests whose first byte / 3 asks for fds (% 3), refused opens (/ 3 & 1) and a
    // stream read in two parts (/ 6): ShareRegion with its one fd, a refused open, a cut.
    put("req-share-region", cat({hello, encode(3, open), encode(kShareRegion, 4, ShareRegion{1 << 20, 0, 0}),
                                 encodeEmpty(kClose, 5)},
                                3 * 1));
    put("req-refused-open-abort", cat({hello, encode(3, open), encode(kAbort, 4, Abort{})}, 3 * 3));
    // A Device group rank's report of its GPU attach (ipc to rank 0), after its open.
    GroupOpen deviceOpen = open;
    deviceOpen.fixed.flags = kOpenGpuDoorbells;
    DeviceAttach attach{};
    attach.group = 2; // the fuzzer's stand-in table refuses odd handles
    attach.rank = 1;
    attach.world = 2;
    attach.deviceBytes = 2 << 20;
    attach.wires[0] = kWireIpc;
    attach.wires[1] = kWireSelf;
    put("req-device-attach", cat({hello, encode(3, deviceOpen), encode(kDeviceAttach, 4, attach), encodeEmpty(kClose, 5)}, 0));
    attach.group = 3;
    put("req-device-attach-refused", cat({hello, encode(3, deviceOpen), encode(kDeviceAttach, 4, attach)}, 0));
    put("req-two-reads", cat({hello, encode(3, open), encodeEmpty(kClose, 5)}, 3 * 6 * 7));
    // A rank asking a restarted daemon to re-adopt its group, its region and ring fds beside (% 3 == 2).
    Adopt adopt;
    adopt.fixed = AdoptFixed{{}, 1, 2, 7, 64, 65536, slotBytesFor(65536), 65536 * 4, 1, 30000, kOpenHostDirect, 0, 1, 0};
    adopt.roster = open.roster;
    put("req-adopt", cat({hello, encode(3, adopt), encodeEmpty(kClose, 4)}, 2));
    put("req-adopt-refused", cat({hello, encode(3, adopt), encode(kAbort, 4, Abort{})}, 3 * 3 + 2));
    // Replies (prefix 1): what the client library decodes.
    put("rep-hello", cat({encode(kHelloReply, 1, hr)}, 1));
    put("rep-nodecard", cat({encode(2, card)}, 1));
    put("rep-verdict", cat({encode(kVerdict, 0, v)}, 1));
    Adopted adopted{};
    adopted.rank = 1;
    adopted.groupHandle = 7;
    adopted.ranks = 3;
    adopted.gapNs = 250000000;
    put("rep-adopted", cat({encode(kAdopted, 0, adopted)}, 1));
    GroupFailed failed{};
    failed.errc = std::uint16_t(Errc::PeerLost);
    failed.rank = 2;
    failed.groupHandle = 7;
    setText(failed.reason, "node 0a1b2c3d's daemon (10.0.0.2:18515) did not come back within 30000 ms");
    put("rep-groupfailed", cat({encode(kGroupFailed, 0, failed)}, 1));
    put("rep-status", cat({encodeStatusReply(4, R"({"groups":[],"regions":0})")}, 1));
    put("rep-error", cat({encode(kErrorReply, 0, er), encodeEmpty(kClosed, 9)}, 1));
    // Bootstrap (prefix 2).
    {
        using namespace bootstrap_proto;
        bootstrap_proto::OpenCard oc{};
        oc.entry = open.roster[0];
        Writer w;
        w.put(oc).put(oc);
        Bytes all = encodeHeader(kBootstrapSpec, kGatherAll, 1, std::uint32_t(w.bytes().size()));
        all.insert(all.end(), w.bytes().begin(), w.bytes().end());
        Writer j;
        j.put(std::uint32_t(1)).put(std::uint32_t(2));
        Bytes join = encodeHeader(kBootstrapSpec, kJoin, 0, 8);
        join.insert(join.end(), j.bytes().begin(), j.bytes().end());
        put("boot-session", cat({join, all}, 2));
    }
}

void peerSeeds() {
    using namespace peer_proto;
    PeerHello hello{};
    hello.flags = kHelloKeyed;
    PeerGroup g;
    g.fixed.world = 4;
    g.fixed.localRanks = 0x3;
    g.fixed.caps[0] = g.fixed.caps[1] = g.fixed.caps[2] = g.fixed.caps[3] = 65536;
    g.fixed.daemonMax = 512 * 1024;
    HcaRecord h{};
    h.prefixLen = 120;
    h.port = 1;
    h.mtu = 4096;
    g.hcas = {h, h};
    for (std::uint32_t r = 0; r < 2; ++r)
        for (std::uint32_t hca = 0; hca < 2; ++hca) g.regions.push_back(RegionRecord{r, hca, 0x10000, 1 << 20, 77, 0});
    for (std::uint16_t l = 0; l < 2; ++l)
        for (std::uint16_t rr = 2; rr < 4; ++rr) g.qps.push_back(QpRecord{0, 0, l, rr, 0, 0x1234, 0x42});
    PeerVerdict ready{};
    ready.missingRank = kNoPeer;
    PeerVerdict broken{};
    broken.errc = std::uint16_t(Errc::PeerLost);
    broken.missingRank = 3;
    setText(broken.reason, "rank 3 died");
    const Bytes helloB = encode(kPeerHello, 0, hello), auth = encode(kPeerAuth, 1, PeerAuth{}), group = encode(2, g),
                readyB = encode(kPeerReady, 3, ready), brokenB = encode(kPeerBroken, 4, broken);
    // First byte: where the link starts (% 3: hello, auth, records), keyed (/ 3 & 1).
    put("peer-hello", cat({helloB}, 0));
    put("peer-group", cat({group}, 2));
    put("peer-unkeyed-link", cat({helloB, group, readyB, brokenB}, 0));
    put("peer-link", cat({helloB, auth, group, readyB, brokenB}, 3));
    // A tcp group's record, then its data link: PeerData and frames from rank 0 to rank 1.
    PeerGroup t;
    t.fixed = g.fixed;
    t.fixed.wire = kWireTcp;
    PeerData data{};
    Bytes link = encode(kPeerData, 0, data);
    for (std::uint64_t epoch = 1; epoch <= 3; ++epoch) {
        TcpFrame f{kTcpFrameMagic, 0, 1, std::uint8_t(epoch & 1), std::uint8_t(epoch & 1), 0, 24, 4096 * (epoch & 1), epoch};
        const auto* p = reinterpret_cast<const std::uint8_t*>(&f);
        link.insert(link.end(), p, p + sizeof f);
        link.insert(link.end(), 24, std::uint8_t(epoch));
    }
    put("peer-tcp-group", cat({helloB, encode(2, t), readyB}, 0));
    put("peer-data-link", cat({helloB, link}, 0));
}

void ringSeeds() {
    // [entries shift][tail u32] then ops (see fuzz_ring.cpp).
    Bytes b{3};
    const std::uint32_t tail = 0xfffffff0u;
    b.insert(b.end(), reinterpret_cast<const std::uint8_t*>(&tail), reinterpret_cast<const std::uint8_t*>(&tail) + 4);
    for (int i = 0; i < 20; ++i) {
        b.push_back(1); // push
        Doorbell d{std::uint64_t(i + 1), 4096, 7};
        b.insert(b.end(), reinterpret_cast<const std::uint8_t*>(&d), reinterpret_cast<const std::uint8_t*>(&d) + sizeof d);
        b.push_back(0); // pop
        b.push_back(4); // hasSubmissions
    }
    put("ring-traffic", b);
    Bytes corrupt{0, 0, 0, 0, 0, 2, 0, 0xff, 0xff, 0xff, 0x7f, 0, 0, 5};
    put("ring-corrupt-head", corrupt);
}

void configSeeds(const std::string& root) {
    std::ifstream ex(root + "/systemd/tpfabricd.conf.example");
    std::string text((std::istreambuf_iterator<char>(ex)), std::istreambuf_iterator<char>());
    if (!text.empty()) put("example", text);
    put("full", "[daemon]\nsocket = \"/run/tpf/d.sock\"\nsocket_group = \"tpfabric\"\nlog_level = \"debug\"\n"
                "max_bytes = \"512KiB\"\nring_entries = 64\nopen_timeout_ms = 30000\nmax_clients = 256\n"
                "max_groups = 64\nmax_region_bytes = \"16GiB\"\n\n[proxy]\ncpu = -1\nspin_us = 50\nheartbeat_ms = 100\n\n"
                "[peer]\nlisten = \"fd00::1\"\nport = 18515\nkey_file = \"/etc/tpfabric/key\"\nconnect_timeout_ms = 5000\n\n"
                "[verbs]\nhcas = [\"mlx5_0\", \"10.0.0.1\"]\ninflight_bytes = 1048576\nqp_timeout_ms = 2000\n");
    put("bad-range", "[daemon]\nring_entries = 3\n");
    put("bad-type", "[proxy]\ncpu = \"x\"\n[verbs]\nhcas = [1, 2]\n");
    put("bad-syntax", "[daemon\nmax_bytes = = 1\n");
}

} // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: make_seeds client_msg|peer_msg|ring|config <dir> [<source root>]\n");
        return 2;
    }
    const std::string target = argv[1];
    outDir = argv[2];
    if (target == "client_msg") clientSeeds();
    else if (target == "peer_msg") peerSeeds();
    else if (target == "ring") ringSeeds();
    else if (target == "config") configSeeds(argc > 3 ? argv[3] : ".");
    else {
        std::fprintf(stderr, "make_seeds: unknown target %s\n", target.c_str());
        return 2;
    }
    std::printf("make_seeds: %d seeds for %s in %s\n", written, target.c_str(), outDir.c_str());
    return written ? 0 : 1;
}
