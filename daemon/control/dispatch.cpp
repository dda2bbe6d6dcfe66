// The control socket's requests (see dispatch.hpp).
#include "daemon/control/dispatch.hpp"

namespace tpf::daemon {

using namespace client_proto;

std::size_t ControlDispatch::feed(ByteView in, std::vector<UniqueFd>& fds) {
    std::size_t used = 0;
    while (!ended_ && in.size() - used >= sizeof(MsgHeader)) {
        auto h = decodeHeader(in.subspan(used), kRequestSpec);
        if (!h) {
            refuse(h.code(), h.error().detail);
            break;
        }
        if (in.size() - used - sizeof(MsgHeader) < h->length) break; // the rest has not arrived
        const ByteView payload = in.subspan(used + sizeof(MsgHeader), h->length);
        used += sizeof(MsgHeader) + h->length;
        if (!handle(*h, payload, fds)) ended_ = true;
    }
    return used;
}

bool ControlDispatch::refuse(Errc code, const std::string& why) {
    ended_ = true;
    to_.refuse(code, why);
    return false;
}

// A rank hands its region and ring back to a restarted daemon (GroupTable::adopt).
bool ControlDispatch::handleAdopt(ByteView payload, std::vector<UniqueFd>& fds) {
    if (fds.size() != kAdoptFds)
        return refuse(Errc::BadMessage, "Adopt needs exactly 2 file descriptors (region, ring), got " + std::to_string(fds.size()));
    UniqueFd region = std::move(fds[0]), ring = std::move(fds[1]);
    fds.clear();
    if (inGroup_) return refuse(Errc::GroupMismatch, "this connection already joined a group");
    auto m = decodeAdopt(payload);
    if (!m) return refuse(m.code(), m.error().detail);
    inGroup_ = true;
    to_.adopt(*m, std::move(region), std::move(ring));
    return !to_.closed();
}

bool ControlDispatch::handle(const MsgHeader& h, ByteView payload, std::vector<UniqueFd>& fds) {
    // Only ShareRegion carries a file descriptor (exactly one).
    if (h.opcode == kShareRegion && role_ == kRoleRank) {
        if (fds.size() != 1) return refuse(Errc::BadMessage, "ShareRegion needs exactly 1 file descriptor");
        UniqueFd fd = std::move(fds.front());
        fds.clear();
        auto m = decodeFixed<ShareRegion>(payload, "ShareRegion");
        if (!m) return refuse(m.code(), m.error().detail);
        if (!inGroup_) return refuse(Errc::PermissionDenied, "ShareRegion without an open group");
        if (auto s = to_.shareRegion(*m, fd.get()); !s) return refuse(s.code(), s.error().detail);
        return true;
    }
    if (h.opcode == kAdopt && role_ == kRoleRank) return handleAdopt(payload, fds);
    if (!fds.empty())
        return refuse(Errc::BadMessage, std::to_string(fds.size()) + " file descriptor(s) sent where none belong");
    if (role_ == 0 && h.opcode != kHello) return refuse(Errc::BadMessage, "opcode " + std::to_string(h.opcode) + " before Hello");
    switch (h.opcode) {
    case kHello: {
        if (role_ != 0) return refuse(Errc::BadMessage, "second Hello");
        auto m = decodeFixed<Hello>(payload, "Hello");
        if (!m) return refuse(m.code(), m.error().detail);
        if (const std::string why = to_.busyFor(m->role); !why.empty()) return refuse(Errc::Busy, why);
        role_ = m->role;
        to_.reply(encode(kHelloReply, h.seq, to_.helloReply()));
        return true;
    }
    case kNodeCardRequest: {
        if (auto s = expectEmpty(payload, "NodeCardRequest"); !s) return refuse(s.code(), s.error().detail);
        to_.reply(encode(h.seq, to_.nodeCard()));
        return true;
    }
    case kGroupOpen: {
        if (role_ != kRoleRank) return refuse(Errc::PermissionDenied, "GroupOpen from a control client");
        if (inGroup_) return refuse(Errc::GroupMismatch, "this connection already joined a group");
        auto m = decodeGroupOpen(payload);
        if (!m) return refuse(m.code(), m.error().detail);
        inGroup_ = true;
        to_.join(*m);
        return !to_.closed();
    }
    case kAbort: {
        auto m = decodeFixed<Abort>(payload, "Abort");
        if (!m) return refuse(m.code(), m.error().detail);
        if (!inGroup_) return refuse(Errc::PermissionDenied, "Abort without a group");
        to_.abort();
        return true;
    }
    case kClose: {
        if (auto s = expectEmpty(payload, "Close"); !s) return refuse(s.code(), s.error().detail);
        if (inGroup_) to_.leave();
        inGroup_ = false;
        to_.reply(encodeEmpty(kClosed, h.seq));
        to_.finish();
        return false;
    }
    case kOpenReport: {
        if (role_ != kRoleRank) return refuse(Errc::PermissionDenied, "OpenReport from a control client");
        if (reported_) return refuse(Errc::BadMessage, "second OpenReport on one connection");
        auto m = decodeFixed<OpenReport>(payload, "OpenReport");
        if (!m) return refuse(m.code(), m.error().detail);
        reported_ = true;
        to_.openReport(*m);
        return true;
    }
    case kDeviceAttach: {
        if (role_ != kRoleRank) return refuse(Errc::PermissionDenied, "DeviceAttach from a control client");
        auto m = decodeFixed<DeviceAttach>(payload, "DeviceAttach");
        if (!m) return refuse(m.code(), m.error().detail);
        if (!inGroup_) return refuse(Errc::PermissionDenied, "DeviceAttach without a group");
        if (auto s = to_.deviceAttach(*m); !s) return refuse(s.code(), s.error().detail);
        return true;
    }
    case kAdopt: return refuse(Errc::PermissionDenied, "Adopt from a control client");
    case kStatusRequest: {
        auto m = decodeFixed<StatusRequest>(payload, "StatusRequest");
        if (!m) return refuse(m.code(), m.error().detail);
        to_.reply(encodeStatusReply(h.seq, to_.statusJson()));
        return true;
    }
    default: return refuse(Errc::BadMessage, "unknown opcode " + std::to_string(h.opcode));
    }
}

} // namespace tpf::daemon
