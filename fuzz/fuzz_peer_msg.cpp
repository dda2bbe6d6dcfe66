// libFuzzer target: the daemon<->daemon TCP link as a peer link reads it.
// The input's first byte picks where the link starts (% 3: PeerHello,
// PeerAuth, group records) and whether it is keyed (/ 3 & 1); the rest is the
// byte stream, cut into frames as PeerSession::readNext does, each handed to
// the daemon's own decodePeerInput (daemon/negotiate/peer_input.*) in the
// link's phase, which moves on as a session's does: Hello, then Auth when
// keyed, then records; the first error ends the link. Checked: errors are
// named; a decoded record is the opcode its phase takes, re-encodes to
// exactly the bytes it came from, and keeps the bounds the daemon relies on
// when it indexes by rank, HCA and QP. After a PeerData record the rest is a
// tcp data link's frames (proto/tcp_frame.hpp), each header checked as the
// receiver does (TcpLink::receive) for a fixed layout: a frame it takes
// lands inside the slot, from a rank the sender serves to one this node does.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "daemon/negotiate/peer_input.hpp"
#include "fuzz_common.hpp"
#include "proto/tcp_frame.hpp"

using namespace tpf;
using namespace tpf::peer_proto;
using daemon::PeerPhase;

namespace {

void sameBytes(const Bytes& again, ByteView frame) {
    TPF_FUZZ_CHECK(again.size() == frame.size() && std::memcmp(again.data(), frame.data(), frame.size()) == 0);
}

void checkGroup(const PeerGroup& m, const MsgHeader& h, ByteView frame) {
    const auto& f = m.fixed;
    TPF_FUZZ_CHECK(f.world >= 2 && f.world <= kMaxWorld);
    TPF_FUZZ_CHECK(m.regions.size() == f.regionCount && m.hcas.size() == f.hcaCount && m.qps.size() == f.qpCount);
    TPF_FUZZ_CHECK(m.hcas.size() <= kMaxStripes && m.regions.size() <= kMaxRegions && m.qps.size() <= kMaxQps);
    for (const auto& r : m.regions) TPF_FUZZ_CHECK(r.rank < f.world && r.hca < m.hcas.size());
    for (const auto& q : m.qps)
        TPF_FUZZ_CHECK(q.hca < m.hcas.size() && q.localRank < f.world && q.remoteRank < f.world &&
                       q.localRank != q.remoteRank);
    sameBytes(encode(h.seq, m), frame);
}

// The frames of a data link, against world 4, two stripes, ranks 0 and 2 on
// the sender's node and 1 and 3 here: the first bad header ends the link.
void checkFrames(ByteView rest) {
    const Layout layout = *Layout::of(4, slotBytesFor(64 * 1024), 2);
    while (rest.size() >= sizeof(TcpFrame)) {
        TcpFrame f;
        std::memcpy(&f, rest.data(), sizeof f);
        rest = rest.subspan(sizeof f);
        if (auto st = validate(f, layout, 0b0101, 0b1010); !st) {
            TPF_FUZZ_CHECK(!st.error().detail.empty());
            return;
        }
        TPF_FUZZ_CHECK(f.src < 4 && (f.src & 1) == 0 && f.dst < 4 && (f.dst & 1) == 1 && f.stripe < 2);
        TPF_FUZZ_CHECK(f.offset + f.bytes <= layout.slotBytes && f.epoch != 0 && f.phase == phaseOf(f.epoch));
        if (rest.size() < f.bytes) return;
        rest = rest.subspan(f.bytes);
    }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size < 1) return 0;
    PeerPhase phase = PeerPhase(data[0] % 3);
    const bool keyed = (data[0] / 3) & 1;
    const ByteView stream(data + 1, size - 1);
    if (auto whole = decodeFrame(stream, kPeerSpec)) TPF_FUZZ_CHECK(whole->payload.size() == whole->header.length);

    std::size_t used = 0;
    while (stream.size() - used >= sizeof(MsgHeader)) {
        auto h = decodeHeader(stream.subspan(used), kPeerSpec);
        if (!h) {
            TPF_FUZZ_CHECK(h.code() == Errc::BadMagic || h.code() == Errc::VersionMismatch || h.code() == Errc::TooLarge);
            break;
        }
        if (stream.size() - used - sizeof(MsgHeader) < h->length) break;
        const ByteView frame = stream.subspan(used, sizeof(MsgHeader) + h->length);
        used += frame.size();
        auto in = daemon::decodePeerInput(phase, *h, frame.subspan(sizeof(MsgHeader)));
        if (!in) {
            TPF_FUZZ_CHECK(in.code() != Errc::Ok && !in.error().detail.empty());
            break; // the link fails
        }
        TPF_FUZZ_CHECK(in->opcode == h->opcode);
        switch (phase) {
        case PeerPhase::Hello:
            TPF_FUZZ_CHECK(h->opcode == kPeerHello);
            sameBytes(encode(h->opcode, h->seq, std::get<PeerHello>(in->record)), frame);
            phase = keyed ? PeerPhase::Auth : PeerPhase::Records;
            break;
        case PeerPhase::Auth:
            TPF_FUZZ_CHECK(h->opcode == kPeerAuth);
            sameBytes(encode(h->opcode, h->seq, std::get<PeerAuth>(in->record)), frame);
            phase = PeerPhase::Records;
            break;
        case PeerPhase::Records:
            if (const auto* g = std::get_if<PeerGroup>(&in->record)) {
                TPF_FUZZ_CHECK(h->opcode == kPeerGroup);
                checkGroup(*g, *h, frame);
            } else if (const auto* d = std::get_if<PeerData>(&in->record)) {
                TPF_FUZZ_CHECK(h->opcode == kPeerData && d->reserved0 == 0 && d->reserved1 == 0);
                sameBytes(encode(h->opcode, h->seq, *d), frame);
                checkFrames(stream.subspan(used)); // a data link: frames from here on, no records
                return 0;
            } else {
                TPF_FUZZ_CHECK(h->opcode == kPeerReady || h->opcode == kPeerBroken);
                const auto& v = std::get<PeerVerdict>(in->record);
                TPF_FUZZ_CHECK(v.missingRank == kNoPeer || v.missingRank < kMaxWorld);
                sameBytes(encode(h->opcode, h->seq, v), frame);
            }
            break;
        }
    }
    return 0;
}
