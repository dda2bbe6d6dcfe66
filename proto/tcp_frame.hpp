// tpfabric — the tcp wire's data link between two daemons (one TCP
// connection per group and node pair, opened beside the negotiation link:
// proto/peer_msg.hpp, kPeerData). After its PeerData record it carries
// TcpFrames both ways: one per stripe of a shard and receiving rank, each the
// header below and then `bytes` of payload. The receiving daemon writes the
// payload into the receiving rank's region at the sender's slot, then the
// stripe's flag (every copy of its line) with the epoch: the order an RDMA
// WRITE followed by its flag WRITE gives on the verbs wire.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include <tpfabric/error.hpp>
#include "proto/layout.hpp"
#include "proto/wire.hpp"

namespace tpf::peer_proto {

/// The header of each frame ("TPT" and the frame layout revision).
inline constexpr std::uint32_t kTcpFrameMagic = fourcc('T', 'P', 'T', 1);

/// One stripe of one shard for one receiving rank. 32 bytes, then `bytes`
/// of payload.
struct TcpFrame {
    std::uint32_t magic;  ///< kTcpFrameMagic
    std::uint16_t src;    ///< the shard's rank (on the sender's node)
    std::uint16_t dst;    ///< the receiving rank (on the receiver's node)
    std::uint8_t stripe;  ///< < the group's Layout::stripes
    std::uint8_t phase;   ///< phaseOf(epoch): 0 or 1
    std::uint16_t reserved; ///< 0
    std::uint32_t bytes;  ///< payload that follows
    std::uint64_t offset; ///< where the payload goes in src's slot
    std::uint64_t epoch;  ///< what the stripe's flag is set to, >= 1
};
static_assert(sizeof(TcpFrame) == 32);
static_assert(offsetof(TcpFrame, bytes) == 12);
static_assert(offsetof(TcpFrame, offset) == 16);
static_assert(offsetof(TcpFrame, epoch) == 24);
static_assert(std::is_trivially_copyable_v<TcpFrame>);

/// A frame header received for a group of `layout` whose sender serves the
/// ranks of `srcRanks` and the receiver those of `dstRanks` (bit per rank).
inline Status validate(const TcpFrame& f, const Layout& layout, std::uint32_t srcRanks, std::uint32_t dstRanks) {
    if (f.magic != kTcpFrameMagic) return {Errc::BadMagic, "tcp frame: magic " + std::to_string(f.magic)};
    if (f.src >= layout.world || !(srcRanks >> f.src & 1u))
        return {Errc::BadMessage, "tcp frame: from rank " + std::to_string(f.src) + ", which the sender does not serve"};
    if (f.dst >= layout.world || !(dstRanks >> f.dst & 1u))
        return {Errc::BadMessage, "tcp frame: to rank " + std::to_string(f.dst) + ", which this node does not serve"};
    if (f.stripe >= layout.stripes || f.epoch == 0 || f.phase != phaseOf(f.epoch) || f.reserved)
        return {Errc::BadMessage, "tcp frame: stripe " + std::to_string(f.stripe) + ", phase " + std::to_string(f.phase) +
                                      ", epoch " + std::to_string(f.epoch)};
    if (f.offset > layout.slotBytes || f.bytes > layout.slotBytes - f.offset)
        return {Errc::OutOfRange, "tcp frame: " + std::to_string(f.bytes) + " bytes at " + std::to_string(f.offset) +
                                      " past the slot of " + std::to_string(layout.slotBytes)};
    return okStatus();
}

} // namespace tpf::peer_proto
