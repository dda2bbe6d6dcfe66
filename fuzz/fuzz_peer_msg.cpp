// libFuzzer target: the daemon<->daemon TCP link (proto/peer_msg.hpp). The
// input is a byte stream cut into frames as a peer link reads them; each
// payload goes to the decoder of its opcode. A decoded record must re-encode
// to exactly the bytes it came from and satisfy the bounds the daemon relies
// on when it indexes by rank, HCA and QP.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "fuzz_common.hpp"
#include "proto/peer_msg.hpp"

using namespace tpf;
using namespace tpf::peer_proto;

namespace {

template <class T>
void fixedRecord(ByteView frame, const MsgHeader& h, ByteView payload, const char* what) {
    auto m = decodeFixed<T>(payload, what);
    if (!m) return;
    const Bytes again = encode(h.opcode, h.seq, *m);
    TPF_FUZZ_CHECK(again.size() == frame.size() && std::memcmp(again.data(), frame.data(), frame.size()) == 0);
}

void peerGroup(ByteView frame, const MsgHeader& h, ByteView payload) {
    auto m = decodePeerGroup(payload);
    if (!m) return;
    const auto& f = m->fixed;
    TPF_FUZZ_CHECK(f.world >= 2 && f.world <= kMaxWorld);
    TPF_FUZZ_CHECK(m->regions.size() == f.regionCount && m->hcas.size() == f.hcaCount && m->qps.size() == f.qpCount);
    TPF_FUZZ_CHECK(m->hcas.size() <= kMaxStripes && m->regions.size() <= kMaxRegions && m->qps.size() <= kMaxQps);
    for (const auto& r : m->regions) TPF_FUZZ_CHECK(r.rank < f.world && r.hca < m->hcas.size());
    for (const auto& q : m->qps)
        TPF_FUZZ_CHECK(q.hca < m->hcas.size() && q.localRank < f.world && q.remoteRank < f.world &&
                       q.localRank != q.remoteRank);
    const Bytes again = encode(h.seq, *m);
    TPF_FUZZ_CHECK(again.size() == frame.size() && std::memcmp(again.data(), frame.data(), frame.size()) == 0);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const ByteView stream(data, size);
    if (auto whole = decodeFrame(stream, kPeerSpec)) TPF_FUZZ_CHECK(whole->payload.size() == whole->header.length);

    std::size_t used = 0;
    while (stream.size() - used >= sizeof(MsgHeader)) {
        auto h = decodeHeader(stream.subspan(used), kPeerSpec);
        if (!h) break;
        if (stream.size() - used - sizeof(MsgHeader) < h->length) break;
        const ByteView frame = stream.subspan(used, sizeof(MsgHeader) + h->length);
        const ByteView payload = frame.subspan(sizeof(MsgHeader));
        used += frame.size();
        switch (h->opcode) {
        case kPeerHello: fixedRecord<PeerHello>(frame, *h, payload, "PeerHello"); break;
        case kPeerAuth: fixedRecord<PeerAuth>(frame, *h, payload, "PeerAuth"); break;
        case kPeerGroup: peerGroup(frame, *h, payload); break;
        case kPeerReady:
        case kPeerBroken: fixedRecord<PeerVerdict>(frame, *h, payload, "PeerVerdict"); break;
        default: break;
        }
    }
    return 0;
}
