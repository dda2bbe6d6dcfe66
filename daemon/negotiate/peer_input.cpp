// A peer link's input, record by record (see peer_input.hpp).
#include "daemon/negotiate/peer_input.hpp"

#include <string>

namespace tpf::daemon {

using namespace peer_proto;

namespace {
template <class T>
Result<PeerInput> fixed(std::uint16_t opcode, ByteView payload, const char* what) {
    auto r = decodeFixed<T>(payload, what);
    if (!r) return r.error();
    return PeerInput{opcode, *r};
}
} // namespace

Result<PeerInput> decodePeerInput(PeerPhase phase, const MsgHeader& h, ByteView payload) {
    switch (phase) {
    case PeerPhase::Hello:
        if (h.opcode != kPeerHello)
            return Error{Errc::BadMessage, "expected PeerHello, got opcode " + std::to_string(h.opcode)};
        return fixed<PeerHello>(h.opcode, payload, "PeerHello");
    case PeerPhase::Auth:
        if (h.opcode != kPeerAuth)
            return Error{Errc::AuthFailed, "expected PeerAuth (cluster key proof), got opcode " + std::to_string(h.opcode)};
        return fixed<PeerAuth>(h.opcode, payload, "PeerAuth");
    case PeerPhase::Records: break;
    }
    if (h.opcode == kPeerGroup) {
        auto rec = decodePeerGroup(payload);
        if (!rec) return rec.error();
        return PeerInput{h.opcode, std::move(*rec)};
    }
    if (h.opcode == kPeerReady || h.opcode == kPeerBroken) return fixed<PeerVerdict>(h.opcode, payload, "PeerVerdict");
    if (h.opcode == kPeerRejoin) {
        auto rec = decodePeerRejoin(payload);
        if (!rec) return rec.error();
        return PeerInput{h.opcode, std::move(*rec)};
    }
    if (h.opcode == kPeerData) return fixed<PeerData>(h.opcode, payload, "PeerData");
    return Error{Errc::BadMessage, "unknown peer opcode " + std::to_string(h.opcode)};
}

} // namespace tpf::daemon
