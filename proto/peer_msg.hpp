// tpfabric — daemon <-> daemon records on the peer TCP link (DESIGN.md §3).
//
// Each message: MsgHeader (magic kPeerMagic) + one record. Daemons of
// different releases meet here, so the magic's top byte is the record-layout
// revision: any change to a struct below bumps it, and a daemon refuses a
// magic it does not know (BadMagic) before reading anything else.
//
// Sequence on a link: both send PeerHello (nonce); with a cluster key both
// send PeerAuth (HMAC over both hellos) and check the other's before any
// other record; then PeerGroup records per group both serve; then PeerReady
// per group (ok or the reason it is unavailable), later PeerBroken.
//
// A daemon that restarted and re-adopted a group spanning nodes opens a new
// link to each other node of it and sends PeerRejoin (its new regions and
// queue pairs, and what landed in its ranks' regions); the other node, which
// kept the group while the link was away, answers with its own PeerRejoin,
// then both send PeerReady, and each sends again what the other's record
// shows did not land.
//
// A group on the tcp wire has a second link per node pair, its data link
// (proto/tcp_frame.hpp): opened by the same side, with the same hellos and
// proofs, then one PeerData record naming the group; after it the link
// carries TcpFrames only, and is no longer read as records.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <tpfabric/error.hpp>
#include "proto/layout.hpp"
#include "proto/peer_wire.hpp"
#include "proto/wire.hpp"

namespace tpf::peer_proto {

inline constexpr std::uint32_t kPeerMagic = fourcc('T', 'P', 'P', 1);
/// 2: slots are sized slotBytesFor(cap) = page-rounded cap + 32; a daemon of
/// 1 computes other region offsets, so its RDMA writes would land elsewhere.
/// 3: PeerGroupFixed.daemonMax (the former reserved1, same layout) carries the
/// sender's daemon.max_bytes, which enters the agreed cap; a daemon of 2 sends
/// 0 there and refuses groups whose daemons differ in daemon.max_bytes.
/// Still 3 with PeerGroupFixed.wire (the former reserved0) and kPeerData: a
/// daemon before the tcp wire sends 0 there (verbs, as before), and refuses
/// a tcp group's record, which lists no HCA, by its pairing (no HCA pairs).
/// Still 3 with kPeerRejoin: a daemon before it fails the link on the
/// unknown opcode, and the group's restart ends as before it (PeerLost).
inline constexpr std::uint16_t kPeerVersion = 3;
inline constexpr std::uint16_t kPeerMinVersion = 3;
inline constexpr std::uint32_t kMaxPeerPayload = 64 * 1024;
inline constexpr ProtocolSpec kPeerSpec{"peer", kPeerMagic, kPeerMinVersion, kPeerVersion, kMaxPeerPayload};

inline constexpr std::uint32_t kMaxRegions = kMaxWorld * kMaxStripes;          ///< one per (rank, HCA)
inline constexpr std::uint32_t kMaxQps = kMaxWorld * kMaxWorld * kMaxStripes;   ///< one per (rank pair, rail)

enum Opcode : std::uint16_t {
    kPeerHello = 1,  ///< PeerHello
    kPeerAuth = 2,   ///< PeerAuth
    kPeerGroup = 3,  ///< PeerGroupFixed + RegionRecord[] + HcaRecord[] + QpRecord[]
    kPeerReady = 4,  ///< PeerVerdict: the sender brought up every QP (errc 0) or refuses the group
    kPeerBroken = 5, ///< PeerVerdict: a group the sender served broke (rank died, QP error)
    kPeerData = 6,   ///< PeerData: this link is the named group's tcp data link (its only record)
    kPeerRejoin = 7, ///< PeerGroup's records + RejoinFixed + LandedRecord[]: a group goes on after a daemon restart
};

/// First record each way. 64 bytes.
struct PeerHello {
    std::uint8_t nodeId[16];
    std::uint8_t nonce[32]; ///< fresh random bytes per link
    std::uint32_t flags;    ///< bit 0: sender has a cluster key and requires PeerAuth
    std::uint32_t reserved0;
    std::uint64_t reserved1;
};
static_assert(sizeof(PeerHello) == 64);
static_assert(offsetof(PeerHello, flags) == 48);
static_assert(std::is_trivially_copyable_v<PeerHello>);
inline constexpr std::uint32_t kHelloKeyed = 1;

/// Proof of the cluster key: HMAC-SHA-256(key, label || sender hello || receiver hello). 32 bytes.
struct PeerAuth {
    std::uint8_t mac[32];
};
static_assert(sizeof(PeerAuth) == 32);
static_assert(std::is_trivially_copyable_v<PeerAuth>);

/// One group as one daemon serves it, fixed part. 192 bytes.
struct PeerGroupFixed {
    std::uint8_t groupId[16];
    std::uint8_t nodeId[16];    ///< sender
    std::uint32_t world;        ///< 2..16
    std::uint32_t localRanks;   ///< bit r: the sender serves rank r
    std::uint32_t regionCount;  ///< RegionRecord that follow, <= kMaxRegions
    std::uint32_t hcaCount;     ///< HcaRecord that follow, <= kMaxStripes
    std::uint32_t qpCount;      ///< QpRecord that follow, <= kMaxQps
    /// The wire between the nodes: kWireVerbs (or 0, from a daemon before
    /// the tcp wire) or kWireTcp; both nodes chose it from the same roster.
    /// A tcp record lists no region, HCA or QP.
    std::uint32_t wire;
    std::uint64_t caps[16];     ///< every rank's roster maxBytes as the sender knows it (0 past world); equal on every node
    /// The sender's daemon.max_bytes, 1..1 GiB. The group's agreed cap is the
    /// minimum of every caps[r] and every daemon's daemonMax; a receiver refuses
    /// (CapMismatch) a sender whose daemonMax is below the cap it agreed itself.
    std::uint64_t daemonMax;
};
static_assert(sizeof(PeerGroupFixed) == 192);
static_assert(offsetof(PeerGroupFixed, world) == 32);
static_assert(offsetof(PeerGroupFixed, wire) == 52);
static_assert(offsetof(PeerGroupFixed, caps) == 56);
static_assert(offsetof(PeerGroupFixed, daemonMax) == 184);
static_assert(std::is_trivially_copyable_v<PeerGroupFixed>);

/// A local rank's region as registered on one HCA. 32 bytes.
struct RegionRecord {
    std::uint32_t rank;
    std::uint32_t hca;   ///< index into the sender's HcaRecord list
    std::uint64_t addr;  ///< remote virtual address for RDMA WRITE
    std::uint64_t bytes; ///< Layout::totalBytes()
    std::uint32_t rkey;
    std::uint32_t reserved;
};
static_assert(sizeof(RegionRecord) == 32);
static_assert(offsetof(RegionRecord, rkey) == 24);
static_assert(std::is_trivially_copyable_v<RegionRecord>);

/// One of the sender's HCAs. 48 bytes.
struct HcaRecord {
    std::uint8_t gid[16];
    std::uint8_t subnet[16];
    std::uint8_t prefixLen;
    std::uint8_t port;
    std::uint16_t mtu;      ///< active MTU bytes: 256, 512, 1024, 2048 or 4096
    std::uint32_t gidIndex;
    std::uint64_t reserved;
};
static_assert(sizeof(HcaRecord) == 48);
static_assert(offsetof(HcaRecord, mtu) == 34);
static_assert(std::is_trivially_copyable_v<HcaRecord>);

/// The sender's RC QP for (its HCA, its local rank, a remote rank). 16 bytes.
struct QpRecord {
    std::uint8_t hca;         ///< index into the sender's HcaRecord list
    std::uint8_t reserved0;
    std::uint16_t localRank;  ///< rank the sender serves
    std::uint16_t remoteRank; ///< rank on the receiver's node
    std::uint16_t reserved1;
    std::uint32_t qpn;        ///< 24-bit QP number
    std::uint32_t psn;        ///< 24-bit initial packet sequence number
};
static_assert(sizeof(QpRecord) == 16);
static_assert(offsetof(QpRecord, qpn) == 8);
static_assert(std::is_trivially_copyable_v<QpRecord>);

struct PeerGroup {
    PeerGroupFixed fixed{};
    std::vector<RegionRecord> regions;
    std::vector<HcaRecord> hcas;
    std::vector<QpRecord> qps;
};

/// What follows the PeerGroup records in a PeerRejoin. 8 bytes.
struct RejoinFixed {
    std::uint32_t landedCount; ///< LandedRecord that follow, <= kMaxWorld * kMaxWorld
    std::uint32_t flags;       ///< kRejoinAnswer
};
static_assert(sizeof(RejoinFixed) == 8);
static_assert(std::is_trivially_copyable_v<RejoinFixed>);
/// RejoinFixed::flags: the node that kept the group answers a restarted one.
inline constexpr std::uint32_t kRejoinAnswer = 1u;

/// In the region of `rank` (a rank the sender serves), the rows of `from` (a
/// rank the receiver serves) have landed up to and including epoch `epoch`
/// on every stripe: the receiver sends `from`'s later epochs again. 16 bytes.
struct LandedRecord {
    std::uint16_t rank;
    std::uint16_t from;
    std::uint32_t reserved; ///< 0
    std::uint64_t epoch;
};
static_assert(sizeof(LandedRecord) == 16);
static_assert(offsetof(LandedRecord, epoch) == 8);
static_assert(std::is_trivially_copyable_v<LandedRecord>);

/// A group as a daemon serves it after a restart (or as the node that kept
/// it answers): its record, and what landed in its ranks' regions.
struct PeerRejoin {
    PeerGroup group;
    std::uint32_t flags = 0; ///< kRejoinAnswer
    std::vector<LandedRecord> landed;
};

/// Ready / broken for one group. 160 bytes.
struct PeerVerdict {
    std::uint8_t groupId[16];
    std::uint16_t errc;         ///< 0 = ready
    std::uint16_t reserved0;
    std::uint32_t missingRank;  ///< kNoPeer if none
    char reason[128];           ///< NUL-terminated
    /// kPeerBroken with errc PeerLost only: missingRank closed in order
    /// after posting epochs 1..leftAfter (ControlBlock::carriedThrough,
    /// kCarriedUnknown when its daemon cannot tell), and the group's other
    /// ranks go on carrying shards of those epochs. 0: a fault, nothing more
    /// is carried. Was reserved (zero): a daemon that predates it sends and
    /// reads 0, which is the older meaning, so the magic is unchanged.
    std::uint64_t leftAfter;
};
static_assert(sizeof(PeerVerdict) == 160);
static_assert(offsetof(PeerVerdict, reason) == 24);
static_assert(offsetof(PeerVerdict, leftAfter) == 152);
static_assert(std::is_trivially_copyable_v<PeerVerdict>);

/// The only record on a tcp data link, from the side that opened it. 48 bytes.
struct PeerData {
    std::uint8_t groupId[16];
    std::uint8_t nodeId[16]; ///< sender
    std::uint64_t reserved0; ///< 0
    std::uint64_t reserved1; ///< 0
};
static_assert(sizeof(PeerData) == 48);
static_assert(offsetof(PeerData, reserved0) == 32);
static_assert(std::is_trivially_copyable_v<PeerData>);

// ---- validation --------------------------------------------------------

inline Status validate(const PeerData& m) {
    if (m.reserved0 || m.reserved1) return {Errc::BadMessage, "PeerData: reserved fields not 0"};
    return okStatus();
}

inline Status validate(const PeerHello& m) {
    if (m.flags & ~kHelloKeyed) return {Errc::BadMessage, "PeerHello: unknown flags " + std::to_string(m.flags)};
    return okStatus();
}
inline Status validate(const PeerAuth&) { return okStatus(); }

inline Status validate(const PeerVerdict& m) {
    Errc e;
    if (!errcFromWire(m.errc, e)) return {Errc::OutOfRange, "PeerVerdict: unknown error code " + std::to_string(m.errc)};
    if (m.missingRank != kNoPeer && m.missingRank >= kMaxWorld)
        return {Errc::OutOfRange, "PeerVerdict: missing rank " + std::to_string(m.missingRank)};
    std::string s;
    if (!getText(m.reason, s)) return {Errc::BadMessage, "PeerVerdict: reason not terminated"};
    return okStatus();
}

inline bool validMtu(std::uint16_t mtu) {
    return mtu == 256 || mtu == 512 || mtu == 1024 || mtu == 2048 || mtu == 4096;
}

inline Status validate(const PeerGroup& m) {
    const auto& f = m.fixed;
    const auto world = f.world;
    if (f.wire != 0 && f.wire != kWireVerbs && f.wire != kWireTcp)
        return {Errc::OutOfRange, "PeerGroup: wire " + std::to_string(f.wire) + " is neither verbs nor tcp"};
    if (f.wire == kWireTcp && (f.regionCount || f.hcaCount || f.qpCount))
        return {Errc::BadMessage, "PeerGroup: a tcp record lists regions, HCAs or QPs"};
    for (const auto& r : m.regions) {
        if (r.rank >= world) return {Errc::OutOfRange, "PeerGroup: region of rank " + std::to_string(r.rank)};
        if (!(f.localRanks >> r.rank & 1u))
            return {Errc::BadMessage, "PeerGroup: region of rank " + std::to_string(r.rank) + " the sender does not serve"};
        if (r.hca >= f.hcaCount) return {Errc::OutOfRange, "PeerGroup: region on HCA " + std::to_string(r.hca)};
        if (r.bytes == 0 || r.bytes > 4 * kMaxSlotBytes * kMaxWorld)
            return {Errc::OutOfRange, "PeerGroup: region of " + std::to_string(r.bytes) + " bytes"};
    }
    for (const auto& h : m.hcas) {
        if (h.prefixLen > 128) return {Errc::OutOfRange, "PeerGroup: prefix length " + std::to_string(h.prefixLen)};
        if (!validMtu(h.mtu)) return {Errc::OutOfRange, "PeerGroup: MTU " + std::to_string(h.mtu)};
    }
    for (const auto& q : m.qps) {
        if (q.hca >= f.hcaCount) return {Errc::OutOfRange, "PeerGroup: QP on HCA " + std::to_string(q.hca)};
        if (q.localRank >= world || q.remoteRank >= world || q.localRank == q.remoteRank)
            return {Errc::OutOfRange, "PeerGroup: QP for ranks " + std::to_string(q.localRank) + "->" +
                                          std::to_string(q.remoteRank)};
        if (!(f.localRanks >> q.localRank & 1u) || (f.localRanks >> q.remoteRank & 1u))
            return {Errc::BadMessage, "PeerGroup: QP between ranks " + std::to_string(q.localRank) + " and " +
                                          std::to_string(q.remoteRank) + " does not cross nodes"};
        if (q.qpn >> 24 || q.psn >> 24) return {Errc::OutOfRange, "PeerGroup: QPN or PSN above 24 bits"};
    }
    return okStatus();
}

// ---- encode / decode ---------------------------------------------------

template <class T>
inline Bytes encode(std::uint16_t opcode, std::uint32_t seq, const T& rec) {
    Bytes out = encodeHeader(kPeerSpec, opcode, seq, sizeof(T));
    Writer w;
    w.put(rec);
    out.insert(out.end(), w.bytes().begin(), w.bytes().end());
    return out;
}

// PeerGroup's records, as kPeerGroup and kPeerRejoin carry them.
inline void putGroup(Writer& w, const PeerGroup& m) {
    PeerGroupFixed f = m.fixed;
    f.regionCount = std::uint32_t(m.regions.size());
    f.hcaCount = std::uint32_t(m.hcas.size());
    f.qpCount = std::uint32_t(m.qps.size());
    w.put(f)
        .putAll(std::span<const RegionRecord>(m.regions))
        .putAll(std::span<const HcaRecord>(m.hcas))
        .putAll(std::span<const QpRecord>(m.qps));
}

inline Bytes encode(std::uint32_t seq, const PeerGroup& m) {
    Writer w;
    putGroup(w, m);
    Bytes out = encodeHeader(kPeerSpec, kPeerGroup, seq, std::uint32_t(w.bytes().size()));
    out.insert(out.end(), w.bytes().begin(), w.bytes().end());
    return out;
}

inline Bytes encode(std::uint32_t seq, const PeerRejoin& m) {
    Writer w;
    putGroup(w, m.group);
    w.put(RejoinFixed{std::uint32_t(m.landed.size()), m.flags}).putAll(std::span<const LandedRecord>(m.landed));
    Bytes out = encodeHeader(kPeerSpec, kPeerRejoin, seq, std::uint32_t(w.bytes().size()));
    out.insert(out.end(), w.bytes().begin(), w.bytes().end());
    return out;
}

// PeerGroup's records from `r`, checked; the caller finishes the reader.
inline Result<PeerGroup> getGroup(Reader& r) {
    PeerGroup m;
    auto& f = m.fixed;
    if (auto s = r.get(f); !s) return s.error();
    if (f.world < 2 || f.world > kMaxWorld)
        return {Errc::OutOfRange, "PeerGroup: world " + std::to_string(f.world) + " outside 2..16"};
    if (f.localRanks == 0 || f.localRanks >> f.world)
        return {Errc::OutOfRange, "PeerGroup: local rank mask " + std::to_string(f.localRanks) + " for world " +
                                      std::to_string(f.world)};
    if (f.regionCount > kMaxRegions || f.hcaCount > kMaxStripes || f.qpCount > kMaxQps)
        return {Errc::OutOfRange, "PeerGroup: counts regions " + std::to_string(f.regionCount) + ", HCAs " +
                                      std::to_string(f.hcaCount) + ", QPs " + std::to_string(f.qpCount) +
                                      " above 128 / 8 / 2048"};
    for (std::uint32_t i = f.world; i < kMaxWorld; ++i)
        if (f.caps[i] != 0) return {Errc::BadMessage, "PeerGroup: cap given for rank " + std::to_string(i) + " past world"};
    for (std::uint32_t i = 0; i < f.world; ++i)
        if (f.caps[i] > kMaxCapBytes) return {Errc::OutOfRange, "PeerGroup: cap of rank " + std::to_string(i) + " above 1 GiB"};
    if (f.daemonMax == 0 || f.daemonMax > kMaxCapBytes)
        return {Errc::OutOfRange, "PeerGroup: daemon max " + std::to_string(f.daemonMax) + " outside 1..1 GiB"};
    if (auto s = r.getAll(m.regions, f.regionCount); !s) return s.error();
    if (auto s = r.getAll(m.hcas, f.hcaCount); !s) return s.error();
    if (auto s = r.getAll(m.qps, f.qpCount); !s) return s.error();
    if (auto s = validate(m); !s) return s.error();
    return m;
}

inline Result<PeerGroup> decodePeerGroup(ByteView payload) {
    Reader r(payload, "PeerGroup");
    auto m = getGroup(r);
    if (!m) return m.error();
    if (auto s = r.finish(); !s) return s.error();
    return m;
}

inline Result<PeerRejoin> decodePeerRejoin(ByteView payload) {
    Reader r(payload, "PeerRejoin");
    PeerRejoin m;
    auto g = getGroup(r);
    if (!g) return g.error();
    m.group = std::move(*g);
    RejoinFixed f{};
    if (auto s = r.get(f); !s) return s.error();
    if (f.flags & ~kRejoinAnswer) return {Errc::BadMessage, "PeerRejoin: unknown flags " + std::to_string(f.flags)};
    if (f.landedCount > kMaxWorld * kMaxWorld)
        return {Errc::OutOfRange, "PeerRejoin: " + std::to_string(f.landedCount) + " landed records, above 256"};
    m.flags = f.flags;
    if (auto s = r.getAll(m.landed, f.landedCount); !s) return s.error();
    if (auto s = r.finish(); !s) return s.error();
    const auto& gf = m.group.fixed;
    for (const auto& l : m.landed) {
        if (l.rank >= gf.world || l.from >= gf.world || l.reserved)
            return {Errc::OutOfRange, "PeerRejoin: landed record of ranks " + std::to_string(l.rank) + "<-" +
                                          std::to_string(l.from)};
        if (!(gf.localRanks >> l.rank & 1u) || (gf.localRanks >> l.from & 1u))
            return {Errc::BadMessage, "PeerRejoin: landed record of ranks " + std::to_string(l.rank) + "<-" +
                                          std::to_string(l.from) + " does not cross nodes"};
    }
    return m;
}



} // namespace tpf::peer_proto
