// Client <-> daemon records (proto/client_msg.hpp): round trips, refusals by
// name, golden byte images.
#include <cstring>

#include "catch.hpp"
#include "golden.hpp"
#include "proto/client_msg.hpp"

using namespace tpf;
using namespace tpf::client_proto;

namespace {

Hello sampleHello() { return Hello{kRoleRank, 0, 0}; }

HelloReply sampleHelloReply() {
    HelloReply m{};
    fill(m.nodeId, 0x10);
    setText(m.daemonVersion, "0.1.0");
    m.startedUnixNs = 0x0102030405060708ull;
    m.protocol = kClientVersion;
    return m;
}

HcaCard sampleHca(std::uint8_t i) {
    HcaCard h{};
    fill(h.gid, std::uint8_t(0x20 + i));
    fill(h.subnet, std::uint8_t(0x40 + i));
    setText(h.device, i ? "rxe1" : "rxe0");
    h.port = 1;
    h.prefixLen = 120;
    h.mtu = 1024;
    h.speedMbps = 10000;
    h.state = 4;
    h.gidIndex = 1;
    return h;
}

NodeCard sampleNodeCard() {
    NodeCard m;
    fill(m.fixed.nodeId, 0x10);
    fill(m.fixed.endpointAddr, 0x60);
    m.fixed.endpointPort = 18515;
    m.fixed.usableCap = 512 * 1024;
    m.hcas = {sampleHca(0), sampleHca(1)};
    m.fixed.hcaCount = 2;
    return m;
}

GroupOpen sampleGroupOpen(std::uint32_t world = 3, std::uint32_t rank = 1) {
    GroupOpen m;
    fill(m.fixed.groupId, 0xa0);
    m.fixed.rank = rank;
    m.fixed.world = world;
    m.fixed.maxBytes = 65536;
    m.fixed.timeoutMs = 5000;
    m.fixed.regionKind = kRegionHost;
    for (std::uint32_t r = 0; r < world; ++r) {
        RosterEntry e{};
        fill(e.nodeId, 0x10);
        fill(e.endpointAddr, 0x60);
        e.endpointPort = 18515;
        e.pid = 1000 + r;
        e.maxBytes = 65536;
        m.roster.push_back(e);
    }
    return m;
}

Verdict sampleVerdict() {
    Verdict v{};
    v.rank = 1;
    v.world = 3;
    v.stripes = 1;
    v.agreedCap = 65536 - 16;
    v.slotBytes = slotBytesFor(v.agreedCap);
    v.regionBytes = Layout::of(3, v.slotBytes, 1)->totalBytes();
    v.groupHandle = 7;
    v.ringEntries = 64;
    v.wires[0] = kWireShm;
    v.wires[1] = kWireSelf;
    v.wires[2] = kWireShm;
    setText(v.reason, "");
    return v;
}

ErrorReply sampleError() {
    ErrorReply e{};
    e.errc = std::uint16_t(Errc::BadMessage);
    e.missingPeer = kNoPeer;
    setText(e.message, "BadMessage: test");
    return e;
}

// A decoded frame that owns its bytes (its payload view points into them; a
// moved vector keeps its buffer).
struct OwnedFrame {
    Bytes bytes;
    MsgHeader header{};
    ByteView payload;
};

OwnedFrame frameOf(Bytes b) {
    OwnedFrame o{std::move(b)};
    auto f = decodeFrame(o.bytes, kReplySpec);
    REQUIRE(f.ok());
    o.header = f->header;
    o.payload = f->payload;
    return o;
}

// Every cut of a fixed record's payload is refused as Truncated.
template <class T>
void everyTruncationRefused(const T& rec, std::uint16_t op) {
    Bytes full = encode(op, 1, rec);
    auto f = frameOf(full);
    for (std::size_t cut = 0; cut < f.payload.size(); ++cut) {
        auto r = decodeFixed<T>(f.payload.first(cut), "rec");
        REQUIRE(r.code() == Errc::Truncated);
    }
    // One byte too many is refused too.
    Bytes longer(f.payload.begin(), f.payload.end());
    longer.push_back(0);
    CHECK(decodeFixed<T>(longer, "rec").code() == Errc::BadMessage);
}

} // namespace

TEST_CASE("client records round-trip") {
    {
        auto f = frameOf(encode(kHello, 5, sampleHello()));
        CHECK(f.header.opcode == kHello);
        CHECK(f.header.seq == 5);
        auto m = decodeFixed<Hello>(f.payload, "Hello");
        REQUIRE(m.ok());
        CHECK(m->role == kRoleRank);
    }
    {
        auto f = frameOf(encode(kHelloReply, 5, sampleHelloReply()));
        auto m = decodeFixed<HelloReply>(f.payload, "HelloReply");
        REQUIRE(m.ok());
        CHECK(std::memcmp(&*m, &static_cast<const HelloReply&>(sampleHelloReply()), sizeof(HelloReply)) == 0);
    }
    {
        auto f = frameOf(encode(9, sampleNodeCard()));
        CHECK(f.header.opcode == kNodeCard);
        auto m = decodeNodeCard(f.payload);
        REQUIRE(m.ok());
        REQUIRE(m->hcas.size() == 2);
        CHECK(m->fixed.usableCap == 512 * 1024);
        CHECK(std::string(m->hcas[1].device) == "rxe1");
    }
    for (std::uint32_t world : {2u, 3u, 16u}) {
        auto f = frameOf(encode(9, sampleGroupOpen(world, world - 1)));
        auto m = decodeGroupOpen(f.payload);
        REQUIRE(m.ok());
        CHECK(m->roster.size() == world);
        CHECK(m->roster[world - 1].pid == 1000 + world - 1);
    }
    {
        auto f = frameOf(encode(kVerdict, 2, sampleVerdict()));
        auto m = decodeFixed<Verdict>(f.payload, "Verdict");
        REQUIRE(m.ok());
        CHECK(m->groupHandle == 7);
    }
    {
        auto f = frameOf(encode(kErrorReply, 2, sampleError()));
        auto m = decodeFixed<ErrorReply>(f.payload, "ErrorReply");
        REQUIRE(m.ok());
        CHECK(std::string(m->message) == "BadMessage: test");
    }
    {
        auto f = frameOf(encode(kAbort, 3, Abort{}));
        CHECK(decodeFixed<Abort>(f.payload, "Abort").ok());
        auto g = frameOf(encode(kStatusRequest, 4, StatusRequest{}));
        CHECK(decodeFixed<StatusRequest>(g.payload, "StatusRequest").ok());
        auto e = frameOf(encodeEmpty(kClose, 6));
        CHECK(e.payload.empty());
        CHECK(expectEmpty(e.payload, "Close").ok());
        auto s = frameOf(encodeStatusReply(8, R"({"ok":true})"));
        CHECK(decodeStatusReply(s.payload).value() == R"({"ok":true})");
    }
}

TEST_CASE("header refusals: truncation, magic, version, length 0 and 2^32-1") {
    Bytes good = encode(kHello, 1, sampleHello());
    for (std::size_t cut = 0; cut < sizeof(MsgHeader); ++cut)
        CHECK(decodeHeader(ByteView(good).first(cut), kRequestSpec).code() == Errc::Truncated);
    // Payload shorter than the header says.
    CHECK(decodeFrame(ByteView(good).first(good.size() - 1), kRequestSpec).code() == Errc::Truncated);

    Bytes magic = good;
    magic[0] ^= 0xff;
    CHECK(decodeHeader(magic, kRequestSpec).code() == Errc::BadMagic);
    Bytes rev = good; // a record-layout revision from another release
    rev[3] = 2;
    CHECK(decodeHeader(rev, kRequestSpec).code() == Errc::BadMagic);

    for (std::uint16_t v : {std::uint16_t(0), std::uint16_t(kClientMinVersion - 1), std::uint16_t(kClientVersion + 1), std::uint16_t(0xffff)}) {
        Bytes b = good;
        std::memcpy(b.data() + 4, &v, 2);
        CHECK(decodeHeader(b, kRequestSpec).code() == Errc::VersionMismatch);
    }

    Bytes huge = good;
    const std::uint32_t big = 0xffffffffu;
    std::memcpy(huge.data() + 8, &big, 4);
    CHECK(decodeHeader(huge, kRequestSpec).code() == Errc::TooLarge);
    CHECK(decodeHeader(huge, kReplySpec).code() == Errc::TooLarge);

    Bytes zero = good; // length 0: a Hello with no payload
    const std::uint32_t nil = 0;
    std::memcpy(zero.data() + 8, &nil, 4);
    auto f = decodeFrame(zero, kRequestSpec);
    REQUIRE(f.ok());
    CHECK(decodeFixed<Hello>(f->payload, "Hello").code() == Errc::Truncated);
    CHECK(decodeGroupOpen(f->payload).code() == Errc::Truncated);
    CHECK(decodeNodeCard(f->payload).code() == Errc::Truncated);
    CHECK(expectEmpty(ByteView(good).subspan(16), "Close").code() == Errc::BadMessage);
}

TEST_CASE("every truncation of every fixed record is refused") {
    everyTruncationRefused(sampleHello(), kHello);
    everyTruncationRefused(sampleHelloReply(), kHelloReply);
    everyTruncationRefused(sampleVerdict(), kVerdict);
    everyTruncationRefused(sampleError(), kErrorReply);
    everyTruncationRefused(Abort{}, kAbort);
    everyTruncationRefused(StatusRequest{}, kStatusRequest);
}

TEST_CASE("every truncation of the counted records is refused") {
    auto nc = frameOf(encode(1, sampleNodeCard()));
    for (std::size_t cut = 0; cut < nc.payload.size(); ++cut)
        REQUIRE(decodeNodeCard(nc.payload.first(cut)).code() == Errc::Truncated);
    auto go = frameOf(encode(1, sampleGroupOpen()));
    for (std::size_t cut = 0; cut < go.payload.size(); ++cut)
        REQUIRE(decodeGroupOpen(go.payload.first(cut)).code() == Errc::Truncated);
}

TEST_CASE("out-of-range ranks, worlds and fields are refused by name") {
    auto decodeGo = [](GroupOpen m) {
        Bytes b = encode(1, m);
        return decodeGroupOpen(ByteView(b).subspan(16));
    };
    for (std::uint32_t world : {0u, 1u, 17u, 0xffffffffu}) {
        auto m = sampleGroupOpen();
        m.fixed.world = world; // the roster keeps 3 entries
        CHECK(decodeGo(m).code() == Errc::OutOfRange);
    }
    {
        auto m = sampleGroupOpen();
        m.fixed.rank = 3;
        CHECK(decodeGo(m).code() == Errc::OutOfRange);
        m.fixed.rank = 0xffffffffu;
        CHECK(decodeGo(m).code() == Errc::OutOfRange);
    }
    {
        auto m = sampleGroupOpen();
        m.fixed.world = 4; // roster has 3 entries: count and bytes disagree
        CHECK(decodeGo(m).code() == Errc::Truncated);
        m.fixed.world = 2; // one roster entry too many
        CHECK(decodeGo(m).code() == Errc::BadMessage);
    }
    {
        auto m = sampleGroupOpen();
        m.fixed.timeoutMs = 0;
        CHECK(decodeGo(m).code() == Errc::OutOfRange);
        m = sampleGroupOpen();
        m.fixed.regionKind = 9;
        CHECK(decodeGo(m).code() == Errc::OutOfRange);
        m = sampleGroupOpen();
        m.fixed.maxBytes = 1ull << 40;
        CHECK(decodeGo(m).code() == Errc::OutOfRange);
        m = sampleGroupOpen();
        m.fixed.maxBytes = 0; // no cap: the library refuses it before sending, the daemon too
        m.roster[m.fixed.rank].maxBytes = 0;
        CHECK(decodeGo(m).code() == Errc::OutOfRange);
        m = sampleGroupOpen();
        m.roster[1].maxBytes = 1; // own entry must match
        CHECK(decodeGo(m).code() == Errc::GroupMismatch);
        m = sampleGroupOpen();
        m.fixed.flags = kOpenHostDirect;
        CHECK(decodeGo(m).ok());
        m.fixed.flags = kOpenHostDirect | kOpenGpuDoorbells; // host-direct is for host buffers
        CHECK(decodeGo(m).code() == Errc::BadMessage);
        m.fixed.flags = 4;
        CHECK(decodeGo(m).code() == Errc::BadMessage);
    }
    {
        Hello h{7, 0, 0};
        Bytes b = encode(kHello, 1, h);
        CHECK(decodeFixed<Hello>(ByteView(b).subspan(16), "Hello").code() == Errc::OutOfRange);
    }
    {
        auto v = sampleVerdict();
        v.rank = 3;
        Bytes b = encode(kVerdict, 1, v);
        CHECK(decodeFixed<Verdict>(ByteView(b).subspan(16), "Verdict").code() == Errc::OutOfRange);
        v = sampleVerdict();
        v.wires[2] = 9;
        b = encode(kVerdict, 1, v);
        CHECK(decodeFixed<Verdict>(ByteView(b).subspan(16), "Verdict").code() == Errc::OutOfRange);
        v = sampleVerdict();
        v.slotBytes = 4096;
        b = encode(kVerdict, 1, v);
        CHECK(decodeFixed<Verdict>(ByteView(b).subspan(16), "Verdict").code() == Errc::BadMessage);
        v = sampleVerdict();
        v.errc = 999;
        b = encode(kVerdict, 1, v);
        CHECK(decodeFixed<Verdict>(ByteView(b).subspan(16), "Verdict").code() == Errc::OutOfRange);
        v = sampleVerdict();
        v.hostPeers = 1u << 0 | 1u << 2; // both same-node peers
        b = encode(kVerdict, 1, v);
        CHECK(decodeFixed<Verdict>(ByteView(b).subspan(16), "Verdict").ok());
        for (std::uint16_t bad : {std::uint16_t(1u << 1), std::uint16_t(1u << 3), std::uint16_t(1u << 15)}) {
            v.hostPeers = bad; // own rank, beyond world
            b = encode(kVerdict, 1, v);
            CHECK(decodeFixed<Verdict>(ByteView(b).subspan(16), "Verdict").code() == Errc::OutOfRange);
        }
        v = sampleVerdict();
        v.wires[2] = kWireVerbs;
        v.hostPeers = 1u << 2; // another node's rank has no host region here
        b = encode(kVerdict, 1, v);
        CHECK(decodeFixed<Verdict>(ByteView(b).subspan(16), "Verdict").code() == Errc::OutOfRange);
        v = sampleVerdict();
        std::memset(v.reason, 'x', sizeof v.reason); // no terminating NUL
        b = encode(kVerdict, 1, v);
        CHECK(decodeFixed<Verdict>(ByteView(b).subspan(16), "Verdict").code() == Errc::BadMessage);
    }
    {
        auto m = sampleNodeCard();
        m.hcas.resize(9, sampleHca(0));
        Bytes b = encode(1, m);
        CHECK(decodeNodeCard(ByteView(b).subspan(16)).code() == Errc::OutOfRange);
    }
}

// Golden images. A change here is a record-layout change: bump the magic's
// revision byte (kClientMagic) in the same commit.
TEST_CASE("golden byte images of client records") {
    CHECK(hexOf(encode(kHello, 1, sampleHello())) ==
          "5450430107000100100000000100000001000000000000000000000000000000");
    CHECK(hexOf(encode(kHelloReply, 2, sampleHelloReply())) ==
          "54504301070002004000000002000000"
          "101112131415161718191a1b1c1d1e1f302e312e30000000000000000000000000000000000000000000000000000000"
          "08070605040302010700000000000000"); // protocol 6
    CHECK(hexOf(encode(3, sampleNodeCard())) ==
          "5450430107000400b000000003000000"
          "101112131415161718191a1b1c1d1e1f606162636465666768696a6b6c6d6e6f5348020000000000"
          "0000080000000000"
          "202122232425262728292a2b2c2d2e2f404142434445464748494a4b4c4d4e4f7278653000000000000000000000000001780004102700000400000001000000"
          "2122232425262728292a2b2c2d2e2f304142434445464748494a4b4c4d4e4f507278653100000000000000000000000001780004102700000400000001000000");
    CHECK(hexOf(encode(4, sampleGroupOpen(2, 0))) ==
          "54504301070005009000000004000000"
          "a0a1a2a3a4a5a6a7a8a9aaabacadaeaf0000000002000000000001000000000088130000010000000000000000000000"
          "101112131415161718191a1b1c1d1e1f606162636465666768696a6b6c6d6e6f53480000e80300000000010000000000"
          "101112131415161718191a1b1c1d1e1f606162636465666768696a6b6c6d6e6f53480000e90300000000010000000000");
    CHECK(hexOf(encode(kVerdict, 5, sampleVerdict())) ==
          "5450430107000600c000000005000000"
          "00000000010000000300000001000000" // errc 0, rank 1, world 3, stripes 1
          "f0ff0000000000000010010000000000" // agreedCap 65520, slotBytes 69632
          "00700600000000000700000040000000" // regionBytes, groupHandle 7, 64 entries
          "01000100000000000000000000000000" // wires: shm, self, shm
          "0000000000000000000000000000000000000000000000000000000000000000"
          "0000000000000000000000000000000000000000000000000000000000000000"
          "0000000000000000000000000000000000000000000000000000000000000000"
          "0000000000000000000000000000000000000000000000000000000000000000");
    CHECK(hexOf(encode(kAbort, 6, Abort{})) == "5450430107000700080000000600000000000000" "00000000");
}


// Device-region brokering (ipc route): ShareRegion client -> daemon, PeerRegion daemon -> client.
TEST_CASE("ShareRegion and PeerRegion: round trips, refusals, golden bytes") {
    const ShareRegion share{2 * 1024 * 1024, 0, 0};
    auto sf = frameOf(encode(kShareRegion, 9, share));
    auto sback = decodeFixed<ShareRegion>(sf.payload, "ShareRegion");
    REQUIRE(sback.ok());
    CHECK(sback->bytes == share.bytes);
    const PeerRegion peer{3, 0, 2 * 1024 * 1024};
    auto pf = frameOf(encode(kPeerRegion, 10, peer));
    auto pback = decodeFixed<PeerRegion>(pf.payload, "PeerRegion");
    REQUIRE(pback.ok());
    CHECK(pback->rank == 3);
    CHECK(pback->bytes == peer.bytes);
    everyTruncationRefused(share, kShareRegion);
    everyTruncationRefused(peer, kPeerRegion);

    CHECK(validate(ShareRegion{0, 0, 0}).code() == Errc::OutOfRange);
    CHECK(validate(ShareRegion{kMaxSharedRegionBytes + 1, 0, 0}).code() == Errc::OutOfRange);
    CHECK(validate(ShareRegion{4096, 1, 0}).code() == Errc::BadMessage);
    CHECK(validate(PeerRegion{kMaxWorld, 0, 4096}).code() == Errc::OutOfRange);
    CHECK(validate(PeerRegion{1, 0, 0}).code() == Errc::OutOfRange);

    CHECK(hexOf(encode(kShareRegion, 9, share)) ==
          "54504301" "0700" "0d00" "10000000" "09000000" "0000200000000000" "0000000000000000");
    CHECK(hexOf(encode(kPeerRegion, 10, peer)) ==
          "54504301" "0700" "0e00" "10000000" "0a000000" "03000000" "00000000" "0000200000000000");
}

// Host-region brokering (host-direct path): daemon -> client after the Verdict.
TEST_CASE("PeerHostRegion: round trip, refusals by name, golden bytes") {
    const PeerHostRegion peer{2, 0, 0x26000};
    auto f = frameOf(encode(kPeerHostRegion, 13, peer));
    CHECK(f.header.opcode == kPeerHostRegion);
    auto back = decodeFixed<PeerHostRegion>(f.payload, "PeerHostRegion");
    REQUIRE(back.ok());
    CHECK(back->rank == 2);
    CHECK(back->bytes == peer.bytes);
    everyTruncationRefused(peer, kPeerHostRegion);
    CHECK(validate(PeerHostRegion{kMaxWorld, 0, 4096}).code() == Errc::OutOfRange);
    CHECK(validate(PeerHostRegion{1, 0, 0}).code() == Errc::OutOfRange);
    CHECK(validate(PeerHostRegion{1, 0, 4097}).code() == Errc::OutOfRange);
    CHECK(validate(PeerHostRegion{1, 1, 4096}).code() == Errc::BadMessage);
    CHECK(hexOf(encode(kPeerHostRegion, 13, peer)) ==
          "54504301" "0700" "1100" "10000000" "0d000000" // header: opcode 17, 16 bytes, seq 13
          "02000000" "00000000" "0060020000000000");      // rank 2, reserved, bytes 0x26000
    Verdict v = sampleVerdict();
    v.hostPeers = 0x0005;
    CHECK(hexOf(encode(kVerdict, 5, v)).substr(32, 8) == "00000500"); // errc 0, hostPeers ranks 0 and 2
}

// A rank's report of an open that did not take the fabric path (metrics only).
TEST_CASE("OpenReport: round trip, refusals by name, golden bytes") {
    const OpenReport report{std::uint16_t(Errc::Unavailable), kOutcomeUnavailable, 0, 0};
    auto f = frameOf(encode(kOpenReport, 11, report));
    CHECK(f.header.opcode == kOpenReport);
    auto back = decodeFixed<OpenReport>(f.payload, "OpenReport");
    REQUIRE(back.ok());
    CHECK(back->errc == std::uint16_t(Errc::Unavailable));
    CHECK(back->outcome == kOutcomeUnavailable);
    everyTruncationRefused(report, kOpenReport);

    CHECK(validate(OpenReport{std::uint16_t(Errc::ProbeFailed), kOutcomeNccl, 0, 0}).ok());
    CHECK(validate(OpenReport{0, kOutcomeNccl, 0, 0}).code() == Errc::OutOfRange); // Ok is no failure
    CHECK(validate(OpenReport{std::uint16_t(std::uint16_t(kLastErrc) + 1), kOutcomeNccl, 0, 0}).code() == Errc::OutOfRange);
    CHECK(validate(OpenReport{std::uint16_t(Errc::Unavailable), 0, 0, 0}).code() == Errc::OutOfRange);
    CHECK(validate(OpenReport{std::uint16_t(Errc::Unavailable), 3, 0, 0}).code() == Errc::OutOfRange);
    CHECK(validate(OpenReport{std::uint16_t(Errc::Unavailable), kOutcomeNccl, 1, 0}).code() == Errc::BadMessage);
    CHECK(validate(OpenReport{std::uint16_t(Errc::Unavailable), kOutcomeNccl, 0, 1}).code() == Errc::BadMessage);

    CHECK(hexOf(encode(kOpenReport, 11, report)) ==
          "54504301" "0700" "0f00" "10000000" "0b000000" // header: opcode 15, 16 bytes, seq 11
          "0f00" "0200" "00000000" "0000000000000000");  // errc 15 (Unavailable), outcome 2, reserved
}

// A Device group rank's GPU attach: its wires per peer and its device region.
TEST_CASE("DeviceAttach: round trip, refusals by name, golden bytes") {
    DeviceAttach m{};
    m.group = 7;
    m.rank = 1;
    m.world = 3;
    m.deviceBytes = 2 * 1024 * 1024;
    m.wires[0] = kWireIpc;
    m.wires[1] = kWireSelf;
    m.wires[2] = kWireVerbs;
    auto f = frameOf(encode(kDeviceAttach, 12, m));
    CHECK(f.header.opcode == kDeviceAttach);
    auto back = decodeFixed<DeviceAttach>(f.payload, "DeviceAttach");
    REQUIRE(back.ok());
    CHECK(std::memcmp(&*back, &m, sizeof m) == 0);
    CHECK(ringsProxy(m));
    everyTruncationRefused(m, kDeviceAttach);

    const auto with = [&](auto change) {
        DeviceAttach x = m;
        change(x);
        return validate(x).code();
    };
    CHECK(with([](DeviceAttach& x) { x.wires[2] = kWireIpc; }) == Errc::Ok);
    CHECK_FALSE(ringsProxy([&] { DeviceAttach x = m; x.wires[2] = kWireIpc; return x; }()));
    // A route past `world` (a byte the sender should have zeroed) does not count; one at the last rank does.
    CHECK_FALSE(ringsProxy([&] { DeviceAttach x = m; x.world = 2; return x; }()));
    static_assert(!anyProxyCarries(nullptr, 0));
    constexpr std::uint8_t kRoutes[] = {kWireSelf, kWireIpc, kWireShm};
    static_assert(!anyProxyCarries(kRoutes, 2) && anyProxyCarries(kRoutes, 3));
    CHECK(with([](DeviceAttach& x) { x.wires[2] = kWireShm; x.wires[0] = kWireShm; x.deviceBytes = 0; }) == Errc::Ok);
    CHECK(with([](DeviceAttach& x) { x.world = 1; }) == Errc::OutOfRange);
    CHECK(with([](DeviceAttach& x) { x.world = 17; }) == Errc::OutOfRange);
    CHECK(with([](DeviceAttach& x) { x.rank = 3; }) == Errc::OutOfRange);
    CHECK(with([](DeviceAttach& x) { x.wires[2] = kLastWire + 1; }) == Errc::OutOfRange); // no such route
    CHECK(with([](DeviceAttach& x) { x.wires[2] = 0xff; }) == Errc::OutOfRange);
    CHECK(with([](DeviceAttach& x) { x.wires[1] = kWireIpc; }) == Errc::OutOfRange);  // its own rank is self
    CHECK(with([](DeviceAttach& x) { x.wires[0] = kWireSelf; }) == Errc::OutOfRange); // a peer is not
    CHECK(with([](DeviceAttach& x) { x.wires[3] = kWireShm; }) == Errc::OutOfRange);  // beyond world
    CHECK(with([](DeviceAttach& x) { x.deviceBytes = kMaxSharedRegionBytes + 1; }) == Errc::OutOfRange);
    CHECK(with([](DeviceAttach& x) { x.deviceBytes = 0; }) == Errc::BadMessage); // ipc needs a region
    CHECK(with([](DeviceAttach& x) { x.reserved = 1; }) == Errc::BadMessage);

    CHECK(hexOf(encode(kDeviceAttach, 12, m)) ==
          "54504301" "0700" "1000" "28000000" "0c000000" // header: opcode 16, 40 bytes, seq 12
          "07000000" "01000000" "03000000" "00000000"     // group 7, rank 1, world 3, reserved
          "0000200000000000"                              // deviceBytes 2 MiB
          "03000200000000000000000000000000");            // wires: ipc, self, verbs
}

// Re-adoption by a restarted daemon: client -> daemon Adopt (+ region and
// ring fds), daemon -> client Adopted.
TEST_CASE("Adopt and Adopted: round trip, refusals by name, golden bytes") {
    Adopt m;
    fill(m.fixed.groupId, 0xa0);
    m.fixed.rank = 1;
    m.fixed.world = 2;
    m.fixed.groupHandle = 7;
    m.fixed.ringEntries = 64;
    m.fixed.agreedCap = 4096;
    m.fixed.slotBytes = slotBytesFor(4096);
    m.fixed.regionBytes = 0x6000;
    m.fixed.stripes = 1;
    m.fixed.timeoutMs = 30000;
    m.fixed.flags = kOpenHostDirect;
    m.fixed.lostUnixNs = 0x0102030405060708ull;
    m.roster = sampleGroupOpen(2, 1).roster;
    auto f = frameOf(encode(3, m));
    CHECK(f.header.opcode == kAdopt);
    auto back = decodeAdopt(f.payload);
    REQUIRE(back.ok());
    CHECK(std::memcmp(&back->fixed, &m.fixed, sizeof m.fixed) == 0);
    CHECK(back->roster.size() == 2);
    // A roster short of the world, or one entry too many: refused.
    CHECK(decodeAdopt(ByteView(f.payload).first(f.payload.size() - 1)).code() == Errc::Truncated);
    const auto with = [&](auto change) {
        AdoptFixed x = m.fixed;
        change(x);
        return validate(x).code();
    };
    CHECK(with([](AdoptFixed&) {}) == Errc::Ok);
    CHECK(with([](AdoptFixed& x) { x.world = 1; }) == Errc::OutOfRange);
    CHECK(with([](AdoptFixed& x) { x.rank = 2; }) == Errc::OutOfRange);
    CHECK(with([](AdoptFixed& x) { x.agreedCap = 0; }) == Errc::OutOfRange);
    CHECK(with([](AdoptFixed& x) { x.slotBytes += 4096; }) == Errc::BadMessage);
    CHECK(with([](AdoptFixed& x) { x.stripes = 0; }) == Errc::OutOfRange);
    CHECK(with([](AdoptFixed& x) { x.regionBytes = 4097; }) == Errc::OutOfRange);
    CHECK(with([](AdoptFixed& x) { x.ringEntries = 48; }) == Errc::OutOfRange);
    CHECK(with([](AdoptFixed& x) { x.groupHandle = 0; }) == Errc::OutOfRange);
    CHECK(with([](AdoptFixed& x) { x.timeoutMs = 0; }) == Errc::OutOfRange);
    // A Device group's rank says what its DeviceAttach said: ipc peers and its device region.
    const auto device = [](std::uint32_t ipc, std::uint64_t bytes) {
        return [=](AdoptFixed& x) { x.flags = kOpenGpuDoorbells, x.ipcPeers = ipc, x.deviceBytes = bytes; };
    };
    CHECK(with(device(0, 0)) == Errc::Ok);          // the proxy route only
    CHECK(with(device(1, 1 << 21)) == Errc::Ok);    // rank 0 by ipc
    CHECK(with(device(2, 1 << 21)) == Errc::BadMessage); // itself
    CHECK(with(device(4, 1 << 21)) == Errc::BadMessage); // outside the world
    CHECK(with(device(1, 0)) == Errc::BadMessage);  // ipc without a device region
    CHECK(with(device(0, 3ull << 30)) == Errc::OutOfRange);
    CHECK(with([](AdoptFixed& x) { x.flags = kOpenGpuDoorbells | kOpenHostDirect; }) == Errc::BadMessage);
    CHECK(with([](AdoptFixed& x) { x.flags = 4; }) == Errc::BadMessage);
    CHECK(with([](AdoptFixed& x) { x.ipcPeers = 1; }) == Errc::BadMessage);    // a Host group has none
    CHECK(with([](AdoptFixed& x) { x.deviceBytes = 1; }) == Errc::BadMessage); // nor a device region
    CHECK(hexOf(encode(3, m)).substr(0, 32 + 176) ==
          "54504301" "0700" "1200" "b8000000" "03000000"                         // header: opcode 18, 88 + 2 x 48 bytes, seq 3
          "a0a1a2a3a4a5a6a7a8a9aaabacadaeaf"                                     // group id
          "01000000" "02000000" "07000000" "40000000"                            // rank 1, world 2, handle 7, 64 entries
          "0010000000000000" "0020000000000000" "0060000000000000"              // cap, slot, region bytes
          "01000000" "30750000" "02000000" "00000000"                            // stripes 1, 30000 ms, host-direct, ipc peers
          "0807060504030201" "0000000000000000");                               // lost at, device bytes

    Adopted a{};
    a.rank = 1;
    a.groupHandle = 7;
    a.ranks = 3;
    a.gapNs = 0x1234;
    auto fa = frameOf(encode(kAdopted, 4, a));
    CHECK(fa.header.opcode == kAdopted);
    auto ab = decodeFixed<Adopted>(fa.payload, "Adopted");
    REQUIRE(ab.ok());
    CHECK(ab->gapNs == 0x1234);
    everyTruncationRefused(a, kAdopted);
    Adopted bad = a;
    bad.errc = 0xfff0;
    CHECK(validate(bad).code() == Errc::OutOfRange);
    bad = a;
    std::memset(bad.reason, 'x', sizeof bad.reason);
    CHECK(validate(bad).code() == Errc::BadMessage);
    CHECK(hexOf(encode(kAdopted, 4, a)).substr(0, 32 + 64) ==
          "54504301" "0700" "1300" "a0000000" "04000000" // header: opcode 19, 160 bytes, seq 4
          "0000" "0000" "01000000" "07000000" "03000000"  // ok, rank 1, handle 7, ranks 0 and 1
          "3412000000000000" "0000000000000000");         // gap, reserved
}

// Daemon -> client GroupFailed: why the daemon broke an open group.
TEST_CASE("GroupFailed: round trip, refusals by name, golden bytes") {
    GroupFailed m{};
    m.errc = std::uint16_t(Errc::PeerLost);
    m.rank = 2;
    m.groupHandle = 7;
    setText(m.reason, "node 0a1b's daemon did not come back");
    auto f = frameOf(encode(kGroupFailed, 5, m));
    CHECK(f.header.opcode == kGroupFailed);
    auto back = decodeFixed<GroupFailed>(f.payload, "GroupFailed");
    REQUIRE(back.ok());
    CHECK(std::string(back->reason) == "node 0a1b's daemon did not come back");
    everyTruncationRefused(m, kGroupFailed);
    GroupFailed bad = m;
    bad.errc = 0;
    CHECK(validate(bad).code() == Errc::OutOfRange); // a failure names its code
    bad = m;
    bad.rank = kMaxWorld;
    CHECK(validate(bad).code() == Errc::OutOfRange);
    bad.rank = kNoPeer;
    CHECK(validate(bad).ok());
    bad = m;
    std::memset(bad.reason, 'x', sizeof bad.reason);
    CHECK(validate(bad).code() == Errc::BadMessage);
    CHECK(hexOf(encode(kGroupFailed, 5, m)).substr(0, 32 + 32 + 8) ==
          "54504301" "0700" "1400" "00020000" "05000000" // header: opcode 20, 512 bytes, seq 5
          "0400" "0000" "02000000" "07000000" "00000000"  // PeerLost (4), rank 2, handle 7, reserved
          "6e6f6465");                                    // "node"
}
