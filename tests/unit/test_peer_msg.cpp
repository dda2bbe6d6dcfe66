// Daemon <-> daemon records (proto/peer_msg.hpp): round trips, refusals by
// name, golden byte images.
#include <cstring>

#include "catch.hpp"
#include "golden.hpp"
#include "proto/peer_msg.hpp"
#include "proto/tcp_frame.hpp"

using namespace tpf;
using namespace tpf::peer_proto;

namespace {

PeerHello sampleHello() {
    PeerHello m{};
    fill(m.nodeId, 0x10);
    fill(m.nonce, 0x80);
    m.flags = kHelloKeyed;
    return m;
}

PeerAuth sampleAuth() {
    PeerAuth a{};
    fill(a.mac, 0xc0);
    return a;
}

// Node A serves ranks 0 and 1 of a world-3 group over two HCAs; rank 2 is remote.
PeerGroup sampleGroup() {
    PeerGroup m;
    fill(m.fixed.groupId, 0xa0);
    fill(m.fixed.nodeId, 0x10);
    m.fixed.world = 3;
    m.fixed.localRanks = 0b011;
    m.fixed.caps[0] = 65536;
    m.fixed.caps[1] = 65536;
    m.fixed.caps[2] = 32768;
    m.fixed.daemonMax = 0x0fedcb;
    for (std::uint32_t rank = 0; rank < 2; ++rank)
        for (std::uint32_t hca = 0; hca < 2; ++hca)
            m.regions.push_back({rank, hca, 0x7f0000000000ull + rank * 0x100000, 139264, 0x1000 + rank * 2 + hca, 0});
    for (std::uint8_t hca = 0; hca < 2; ++hca) {
        HcaRecord h{};
        fill(h.gid, std::uint8_t(0x20 + hca));
        fill(h.subnet, std::uint8_t(0x40 + hca));
        h.prefixLen = 120;
        h.port = 1;
        h.mtu = 1024;
        h.gidIndex = 1;
        m.hcas.push_back(h);
    }
    for (std::uint8_t hca = 0; hca < 2; ++hca)
        for (std::uint16_t rank = 0; rank < 2; ++rank)
            m.qps.push_back({hca, 0, rank, 2, 0, 0x11u + hca * 2u + rank, 0x123456u, });
    return m;
}

PeerVerdict sampleVerdict() {
    PeerVerdict v{};
    fill(v.groupId, 0xa0);
    v.errc = std::uint16_t(Errc::NonOneToOnePairing);
    v.missingRank = kNoPeer;
    setText(v.reason, "two local HCAs in subnet 10.77.0.0/24");
    return v;
}

ByteView payloadOf(const Bytes& b) { return ByteView(b).subspan(sizeof(MsgHeader)); }

Result<PeerGroup> roundTrip(const PeerGroup& m) {
    static Bytes keep;
    keep = encode(1, m);
    auto f = decodeFrame(keep, kPeerSpec);
    if (!f) return f.error();
    return decodePeerGroup(f->payload);
}

} // namespace

TEST_CASE("peer records round-trip") {
    {
        Bytes b = encode(kPeerHello, 1, sampleHello());
        auto f = decodeFrame(b, kPeerSpec);
        REQUIRE(f.ok());
        auto m = decodeFixed<PeerHello>(f->payload, "PeerHello");
        REQUIRE(m.ok());
        CHECK(m->flags == kHelloKeyed);
        CHECK(m->nonce[31] == 0x80 + 31);
    }
    {
        Bytes b = encode(kPeerAuth, 2, sampleAuth());
        auto m = decodeFixed<PeerAuth>(payloadOf(b), "PeerAuth");
        REQUIRE(m.ok());
        CHECK(m->mac[0] == 0xc0);
    }
    {
        auto m = roundTrip(sampleGroup());
        REQUIRE(m.ok());
        CHECK(m->regions.size() == 4);
        CHECK(m->hcas.size() == 2);
        CHECK(m->qps.size() == 4);
        CHECK(m->qps[3].qpn == 0x11u + 2 + 1);
        CHECK(m->fixed.caps[2] == 32768);
        CHECK(m->fixed.daemonMax == 0x0fedcb);
        CHECK(m->regions[3].rkey == 0x1003);
    }
    {
        Bytes b = encode(kPeerReady, 3, sampleVerdict());
        auto m = decodeFixed<PeerVerdict>(payloadOf(b), "PeerVerdict");
        REQUIRE(m.ok());
        CHECK(std::string(m->reason) == "two local HCAs in subnet 10.77.0.0/24");
    }
    {
        PeerGroup empty = sampleGroup();
        empty.regions.clear();
        empty.qps.clear();
        empty.hcas.clear(); // a node with no HCAs still states its ranks and caps
        CHECK(roundTrip(empty).ok());
    }
}

TEST_CASE("peer header refusals") {
    Bytes good = encode(kPeerHello, 1, sampleHello());
    for (std::size_t cut = 0; cut < sizeof(MsgHeader); ++cut)
        CHECK(decodeHeader(ByteView(good).first(cut), kPeerSpec).code() == Errc::Truncated);
    Bytes b = good;
    b[3] = 2; // another record-layout revision
    CHECK(decodeHeader(b, kPeerSpec).code() == Errc::BadMagic);
    b = good;
    b[0] = 'X';
    CHECK(decodeHeader(b, kPeerSpec).code() == Errc::BadMagic);
    for (std::uint8_t v : {std::uint8_t(0), std::uint8_t(kPeerMinVersion - 1), std::uint8_t(kPeerVersion + 1)}) {
        b = good;
        b[4] = v; // below the accepted range (a daemon of another slot rule) or above it
        CHECK(decodeHeader(b, kPeerSpec).code() == Errc::VersionMismatch);
    }
    for (std::uint32_t len : {0xffffffffu, kMaxPeerPayload + 1}) {
        b = good;
        std::memcpy(b.data() + 8, &len, 4);
        CHECK(decodeHeader(b, kPeerSpec).code() == Errc::TooLarge);
    }
    CHECK(decodeFixed<PeerHello>(ByteView(), "PeerHello").code() == Errc::Truncated);
    CHECK(decodePeerGroup(ByteView()).code() == Errc::Truncated);
    CHECK(decodeFixed<PeerVerdict>(ByteView(), "PeerVerdict").code() == Errc::Truncated);
}

TEST_CASE("every truncation of a peer record is refused") {
    Bytes g = encode(1, sampleGroup());
    auto p = payloadOf(g);
    for (std::size_t cut = 0; cut < p.size(); ++cut) REQUIRE(decodePeerGroup(p.first(cut)).code() == Errc::Truncated);
    Bytes h = encode(kPeerHello, 1, sampleHello());
    for (std::size_t cut = 0; cut < sizeof(PeerHello); ++cut)
        REQUIRE(decodeFixed<PeerHello>(payloadOf(h).first(cut), "PeerHello").code() == Errc::Truncated);
    Bytes v = encode(kPeerReady, 1, sampleVerdict());
    for (std::size_t cut = 0; cut < sizeof(PeerVerdict); ++cut)
        REQUIRE(decodeFixed<PeerVerdict>(payloadOf(v).first(cut), "PeerVerdict").code() == Errc::Truncated);
}

TEST_CASE("peer group refuses out-of-range ranks, worlds, counts and fields by name") {
    auto expect = [](PeerGroup m, Errc e) { CHECK(roundTrip(m).code() == e); };
    for (std::uint32_t world : {0u, 1u, 17u, 0xffffffffu}) {
        auto m = sampleGroup();
        m.fixed.world = world;
        expect(m, Errc::OutOfRange);
    }
    {
        auto m = sampleGroup();
        m.fixed.localRanks = 0b1000; // rank 3 in a world of 3
        expect(m, Errc::OutOfRange);
        m.fixed.localRanks = 0;
        expect(m, Errc::OutOfRange);
    }
    {
        auto m = sampleGroup();
        m.regions[0].rank = 5;
        expect(m, Errc::OutOfRange);
        m = sampleGroup();
        m.regions[0].rank = 2; // a rank the sender does not serve
        expect(m, Errc::BadMessage);
        m = sampleGroup();
        m.regions[0].hca = 2;
        expect(m, Errc::OutOfRange);
        m = sampleGroup();
        m.regions[0].bytes = 0;
        expect(m, Errc::OutOfRange);
    }
    {
        auto m = sampleGroup();
        m.qps[0].remoteRank = 3;
        expect(m, Errc::OutOfRange);
        m = sampleGroup();
        m.qps[0].remoteRank = 1; // both ends on the sender's node
        expect(m, Errc::BadMessage);
        m = sampleGroup();
        m.qps[0].qpn = 1u << 24;
        expect(m, Errc::OutOfRange);
        m = sampleGroup();
        m.qps[0].hca = 7;
        expect(m, Errc::OutOfRange);
    }
    {
        auto m = sampleGroup();
        m.hcas[1].mtu = 1500;
        expect(m, Errc::OutOfRange);
        m = sampleGroup();
        m.hcas[1].prefixLen = 129;
        expect(m, Errc::OutOfRange);
    }
    {
        auto m = sampleGroup();
        m.fixed.caps[5] = 4096; // past world
        expect(m, Errc::BadMessage);
        m = sampleGroup();
        m.fixed.caps[1] = 1ull << 40;
        expect(m, Errc::OutOfRange);
        m = sampleGroup();
        m.fixed.daemonMax = 0; // what a daemon of protocol 2 left there
        expect(m, Errc::OutOfRange);
        m.fixed.daemonMax = (1ull << 30) + 1;
        expect(m, Errc::OutOfRange);
        m.fixed.daemonMax = 1ull << 30;
        CHECK(roundTrip(m).ok());
    }
    {
        // Counts beyond the protocol's bounds are refused before anything is read.
        auto m = sampleGroup();
        Bytes b = encode(1, m);
        std::uint32_t qps = kMaxQps + 1;
        std::memcpy(b.data() + sizeof(MsgHeader) + offsetof(PeerGroupFixed, qpCount), &qps, 4);
        CHECK(decodePeerGroup(payloadOf(b)).code() == Errc::OutOfRange);
        std::uint32_t huge = 0xffffffffu;
        std::memcpy(b.data() + sizeof(MsgHeader) + offsetof(PeerGroupFixed, regionCount), &huge, 4);
        CHECK(decodePeerGroup(payloadOf(b)).code() == Errc::OutOfRange);
    }
    {
        auto v = sampleVerdict();
        v.errc = 4000;
        Bytes b = encode(kPeerBroken, 1, v);
        CHECK(decodeFixed<PeerVerdict>(payloadOf(b), "PeerVerdict").code() == Errc::OutOfRange);
        v = sampleVerdict();
        v.missingRank = 16;
        b = encode(kPeerBroken, 1, v);
        CHECK(decodeFixed<PeerVerdict>(payloadOf(b), "PeerVerdict").code() == Errc::OutOfRange);
        auto h = sampleHello();
        h.flags = 6;
        b = encode(kPeerHello, 1, h);
        CHECK(decodeFixed<PeerHello>(payloadOf(b), "PeerHello").code() == Errc::BadMessage);
    }
}

// Golden images. A change here is a record-layout change: bump the magic's
// revision byte (kPeerMagic) in the same commit; a reserved field put to use
// within the same layout bumps kPeerVersion instead (3: daemonMax).
TEST_CASE("golden byte images of peer records") {
    CHECK(golden(encode(kPeerHello, 1, sampleHello()), "hello") ==
          "54505001030001004000000001000000101112131415161718191a1b1c1d1e1f"
          "808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9f"
          "01000000000000000000000000000000");
    CHECK(golden(encode(kPeerAuth, 2, sampleAuth()), "auth") ==
          "54505001030002002000000002000000c0c1c2c3c4c5c6c7c8c9cacbcccdcecf"
          "d0d1d2d3d4d5d6d7d8d9dadbdcdddedf");
    CHECK(golden(encode(3, sampleGroup()), "group") ==
          "5450500103000300e001000003000000a0a1a2a3a4a5a6a7a8a9aaabacadaeaf"
          "101112131415161718191a1b1c1d1e1f03000000030000000400000002000000"
          "0400000000000000000001000000000000000100000000000080000000000000"
          "0000000000000000000000000000000000000000000000000000000000000000"
          "0000000000000000000000000000000000000000000000000000000000000000"
          "0000000000000000000000000000000000000000000000000000000000000000"
          "0000000000000000cbed0f0000000000000000000000000000000000007f0000"
          "00200200000000000010000000000000000000000100000000000000007f0000"
          "00200200000000000110000000000000010000000000000000001000007f0000"
          "00200200000000000210000000000000010000000100000000001000007f0000"
          "00200200000000000310000000000000202122232425262728292a2b2c2d2e2f"
          "404142434445464748494a4b4c4d4e4f78010004010000000000000000000000"
          "2122232425262728292a2b2c2d2e2f304142434445464748494a4b4c4d4e4f50"
          "7801000401000000000000000000000000000000020000001100000056341200"
          "0000010002000000120000005634120001000000020000001300000056341200"
          "01000100020000001400000056341200");
    CHECK(golden(encode(kPeerReady, 4, sampleVerdict()), "verdict") ==
          "5450500103000400a000000004000000a0a1a2a3a4a5a6a7a8a9aaabacadaeaf"
          "08000000ffffffff74776f206c6f63616c204843417320696e207375626e6574"
          "2031302e37372e302e302f323400000000000000000000000000000000000000"
          "0000000000000000000000000000000000000000000000000000000000000000"
          "0000000000000000000000000000000000000000000000000000000000000000"
          "00000000000000000000000000000000");
    // leftAfter (the former reserved1, zero above) in the last 8 bytes: an
    // orderly leave of rank 5 after epoch 0x0102030405060708. No version
    // bump: a daemon that predates it sends and ignores 0, the fault it meant.
    PeerVerdict left{};
    fill(left.groupId, 0xa0);
    left.errc = std::uint16_t(Errc::PeerLost);
    left.missingRank = 5;
    left.leftAfter = 0x0102030405060708ull;
    setText(left.reason, "rank 5 left");
    CHECK(golden(encode(kPeerBroken, 5, left), "left") ==
          "5450500103000500a000000005000000a0a1a2a3a4a5a6a7a8a9aaabacadaeaf"
          "040000000500000072616e6b2035206c65667400000000000000000000000000"
          "0000000000000000000000000000000000000000000000000000000000000000"
          "0000000000000000000000000000000000000000000000000000000000000000"
          "0000000000000000000000000000000000000000000000000000000000000000"
          "00000000000000000807060504030201");
    CHECK(decodeFixed<PeerVerdict>(payloadOf(encode(kPeerBroken, 5, left)), "PeerVerdict")->leftAfter == left.leftAfter);
}

TEST_CASE("the tcp wire's records: a tcp group lists nothing to register, PeerData, frame headers") {
    PeerGroup t = sampleGroup();
    t.regions.clear();
    t.hcas.clear();
    t.qps.clear();
    t.fixed.wire = kWireTcp;
    const Bytes b = encode(1, t);
    auto back = decodePeerGroup(ByteView(b).subspan(sizeof(MsgHeader)));
    REQUIRE(back);
    CHECK(back->fixed.wire == kWireTcp);
    SECTION("a tcp record that lists a region is refused") {
        PeerGroup bad = sampleGroup();
        bad.fixed.wire = kWireTcp;
        const Bytes e = encode(1, bad);
        CHECK(decodePeerGroup(ByteView(e).subspan(sizeof(MsgHeader))).code() == Errc::BadMessage);
    }
    SECTION("an unknown wire is refused") {
        t.fixed.wire = 9;
        const Bytes e = encode(1, t);
        auto r = decodePeerGroup(ByteView(e).subspan(sizeof(MsgHeader)));
        CHECK(r.code() == Errc::OutOfRange);
        CHECK(r.error().detail.find("wire 9") != std::string::npos);
    }
    SECTION("PeerData round-trips; reserved bytes are refused") {
        PeerData d{};
        fill(d.groupId, 0xa0);
        fill(d.nodeId, 0x10);
        auto r = decodeFixed<PeerData>(ByteView(encode(kPeerData, 2, d)).subspan(sizeof(MsgHeader)), "PeerData");
        REQUIRE(r);
        CHECK(std::memcmp(r->groupId, d.groupId, 16) == 0);
        d.reserved1 = 1;
        CHECK(decodeFixed<PeerData>(ByteView(encode(kPeerData, 2, d)).subspan(sizeof(MsgHeader)), "PeerData").code() ==
              Errc::BadMessage);
    }
    SECTION("frame headers: inside the slot, from the sender's ranks to ours, phase of the epoch") {
        const Layout layout = *Layout::of(4, slotBytesFor(65536), 1);
        TcpFrame f{kTcpFrameMagic, 0, 1, 0, 1, 0, 4096, 0, 3};
        CHECK(validate(f, layout, 0b0101, 0b1010));
        TcpFrame x = f;
        x.phase = 0;
        CHECK(validate(x, layout, 0b0101, 0b1010).code() == Errc::BadMessage);
        x = f;
        x.dst = 2;
        CHECK(validate(x, layout, 0b0101, 0b1010).code() == Errc::BadMessage);
        x = f;
        x.offset = layout.slotBytes - 100;
        CHECK(validate(x, layout, 0b0101, 0b1010).code() == Errc::OutOfRange);
        x = f;
        x.magic = 0;
        CHECK(validate(x, layout, 0b0101, 0b1010).code() == Errc::BadMagic);
        x = f;
        x.epoch = 0;
        CHECK_FALSE(validate(x, layout, 0b0101, 0b1010));
    }
}

TEST_CASE("PeerRejoin: a group's records and what landed, round-trip and refusals by name") {
    PeerRejoin m{sampleGroup(), kRejoinAnswer, {}};
    m.landed.push_back(LandedRecord{0, 2, 0, 41});
    m.landed.push_back(LandedRecord{1, 2, 0, 40});
    const Bytes b = encode(7, m);
    auto f = decodeFrame(b, kPeerSpec);
    REQUIRE(f.ok());
    CHECK(f->header.opcode == kPeerRejoin);
    auto back = decodePeerRejoin(f->payload);
    REQUIRE(back.ok());
    CHECK(back->flags == kRejoinAnswer);
    CHECK(back->group.qps.size() == 4);
    REQUIRE(back->landed.size() == 2);
    CHECK(back->landed[1].rank == 1);
    CHECK(back->landed[1].from == 2);
    CHECK(back->landed[1].epoch == 40);
    // PeerGroup's bytes, then RejoinFixed and the records.
    CHECK(b.size() == encode(7, m.group).size() + sizeof(RejoinFixed) + 2 * sizeof(LandedRecord));

    const ByteView p = payloadOf(b);
    for (std::size_t cut = 0; cut < p.size(); ++cut) REQUIRE(decodePeerRejoin(p.first(cut)).code() == Errc::Truncated);
    const auto refused = [&](PeerRejoin bad) {
        const Bytes x = encode(1, bad);
        return decodePeerRejoin(payloadOf(x));
    };
    PeerRejoin bad = m;
    bad.flags = 2;
    CHECK(refused(bad).code() == Errc::BadMessage);
    bad = m;
    bad.landed[0].from = 1; // both ranks the sender's: not a row from the receiver's node
    CHECK(refused(bad).code() == Errc::BadMessage);
    bad = m;
    bad.landed[0].rank = 3; // past world
    CHECK(refused(bad).code() == Errc::OutOfRange);
    bad = m;
    bad.landed[0].reserved = 1;
    CHECK(refused(bad).code() == Errc::OutOfRange);
    bad = m;
    bad.landed.assign(257, LandedRecord{0, 2, 0, 1});
    CHECK(refused(bad).code() == Errc::OutOfRange);
}
