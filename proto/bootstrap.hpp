// tpfabric — what ranks exchange over the bootstrap (the group's NCCL
// communicator in production, loopback TCP in CPU tests) while opening a
// group. Every rank contributes one record; all-gathered in rank order.
#pragma once

#include <cstdint>
#include <type_traits>

#include "proto/client_msg.hpp"
#include "proto/wire.hpp"

namespace tpf::bootstrap_proto {

/// Framing of the loopback TCP bootstrap (MsgHeader with this magic; opcode
/// kGatherPart rank -> root, kGatherAll root -> every rank).
inline constexpr std::uint32_t kBootstrapMagic = fourcc('T', 'P', 'B', 1);
inline constexpr std::uint16_t kBootstrapVersion = 1;
inline constexpr std::uint32_t kMaxBootstrapPayload = 1024 * 1024;
inline constexpr ProtocolSpec kBootstrapSpec{"bootstrap", kBootstrapMagic, kBootstrapVersion, kBootstrapVersion,
                                             kMaxBootstrapPayload};
enum Opcode : std::uint16_t {
    kJoin = 1,       ///< u32 rank, u32 world: a rank introduces itself to the root
    kGatherPart = 2, ///< one rank's part of an all-gather
    kGatherAll = 3,  ///< the root's answer: every part in rank order
    kRefuse = 4,     ///< root -> rank, any seq: client_proto::ErrorReply (errc, the rank it names in
                     ///< missingPeer, text): the bootstrap cannot complete (a rank of another world, a
                     ///< rank twice, a rank gone or late); the rank's pending and later calls fail with it
};

/// Round 0, before any rank contacts its daemon: what each rank opens with.
/// Every rank checks every record, so a caller's mistake (another world, a
/// rank number twice, a bootstrap shared with something else) and a bad
/// TPF_* variable fail the open on every rank at once, and TPF_DISABLE on
/// one rank keeps the whole group on NCCL without any daemon. 32 bytes.
inline constexpr std::uint32_t kIntentMagic = fourcc('T', 'P', 'I', 1);
inline constexpr std::uint16_t kIntentVersion = 1;
enum IntentFlags : std::uint16_t {
    kIntentDisabled = 1,      ///< TPF_DISABLE=1 on this rank
    kIntentFallbackError = 2, ///< this rank's fallback policy is error (TPF_FALLBACK=error or Options)
    kIntentHasComm = 4,       ///< this rank has an NCCL communicator to fall back to
    kIntentDevice = 8,        ///< Buffers::Device
    /// With kIntentFallbackError: the policy came from TPF_FALLBACK=error, not
    /// the open's options (what the refusal names). Older libraries leave it 0.
    kIntentFallbackFromEnv = 16,
};
/// What the ranks' calls put into each other's memory (OpenIntent::
/// dataProtocol); ranks of one group must speak the same one. 1: Device
/// calls carry the call's tag (callTagOf, kernels/collectives.hpp), which a
/// peer of 0 (the libraries before it, which leave the field 0) neither
/// writes nor checks: its peers' first call would end in Timeout.
inline constexpr std::uint16_t kDataProtocol = 1;
struct OpenIntent {
    std::uint32_t magic;    ///< kIntentMagic
    std::uint16_t version;  ///< kIntentVersion
    std::uint16_t flags;    ///< IntentFlags
    std::uint32_t rank;     ///< the rank this process opens as
    std::uint32_t world;    ///< the world it opens with
    std::uint64_t maxBytes; ///< its maxBytes argument (ranks may differ: the group agrees the minimum)
    std::uint16_t envErrc;  ///< 0; ConfigError: a TPF_* variable of this rank is invalid; InvalidArgument: its Options are
    std::uint16_t dataProtocol; ///< kDataProtocol (0 from libraries before the field)
    std::uint32_t reserved1;
};
static_assert(sizeof(OpenIntent) == 32);
static_assert(offsetof(OpenIntent, maxBytes) == 16);
static_assert(offsetof(OpenIntent, envErrc) == 24);
static_assert(offsetof(OpenIntent, dataProtocol) == 26);
static_assert(std::is_trivially_copyable_v<OpenIntent>);

/// Round 1: every rank's card. 72 bytes.
struct OpenCard {
    std::uint8_t groupId[16];          ///< rank 0's draw; the others' are ignored
    client_proto::RosterEntry entry;   ///< this rank's node, daemon endpoint, usable maximum
    std::uint16_t errc;                ///< 0, or why this rank cannot take the fabric path (no daemon, ...)
    std::uint16_t reserved0;
    std::uint32_t reserved1;
};
static_assert(sizeof(OpenCard) == 72);
static_assert(offsetof(OpenCard, entry) == 16);
static_assert(offsetof(OpenCard, errc) == 64);
static_assert(std::is_trivially_copyable_v<OpenCard>);

/// Round 2: every rank's verdict from its daemon; the group takes the fabric
/// path only if every errc is 0 (all or none). 8 bytes.
struct OpenVote {
    std::uint16_t errc;
    std::uint16_t reserved0;
    std::uint32_t reserved1;
};
static_assert(sizeof(OpenVote) == 8);
static_assert(std::is_trivially_copyable_v<OpenVote>);

} // namespace tpf::bootstrap_proto
