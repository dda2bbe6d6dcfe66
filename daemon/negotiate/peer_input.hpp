// What a peer link takes from the wire, record by record: the one decoder of
// the daemon<->daemon link's input, used by PeerSession (peer_link.cpp) and
// by fuzz/fuzz_peer_msg.cpp, which runs it on fuzzed bytes without a socket.
#pragma once

#include <cstdint>
#include <variant>

#include <tpfabric/error.hpp>

#include "proto/peer_msg.hpp"

namespace tpf::daemon {

/// Which records a link takes next: PeerHello first, then PeerAuth when
/// either side has a cluster key, then group records.
enum class PeerPhase { Hello, Auth, Records };

/// One record of a peer link, decoded: PeerHello, PeerAuth, PeerGroup, a
/// PeerVerdict (opcode kPeerReady or kPeerBroken), PeerData (the link is a
/// tcp data link from here on), or PeerRejoin.
struct PeerInput {
    std::uint16_t opcode = 0;
    std::variant<peer_proto::PeerHello, peer_proto::PeerAuth, peer_proto::PeerGroup, peer_proto::PeerVerdict,
                 peer_proto::PeerData, peer_proto::PeerRejoin>
        record;
};

/// The record of message (h, payload) on a link in `phase`. Errors, with
/// which the link fails: BadMessage for another opcode than PeerHello first
/// or an unknown one, AuthFailed for another than PeerAuth while the key is
/// proven, the record decoder's error for a malformed record.
Result<PeerInput> decodePeerInput(PeerPhase phase, const MsgHeader& h, ByteView payload);

} // namespace tpf::daemon
