// tpfabric — client <-> daemon records on the Unix control socket.
//
// Each message: MsgHeader (magic kClientMagic) + one record below. File
// descriptors travel beside a message as SCM_RIGHTS; each opcode's comment
// below says how many (kVerdictFds, kAdoptFds). Replies echo the request's
// seq. The daemon refuses a wrong magic,
// a version outside [kClientMinVersion, kClientVersion], an unknown opcode, a
// length that does not match the record, and out-of-range fields, with an
// ErrorReply naming the failure, and then closes that connection only.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <tpfabric/error.hpp>
#include "proto/layout.hpp"
#include "proto/peer_wire.hpp"
#include "proto/ring.hpp"
#include "proto/wire.hpp"

namespace tpf::client_proto {

/// Record-layout revision is the top byte: any layout change bumps it.
inline constexpr std::uint32_t kClientMagic = fourcc('T', 'P', 'C', 1);
/// 2: slots are sized slotBytesFor(cap) = page-rounded cap + 32 (room for an
/// all-gather-v RowHeader); a client of 1 would map another region layout.
/// 3: DeviceAttach (a Device group rank's final GPU wires). A daemon of 2
/// would refuse it as an unknown opcode and close the rank's connection,
/// breaking its group; a rank of 2 never sends it, so its daemon would poll
/// its Device groups forever. Replies carry the sender's version, so both
/// ends must speak 3.
/// 4: kOpenHostDirect, Verdict.hostPeers and PeerHostRegion (same-node ranks
/// of a Host group exchange shards through each other's regions; the proxy
/// carries only what crosses nodes). A daemon of 3 would refuse the flag; a
/// rank of 3 would ring for every peer, so its daemon skipping same-node
/// peers would lose shards. Both ends must speak 4.
/// 5: host-direct pulls (2e0aa75): a rank publishes its row by its own flags
/// in its own region and reads its peers' rows from theirs, where a rank of
/// 4 wrote its row into each peer's region and waited in its own: ranks of 4
/// and 5 in one group would each wait for rows the other never writes. One
/// daemon speaks one version, so its groups never mix them. Both ends must
/// speak 5.
/// 6: a Host group's allGather and allReduceSum rows carry a RowTrailer
/// (proto/layout.hpp), checked by every receiver: a rank of 5 writes none,
/// so a rank of 6 would fail every call with it as GroupMismatch. Both ends
/// must speak 6.
/// 7: Adopt and Adopted (a restarted daemon re-adopts a one-node Host
/// group: each rank hands its region and ring back). A daemon of 6 would
/// refuse Adopt as an unknown opcode; replies carry the sender's version, so
/// both ends must speak 7.
/// Still 7 with kGroupFailed: a rank of 7 before it reads an open group's
/// connection only to drop what comes (or not at all), so the message is
/// lost on it and its failures read as before.
inline constexpr std::uint16_t kClientVersion = 7;
inline constexpr std::uint16_t kClientMinVersion = 7;
inline constexpr std::uint32_t kMaxRequestPayload = 64 * 1024;     ///< client -> daemon
inline constexpr std::uint32_t kMaxReplyPayload = 4 * 1024 * 1024; ///< daemon -> client (status JSON)

inline constexpr ProtocolSpec kRequestSpec{"client request", kClientMagic, kClientMinVersion, kClientVersion,
                                           kMaxRequestPayload};
inline constexpr ProtocolSpec kReplySpec{"daemon reply", kClientMagic, kClientMinVersion, kClientVersion,
                                         kMaxReplyPayload};

enum Opcode : std::uint16_t {
    kHello = 1,           ///< client -> daemon: Hello
    kHelloReply = 2,      ///< daemon -> client: HelloReply
    kNodeCardRequest = 3, ///< client -> daemon: empty
    kNodeCard = 4,        ///< daemon -> client: NodeCardFixed + HcaCard[hcaCount]
    kGroupOpen = 5,       ///< client -> daemon: GroupOpenFixed + RosterEntry[world]
    kVerdict = 6,         ///< daemon -> client: Verdict (+3 fds when ok: region, ring, proxy eventfd)
    kAbort = 7,           ///< client -> daemon: Abort
    kClose = 8,           ///< client -> daemon: empty; the daemon answers kClosed and closes
    kStatusRequest = 9,   ///< client -> daemon: StatusRequest
    kStatusReply = 10,    ///< daemon -> client: JSON text (UTF-8, no NUL)
    kErrorReply = 11,     ///< daemon -> client: ErrorReply; the connection closes after it
    kClosed = 12,         ///< daemon -> client: empty, acknowledges kClose
    kShareRegion = 13,    ///< client -> daemon: ShareRegion + 1 fd (its device region, POSIX fd of cuMemCreate)
    kPeerRegion = 14,     ///< daemon -> client: PeerRegion + 1 fd (a same-node member's shared device region)
    kOpenReport = 15,     ///< client -> daemon: OpenReport; no reply
    kDeviceAttach = 16,   ///< client -> daemon: DeviceAttach; no reply
    kPeerHostRegion = 17, ///< daemon -> client: PeerHostRegion + 1 fd (a same-node member's host region memfd)
    kAdopt = 18,          ///< client -> daemon: AdoptFixed + RosterEntry[world] + 2 fds (own region memfd, own ring memfd)
    kAdopted = 19,        ///< daemon -> client: Adopted (+1 fd when ok: the new proxy eventfd)
    kGroupFailed = 20,    ///< daemon -> client: GroupFailed, unasked; no reply
};

/// Who connects. Hello.role.
enum Role : std::uint32_t { kRoleRank = 1, kRoleControl = 2 };

/// GroupOpen.flags.
enum OpenFlags : std::uint32_t {
    /// A Device group: doorbells may come from GPU kernels, which cannot
    /// write the proxy eventfd. The proxy polls a member's ring without
    /// sleeping from its open until its DeviceAttach says no peer of it is on
    /// a proxy route (ipc only), and for as long as one is.
    kOpenGpuDoorbells = 1,
    /// A Host group rank that exchanges shards with the group's other
    /// host-direct ranks on this node itself, through their regions (the
    /// host-direct path; it reads their rows from their regions): the
    /// daemon sends it their region memfds (PeerHostRegion, one per rank in
    /// Verdict.hostPeers) right after the verdict, and its proxy carries that
    /// rank's doorbells to ranks of other nodes only. Not with
    /// kOpenGpuDoorbells (BadMessage).
    kOpenHostDirect = 2,
};

/// Region kind; GroupOpen.regionKind.
enum RegionKind : std::uint32_t { kRegionHost = 1, kRegionDevice = 2 };

/// First message on every connection. 16 bytes.
struct Hello {
    std::uint32_t role;     ///< Role
    std::uint32_t flags;    ///< none defined; 0
    std::uint64_t reserved; ///< 0
};
static_assert(sizeof(Hello) == 16);
static_assert(std::is_trivially_copyable_v<Hello>);

/// Daemon's answer to Hello. 64 bytes.
struct HelloReply {
    std::uint8_t nodeId[16];     ///< this node's id (stable across restarts: from /etc/machine-id)
    char daemonVersion[32];      ///< NUL-terminated release string
    std::uint64_t startedUnixNs; ///< daemon start, wall clock
    std::uint32_t protocol;      ///< kClientVersion of the daemon
    std::uint32_t reserved;
};
static_assert(sizeof(HelloReply) == 64);
static_assert(offsetof(HelloReply, startedUnixNs) == 48);
static_assert(std::is_trivially_copyable_v<HelloReply>);

/// One HCA port as the node card and status describe it. 64 bytes.
struct HcaCard {
    std::uint8_t gid[16];    ///< RoCE v2 GID of the configured IP
    std::uint8_t subnet[16]; ///< IPv4-mapped / IPv6 subnet address
    char device[16];         ///< "mlx5_0", NUL-terminated
    std::uint8_t port;       ///< 1-based port number
    std::uint8_t prefixLen;  ///< of the 128-bit subnet form
    std::uint16_t mtu;       ///< active MTU, bytes (256..4096)
    std::uint32_t speedMbps; ///< link speed
    std::uint32_t state;     ///< IBV_PORT_* value (4 = ACTIVE)
    std::uint32_t gidIndex;  ///< index of `gid` in the port's GID table
};
static_assert(sizeof(HcaCard) == 64);
static_assert(offsetof(HcaCard, port) == 48);
static_assert(std::is_trivially_copyable_v<HcaCard>);

/// A daemon's node card, fixed part. 48 bytes.
struct NodeCardFixed {
    std::uint8_t nodeId[16];
    std::uint8_t endpointAddr[16]; ///< peer-negotiation address (IPv4-mapped or IPv6)
    std::uint16_t endpointPort;    ///< peer-negotiation TCP port, 0 when none
    std::uint16_t hcaCount;        ///< HcaCard records that follow, <= kMaxStripes
    /// The wire this daemon offers to other nodes' daemons: kWireVerbs, or
    /// kWireTcp when it has no usable HCA or peer.wire = "tcp". 0 (a daemon
    /// before the tcp wire) is verbs.
    std::uint8_t peerWire;
    std::uint8_t reserved0;
    std::uint16_t reserved1;
    std::uint64_t usableCap;       ///< largest shard this daemon serves, bytes
};
static_assert(sizeof(NodeCardFixed) == 48);
static_assert(offsetof(NodeCardFixed, peerWire) == 36);
static_assert(offsetof(NodeCardFixed, usableCap) == 40);
static_assert(std::is_trivially_copyable_v<NodeCardFixed>);

struct NodeCard {
    NodeCardFixed fixed{};
    std::vector<HcaCard> hcas;
};

/// What every rank contributes to the roster (all-gathered over the bootstrap). 48 bytes.
struct RosterEntry {
    std::uint8_t nodeId[16];
    std::uint8_t endpointAddr[16]; ///< that rank's daemon, for peer negotiation
    std::uint16_t endpointPort;
    /// NodeCardFixed::peerWire of that rank's daemon. A group whose roster
    /// has a kWireTcp entry crosses nodes over tcp on every node, else over
    /// verbs (0, a client before the tcp wire: verbs).
    std::uint8_t peerWire;
    std::uint8_t reserved0;
    std::uint32_t pid;             ///< that rank's process id, for status
    std::uint64_t maxBytes;        ///< that rank's usable maximum: min(its maxBytes, its daemon's cap)
};
static_assert(sizeof(RosterEntry) == 48);
static_assert(offsetof(RosterEntry, peerWire) == 34);
static_assert(offsetof(RosterEntry, maxBytes) == 40);
static_assert(std::is_trivially_copyable_v<RosterEntry>);

/// Open (join) a group as one rank, fixed part. 48 bytes; RosterEntry[world] follows.
struct GroupOpenFixed {
    std::uint8_t groupId[16];  ///< drawn by rank 0, shared over the bootstrap
    std::uint32_t rank;        ///< < world
    std::uint32_t world;       ///< 2..16
    std::uint64_t maxBytes;    ///< this rank's usable maximum shard, bytes
    std::uint32_t timeoutMs;   ///< how long the daemon waits for the other local ranks (1..600000)
    std::uint32_t regionKind;  ///< RegionKind
    std::uint32_t flags;       ///< OpenFlags
    std::uint32_t reserved;
};
static_assert(sizeof(GroupOpenFixed) == 48);
static_assert(offsetof(GroupOpenFixed, maxBytes) == 24);
static_assert(std::is_trivially_copyable_v<GroupOpenFixed>);

struct GroupOpen {
    GroupOpenFixed fixed{};
    std::vector<RosterEntry> roster;
};

/// The daemon's verdict on a GroupOpen, the same for every member. 192 bytes.
/// When errc == 0 three fds follow: region memfd (Layout-sized), ring memfd
/// (RingLayout-sized), proxy eventfd (write 1 to wake an idle proxy). Then,
/// for a rank that opened with kOpenHostDirect, one PeerHostRegion message
/// per bit of hostPeers, in rank order.
struct Verdict {
    std::uint16_t errc;         ///< 0 = ok, else why the fabric path is unavailable
    std::uint16_t hostPeers;    ///< bit per rank whose region memfd follows (PeerHostRegion); 0 unless kOpenHostDirect
    std::uint32_t rank;
    std::uint32_t world;
    std::uint32_t stripes;      ///< Layout stripes
    std::uint64_t agreedCap;    ///< exact minimum of every rank's maxBytes and every daemon's daemon.max_bytes
    std::uint64_t slotBytes;    ///< slotBytesFor(agreedCap)
    std::uint64_t regionBytes;  ///< Layout::totalBytes()
    std::uint32_t groupHandle;  ///< daemon-local handle, goes into every Doorbell
    std::uint32_t ringEntries;  ///< RingLayout entries
    std::uint8_t wires[16];    ///< Wire per rank, kWireSelf at `rank`
    char reason[128];           ///< human reason when errc != 0, NUL-terminated
};
static_assert(sizeof(Verdict) == 192);
static_assert(offsetof(Verdict, hostPeers) == 2);
static_assert(offsetof(Verdict, agreedCap) == 16);
static_assert(offsetof(Verdict, groupHandle) == 40);
static_assert(offsetof(Verdict, wires) == 48);
static_assert(offsetof(Verdict, reason) == 64);
static_assert(std::is_trivially_copyable_v<Verdict>);
inline constexpr std::uint32_t kVerdictFds = 3;

/// A member of an open group shares its device region (ipc route) with the
/// other members on this node: one fd (cuMemExportToShareableHandle, POSIX
/// fd) beside the message. The daemon only brokers: it refuses the fd from a
/// connection not in an open group and forwards it, as PeerRegion, to the
/// members of that group only. No reply to the sender. 16 bytes.
struct ShareRegion {
    std::uint64_t bytes;    ///< allocation size (cuMemCreate granularity), >= Layout::totalBytes(), <= 2 GiB
    std::uint32_t reserved0;
    std::uint32_t reserved1;
};
static_assert(sizeof(ShareRegion) == 16);
static_assert(std::is_trivially_copyable_v<ShareRegion>);
inline constexpr std::uint64_t kMaxSharedRegionBytes = 2ull << 30;

/// Another member's ShareRegion as the daemon forwards it (1 fd beside it). 16 bytes.
struct PeerRegion {
    std::uint32_t rank;     ///< the sharing member's rank in the group
    std::uint32_t reserved;
    std::uint64_t bytes;    ///< as in its ShareRegion
};
static_assert(sizeof(PeerRegion) == 16);
static_assert(offsetof(PeerRegion, bytes) == 8);
static_assert(std::is_trivially_copyable_v<PeerRegion>);

/// Another member's host region, sent by the daemon after the Verdict to a
/// rank that opened with kOpenHostDirect (1 fd beside it: the member's sealed
/// region memfd, to be mapped read-write, shared). The receiver copies its
/// shard into slot (phase, its rank) of that region and release-stores the
/// epoch into the matching flags, as the proxy would. 16 bytes.
struct PeerHostRegion {
    std::uint32_t rank;     ///< the member's rank in the group (a bit of Verdict.hostPeers)
    std::uint32_t reserved; ///< 0
    std::uint64_t bytes;    ///< its region's size: Verdict.regionBytes
};
static_assert(sizeof(PeerHostRegion) == 16);
static_assert(offsetof(PeerHostRegion, bytes) == 8);
static_assert(std::is_trivially_copyable_v<PeerHostRegion>);

/// OpenReport.outcome: where a group went that did not take the fabric path.
enum OpenOutcome : std::uint16_t {
    kOutcomeNccl = 1,        ///< NCCL takes the group's calls (Device buffers with a communicator)
    kOutcomeUnavailable = 2, ///< the open failed with Unavailable (host buffers, or TPF_FALLBACK=error)
};

/// A rank tells its daemon, for the metrics only, that its open did not take
/// the fabric path and why; sent once, just before it leaves, on a connection
/// that said Hello as a rank, whether or not it joined a group (the daemon
/// may have refused it, or another rank's daemon, or the probe failed). No
/// reply. Ranks whose open never reached a daemon (TPF_DISABLE, no daemon)
/// send nothing. A daemon older than this record refuses it as an unknown
/// opcode, which costs only the count: the rank is leaving anyway. 16 bytes.
struct OpenReport {
    std::uint16_t errc;      ///< Errc why the fabric path was not taken; never 0
    std::uint16_t outcome;   ///< OpenOutcome
    std::uint32_t reserved0; ///< 0
    std::uint64_t reserved1; ///< 0
};
static_assert(sizeof(OpenReport) == 16);
static_assert(offsetof(OpenReport, outcome) == 2);
static_assert(offsetof(OpenReport, reserved1) == 8);
static_assert(std::is_trivially_copyable_v<OpenReport>);

/// A member of an open Device group (opened with kOpenGpuDoorbells) reports
/// its GPU attach, once, when it is done (after the load-time probe): the
/// route its kernels take to each peer and the bytes of its own device
/// region. The daemon shows both in status and polls the member's ring for
/// GPU doorbells only while some route is a proxy route (shm or verbs:
/// proxyCarries). No reply. Refused, and the connection closed (its group
/// breaks), from a connection in no open Device group, for another group's
/// handle, another rank or world, a second report, an ipc route to a rank of
/// another node or a proxy route the daemon cannot carry. 40 bytes.
struct DeviceAttach {
    std::uint32_t group;       ///< Verdict.groupHandle
    std::uint32_t rank;        ///< the sender's rank, as it joined
    std::uint32_t world;       ///< the group's world, 2..16
    std::uint32_t reserved;    ///< 0
    std::uint64_t deviceBytes; ///< own device region (cuMemCreate size), 0..2 GiB; 0 when none was created
    std::uint8_t wires[16];   ///< Wire per rank: kWireSelf at `rank`, kWireShm / kWireVerbs / kWireIpc / kWireTcp
                               ///< to peers below `world`, 0 from `world` on
};
static_assert(sizeof(DeviceAttach) == 40);
static_assert(offsetof(DeviceAttach, deviceBytes) == 16);
static_assert(offsetof(DeviceAttach, wires) == 24);
static_assert(std::is_trivially_copyable_v<DeviceAttach>);

/// Some peer of the report is on a proxy route: the sender's kernels ring the proxy.
inline bool ringsProxy(const DeviceAttach& m) { return anyProxyCarries(m.wires, m.world < kMaxWorld ? m.world : kMaxWorld); }

/// A rank of an open group asks a restarted daemon to re-adopt it (a Host
/// group, or a Device group with every rank on this node): the daemon it
/// opened with closed its connection, and this rank kept what it owns (its
/// region and ring, mapped; a Device group's rank also its device region and
/// ipc mappings, and it says in ipcPeers and deviceBytes what its
/// DeviceAttach said, so the proxy carries its ring as before). Sent after Hello on
/// a fresh connection, with two fds beside it: the rank's own region memfd
/// (sealed, regionBytes) and its command ring memfd (sealed,
/// RingLayout{ringEntries}.totalBytes()). The daemon waits up to timeoutMs
/// (and daemon.open_timeout_ms) for every local rank of the group, then
/// answers every one alike: Adopted with errc 0 and the proxy eventfd, or a
/// refusal naming why (all or none). Fixed part 88 bytes; RosterEntry[world]
/// follows, as the group opened.
struct AdoptFixed {
    std::uint8_t groupId[16];  ///< the group's id, as it opened
    std::uint32_t rank;        ///< < world
    std::uint32_t world;       ///< 2..16
    std::uint32_t groupHandle; ///< Verdict.groupHandle: its doorbells and ring header carry it
    std::uint32_t ringEntries; ///< Verdict.ringEntries
    std::uint64_t agreedCap;   ///< Verdict.agreedCap
    std::uint64_t slotBytes;   ///< Verdict.slotBytes
    std::uint64_t regionBytes; ///< Verdict.regionBytes
    std::uint32_t stripes;     ///< Verdict.stripes
    std::uint32_t timeoutMs;   ///< how long the daemon waits for the other local ranks (1..600000)
    std::uint32_t flags;       ///< OpenFlags the rank opened with (kOpenHostDirect, kOpenGpuDoorbells or 0)
    std::uint32_t ipcPeers;    ///< kOpenGpuDoorbells: bit per rank its kernels reach by ipc (DeviceAttach.wires), else 0
    std::uint64_t lostUnixNs;  ///< wall clock when the rank saw its daemon's connection close
    std::uint64_t deviceBytes; ///< kOpenGpuDoorbells: DeviceAttach.deviceBytes, else 0
};
static_assert(sizeof(AdoptFixed) == 88);
static_assert(offsetof(AdoptFixed, agreedCap) == 32);
static_assert(offsetof(AdoptFixed, stripes) == 56);
static_assert(offsetof(AdoptFixed, lostUnixNs) == 72);
static_assert(std::is_trivially_copyable_v<AdoptFixed>);
inline constexpr std::uint32_t kAdoptFds = 2;

struct Adopt {
    AdoptFixed fixed{};
    std::vector<RosterEntry> roster;
};

/// The daemon's answer to an Adopt, the same for every local rank of the
/// group. errc 0: re-adopted, one fd beside it (the new proxy eventfd); the
/// proxy carries the rank's ring again from where the old daemon left it.
/// Else why not (every rank of the group is refused alike), no fd. 160 bytes.
struct Adopted {
    std::uint16_t errc;        ///< 0 = re-adopted, else why not
    std::uint16_t reserved0;   ///< 0
    std::uint32_t rank;        ///< the rank it answers
    std::uint32_t groupHandle; ///< as the Adopt said
    std::uint32_t ranks;       ///< bit per rank re-adopted with it (its local ranks)
    std::uint64_t gapNs;       ///< from the earliest rank's lostUnixNs to the adoption; 0 when refused
    std::uint64_t reserved1;   ///< 0
    char reason[128];          ///< NUL-terminated, why not when errc != 0
};
static_assert(sizeof(Adopted) == 160);
static_assert(offsetof(Adopted, gapNs) == 16);
static_assert(offsetof(Adopted, reason) == 32);
static_assert(std::is_trivially_copyable_v<Adopted>);

/// Why the daemon broke an open group, sent to each local rank just before
/// the control block says so (its error and missingPeer, the same code and
/// rank here): a rank whose call fails on the control block's word names the
/// daemon's reason beside it (a peer node's daemon that did not come back,
/// what it refused meanwhile, a queue pair's error). 512 bytes.
struct GroupFailed {
    std::uint16_t errc;        ///< the Errc in the control block, never 0
    std::uint16_t reserved0;   ///< 0
    std::uint32_t rank;        ///< the rank it names (missingPeer), kNoPeer if none
    std::uint32_t groupHandle; ///< the group's handle
    std::uint32_t reserved1;   ///< 0
    char reason[496];          ///< NUL-terminated
};
static_assert(sizeof(GroupFailed) == 512);
static_assert(offsetof(GroupFailed, reason) == 16);
static_assert(std::is_trivially_copyable_v<GroupFailed>);

/// Abort the caller's group: every member's waits end with Aborted. 8 bytes.
struct Abort {
    std::uint32_t reserved0;
    std::uint32_t reserved1;
};
static_assert(sizeof(Abort) == 8);
static_assert(std::is_trivially_copyable_v<Abort>);

/// Ask for the daemon's status document (JSON). 8 bytes.
struct StatusRequest {
    std::uint32_t flags; ///< none defined; 0
    std::uint32_t reserved;
};
static_assert(sizeof(StatusRequest) == 8);
static_assert(std::is_trivially_copyable_v<StatusRequest>);

/// A refused request. The daemon closes the connection after sending it. 256 bytes.
struct ErrorReply {
    std::uint16_t errc;
    std::uint16_t reserved;
    std::uint32_t missingPeer; ///< kNoPeer if none
    char message[248];         ///< NUL-terminated
};
static_assert(sizeof(ErrorReply) == 256);
static_assert(offsetof(ErrorReply, message) == 8);
static_assert(std::is_trivially_copyable_v<ErrorReply>);

// ---- validation --------------------------------------------------------

inline Status validate(const Hello& m) {
    if (m.role != kRoleRank && m.role != kRoleControl)
        return {Errc::OutOfRange, "Hello: role " + std::to_string(m.role) + " is neither rank (1) nor control (2)"};
    return okStatus();
}

inline Status validate(const HelloReply& m) {
    std::string s;
    if (!getText(m.daemonVersion, s)) return {Errc::BadMessage, "HelloReply: version text not terminated"};
    return okStatus();
}

inline Status validate(const NodeCardFixed& m, std::size_t hcas) {
    if (m.hcaCount > kMaxStripes)
        return {Errc::OutOfRange, "NodeCard: " + std::to_string(m.hcaCount) + " HCAs, at most 8"};
    if (hcas != m.hcaCount) return {Errc::BadMessage, "NodeCard: HCA count and records disagree"};
    return okStatus();
}

inline Status validate(const HcaCard& m) {
    std::string s;
    if (!getText(m.device, s)) return {Errc::BadMessage, "HcaCard: device name not terminated"};
    if (m.prefixLen > 128) return {Errc::OutOfRange, "HcaCard: prefix length " + std::to_string(m.prefixLen)};
    return okStatus();
}

inline Status validate(const GroupOpenFixed& m) {
    if (m.world < 2 || m.world > kMaxWorld)
        return {Errc::OutOfRange, "GroupOpen: world " + std::to_string(m.world) + " outside 2..16"};
    if (m.rank >= m.world)
        return {Errc::OutOfRange, "GroupOpen: rank " + std::to_string(m.rank) + " not below world " +
                                      std::to_string(m.world)};
    if (m.maxBytes == 0 || m.maxBytes > kMaxCapBytes)
        return {Errc::OutOfRange, "GroupOpen: maxBytes " + std::to_string(m.maxBytes) + " outside 1 byte..1 GiB"};
    if (m.timeoutMs == 0 || m.timeoutMs > 600000)
        return {Errc::OutOfRange, "GroupOpen: timeout " + std::to_string(m.timeoutMs) + " ms outside 1..600000"};
    if (m.regionKind != kRegionHost && m.regionKind != kRegionDevice)
        return {Errc::OutOfRange, "GroupOpen: region kind " + std::to_string(m.regionKind)};
    if (m.flags & ~std::uint32_t(kOpenGpuDoorbells | kOpenHostDirect))
        return {Errc::BadMessage, "GroupOpen: unknown flags " + std::to_string(m.flags)};
    if ((m.flags & kOpenGpuDoorbells) && (m.flags & kOpenHostDirect))
        return {Errc::BadMessage, "GroupOpen: host-direct writes are for host buffers, not a Device group"};
    return okStatus();
}

inline Status validate(const RosterEntry& m) {
    if (m.peerWire != 0 && m.peerWire != kWireVerbs && m.peerWire != kWireTcp)
        return {Errc::OutOfRange, "RosterEntry: peer wire " + std::to_string(m.peerWire) + " is neither verbs nor tcp"};
    if (m.maxBytes == 0 || m.maxBytes > kMaxCapBytes)
        return {Errc::OutOfRange, "RosterEntry: maxBytes " + std::to_string(m.maxBytes) + " outside 1 byte..1 GiB"};
    return okStatus();
}

inline Status validate(const Verdict& m) {
    Errc e;
    if (!errcFromWire(m.errc, e)) return {Errc::OutOfRange, "Verdict: unknown error code " + std::to_string(m.errc)};
    std::string s;
    if (!getText(m.reason, s)) return {Errc::BadMessage, "Verdict: reason not terminated"};
    if (m.errc != 0) return okStatus();
    if (m.world < 2 || m.world > kMaxWorld || m.rank >= m.world)
        return {Errc::OutOfRange, "Verdict: rank " + std::to_string(m.rank) + " / world " + std::to_string(m.world)};
    if (m.stripes < 1 || m.stripes > kMaxStripes)
        return {Errc::OutOfRange, "Verdict: stripes " + std::to_string(m.stripes)};
    if (m.slotBytes != slotBytesFor(m.agreedCap))
        return {Errc::BadMessage, "Verdict: slot size does not follow from the agreed cap"};
    for (std::uint32_t r = 0; r < m.world; ++r)
        if (m.wires[r] > kLastWire || (m.wires[r] == kWireSelf) != (r == m.rank))
            return {Errc::OutOfRange, "Verdict: route " + std::to_string(m.wires[r]) + " for rank " + std::to_string(r)};
    for (std::uint32_t r = 0; r < kMaxWorld; ++r)
        if ((m.hostPeers >> r & 1u) && (r >= m.world || m.wires[r] != kWireShm))
            return {Errc::OutOfRange, "Verdict: host region of rank " + std::to_string(r) + ", which is no same-node peer"};
    return okStatus();
}

inline Status validate(const PeerHostRegion& m) {
    if (m.rank >= kMaxWorld) return {Errc::OutOfRange, "PeerHostRegion: rank " + std::to_string(m.rank)};
    if (m.bytes == 0 || m.bytes % kSlotAlign != 0)
        return {Errc::OutOfRange, "PeerHostRegion: " + std::to_string(m.bytes) + " bytes, not a positive number of pages"};
    if (m.reserved) return {Errc::BadMessage, "PeerHostRegion: reserved field not 0"};
    return okStatus();
}

inline Status validate(const ShareRegion& m) {
    if (m.bytes == 0 || m.bytes > kMaxSharedRegionBytes)
        return {Errc::OutOfRange, "ShareRegion: " + std::to_string(m.bytes) + " bytes outside 1..2 GiB"};
    if (m.reserved0 || m.reserved1) return {Errc::BadMessage, "ShareRegion: reserved fields not 0"};
    return okStatus();
}

inline Status validate(const PeerRegion& m) {
    if (m.rank >= kMaxWorld) return {Errc::OutOfRange, "PeerRegion: rank " + std::to_string(m.rank)};
    if (m.bytes == 0 || m.bytes > kMaxSharedRegionBytes)
        return {Errc::OutOfRange, "PeerRegion: " + std::to_string(m.bytes) + " bytes outside 1..2 GiB"};
    return okStatus();
}

inline Status validate(const OpenReport& m) {
    Errc e;
    if (m.errc == 0 || !errcFromWire(m.errc, e))
        return {Errc::OutOfRange, "OpenReport: error code " + std::to_string(m.errc) + " is not a failure this daemon knows"};
    if (m.outcome != kOutcomeNccl && m.outcome != kOutcomeUnavailable)
        return {Errc::OutOfRange, "OpenReport: outcome " + std::to_string(m.outcome) + " is neither nccl (1) nor unavailable (2)"};
    if (m.reserved0 || m.reserved1) return {Errc::BadMessage, "OpenReport: reserved fields not 0"};
    return okStatus();
}

inline Status validate(const DeviceAttach& m) {
    if (m.world < 2 || m.world > kMaxWorld)
        return {Errc::OutOfRange, "DeviceAttach: world " + std::to_string(m.world) + " outside 2..16"};
    if (m.rank >= m.world)
        return {Errc::OutOfRange, "DeviceAttach: rank " + std::to_string(m.rank) + " not below world " +
                                      std::to_string(m.world)};
    if (m.deviceBytes > kMaxSharedRegionBytes)
        return {Errc::OutOfRange, "DeviceAttach: device region of " + std::to_string(m.deviceBytes) + " bytes above 2 GiB"};
    bool ipc = false;
    for (std::uint32_t q = 0; q < kMaxWorld; ++q) {
        const std::uint8_t r = m.wires[q];
        const bool ok = q >= m.world ? r == 0 : q == m.rank ? r == kWireSelf : r != kWireSelf && r <= kLastWire;
        if (!ok)
            return {Errc::OutOfRange, "DeviceAttach: route " + std::to_string(r) + " to rank " + std::to_string(q) +
                                          " (world " + std::to_string(m.world) + ", sender rank " + std::to_string(m.rank) + ")"};
        ipc |= q < m.world && r == kWireIpc;
    }
    if (ipc && m.deviceBytes == 0)
        return {Errc::BadMessage, "DeviceAttach: ipc routes without a device region"};
    if (m.reserved) return {Errc::BadMessage, "DeviceAttach: reserved field not 0"};
    return okStatus();
}

inline Status validate(const AdoptFixed& m) {
    if (m.world < 2 || m.world > kMaxWorld)
        return {Errc::OutOfRange, "Adopt: world " + std::to_string(m.world) + " outside 2..16"};
    if (m.rank >= m.world)
        return {Errc::OutOfRange, "Adopt: rank " + std::to_string(m.rank) + " not below world " + std::to_string(m.world)};
    if (m.agreedCap == 0 || m.agreedCap > kMaxCapBytes)
        return {Errc::OutOfRange, "Adopt: agreed cap " + std::to_string(m.agreedCap) + " outside 1 byte..1 GiB"};
    if (m.slotBytes != slotBytesFor(m.agreedCap))
        return {Errc::BadMessage, "Adopt: slot size does not follow from the agreed cap"};
    if (m.stripes < 1 || m.stripes > kMaxStripes) return {Errc::OutOfRange, "Adopt: stripes " + std::to_string(m.stripes)};
    if (m.regionBytes == 0 || m.regionBytes % kSlotAlign != 0)
        return {Errc::OutOfRange, "Adopt: region of " + std::to_string(m.regionBytes) + " bytes, not a positive number of pages"};
    if (!RingLayout::validEntries(m.ringEntries))
        return {Errc::OutOfRange, "Adopt: ring entries " + std::to_string(m.ringEntries)};
    if (m.groupHandle == 0) return {Errc::OutOfRange, "Adopt: group handle 0"};
    if (m.timeoutMs == 0 || m.timeoutMs > 600000)
        return {Errc::OutOfRange, "Adopt: timeout " + std::to_string(m.timeoutMs) + " ms outside 1..600000"};
    if (m.flags & ~std::uint32_t(kOpenHostDirect | kOpenGpuDoorbells) || m.flags == (kOpenHostDirect | kOpenGpuDoorbells))
        return {Errc::BadMessage, "Adopt: flags " + std::to_string(m.flags) + " (host-direct, device or none)"};
    const bool device = m.flags & kOpenGpuDoorbells;
    if (!device && (m.ipcPeers || m.deviceBytes))
        return {Errc::BadMessage, "Adopt: ipc peers or a device region for a group of host buffers"};
    if (m.ipcPeers >> m.world || m.ipcPeers >> m.rank & 1u)
        return {Errc::BadMessage,
                "Adopt: ipc peers " + std::to_string(m.ipcPeers) + " outside the world or naming the rank itself"};
    if (m.deviceBytes > kMaxSharedRegionBytes)
        return {Errc::OutOfRange, "Adopt: device region of " + std::to_string(m.deviceBytes) + " bytes above 2 GiB"};
    if (m.ipcPeers && !m.deviceBytes) return {Errc::BadMessage, "Adopt: ipc peers without a device region"};
    return okStatus();
}

inline Status validate(const Adopted& m) {
    Errc e;
    if (!errcFromWire(m.errc, e)) return {Errc::OutOfRange, "Adopted: unknown error code " + std::to_string(m.errc)};
    std::string s;
    if (!getText(m.reason, s)) return {Errc::BadMessage, "Adopted: reason not terminated"};
    if (m.rank >= kMaxWorld) return {Errc::OutOfRange, "Adopted: rank " + std::to_string(m.rank)};
    return okStatus();
}

inline Status validate(const GroupFailed& m) {
    Errc e;
    if (!errcFromWire(m.errc, e) || e == Errc::Ok)
        return {Errc::OutOfRange, "GroupFailed: error code " + std::to_string(m.errc)};
    std::string s;
    if (!getText(m.reason, s)) return {Errc::BadMessage, "GroupFailed: reason not terminated"};
    if (m.rank >= kMaxWorld && m.rank != kNoPeer) return {Errc::OutOfRange, "GroupFailed: rank " + std::to_string(m.rank)};
    return okStatus();
}

inline Status validate(const Abort&) { return okStatus(); }
inline Status validate(const StatusRequest&) { return okStatus(); }

inline Status validate(const ErrorReply& m) {
    Errc e;
    if (!errcFromWire(m.errc, e)) return {Errc::OutOfRange, "ErrorReply: unknown error code " + std::to_string(m.errc)};
    std::string s;
    if (!getText(m.message, s)) return {Errc::BadMessage, "ErrorReply: message not terminated"};
    return okStatus();
}

// ---- encode / decode ---------------------------------------------------

/// A whole message: header plus a fixed record.
template <class T>
inline Bytes encode(std::uint16_t opcode, std::uint32_t seq, const T& rec) {
    Bytes out = encodeHeader(kRequestSpec, opcode, seq, sizeof(T));
    Writer w;
    w.put(rec);
    out.insert(out.end(), w.bytes().begin(), w.bytes().end());
    return out;
}

/// A message with an empty payload (kNodeCardRequest, kClose, kClosed).
inline Bytes encodeEmpty(std::uint16_t opcode, std::uint32_t seq) {
    return encodeHeader(kRequestSpec, opcode, seq, 0);
}

inline Bytes encode(std::uint32_t seq, const NodeCard& m) {
    NodeCardFixed f = m.fixed;
    f.hcaCount = std::uint16_t(m.hcas.size());
    Writer w;
    w.put(f).putAll(std::span<const HcaCard>(m.hcas));
    Bytes out = encodeHeader(kReplySpec, kNodeCard, seq, std::uint32_t(w.bytes().size()));
    out.insert(out.end(), w.bytes().begin(), w.bytes().end());
    return out;
}

inline Bytes encode(std::uint32_t seq, const GroupOpen& m) {
    Writer w;
    w.put(m.fixed).putAll(std::span<const RosterEntry>(m.roster));
    Bytes out = encodeHeader(kRequestSpec, kGroupOpen, seq, std::uint32_t(w.bytes().size()));
    out.insert(out.end(), w.bytes().begin(), w.bytes().end());
    return out;
}

inline Bytes encode(std::uint32_t seq, const Adopt& m) {
    Writer w;
    w.put(m.fixed).putAll(std::span<const RosterEntry>(m.roster));
    Bytes out = encodeHeader(kRequestSpec, kAdopt, seq, std::uint32_t(w.bytes().size()));
    out.insert(out.end(), w.bytes().begin(), w.bytes().end());
    return out;
}

inline Bytes encodeStatusReply(std::uint32_t seq, std::string_view json) {
    Bytes out = encodeHeader(kReplySpec, kStatusReply, seq, std::uint32_t(json.size()));
    out.insert(out.end(), json.begin(), json.end());
    return out;
}

inline Status expectEmpty(ByteView payload, std::string_view what) {
    if (!payload.empty())
        return {Errc::BadMessage, std::string(what) + ": " + std::to_string(payload.size()) +
                                      " payload bytes where none belong"};
    return okStatus();
}

inline Result<NodeCard> decodeNodeCard(ByteView payload) {
    Reader r(payload, "NodeCard");
    NodeCard m;
    if (auto s = r.get(m.fixed); !s) return s.error();
    if (m.fixed.hcaCount > kMaxStripes)
        return {Errc::OutOfRange, "NodeCard: " + std::to_string(m.fixed.hcaCount) + " HCAs, at most 8"};
    if (auto s = r.getAll(m.hcas, m.fixed.hcaCount); !s) return s.error();
    if (auto s = r.finish(); !s) return s.error();
    if (auto s = validate(m.fixed, m.hcas.size()); !s) return s.error();
    for (const auto& h : m.hcas)
        if (auto s = validate(h); !s) return s.error();
    return m;
}

/// A fixed part (validated) followed by RosterEntry[fixed.world], each validated: GroupOpen, Adopt.
template <class M>
inline Result<M> decodeWithRoster(ByteView payload, const char* what) {
    Reader r(payload, what);
    M m;
    if (auto s = r.get(m.fixed); !s) return s.error();
    if (auto s = validate(m.fixed); !s) return s.error();
    if (auto s = r.getAll(m.roster, m.fixed.world); !s) return s.error();
    if (auto s = r.finish(); !s) return s.error();
    for (const auto& e : m.roster)
        if (auto s = validate(e); !s) return s.error();
    return m;
}

inline Result<GroupOpen> decodeGroupOpen(ByteView payload) {
    auto m = decodeWithRoster<GroupOpen>(payload, "GroupOpen");
    if (m && m->roster[m->fixed.rank].maxBytes != m->fixed.maxBytes)
        return {Errc::GroupMismatch, "GroupOpen: own roster entry disagrees with maxBytes"};
    return m;
}

inline Result<Adopt> decodeAdopt(ByteView payload) { return decodeWithRoster<Adopt>(payload, "Adopt"); }

inline Result<std::string> decodeStatusReply(ByteView payload) {
    if (std::memchr(payload.data(), 0, payload.size()))
        return {Errc::BadMessage, "StatusReply: NUL byte in JSON text"};
    return std::string(payload.begin(), payload.end());
}

} // namespace tpf::client_proto
