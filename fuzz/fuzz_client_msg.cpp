// libFuzzer target: the client<->daemon control protocol as the daemon's
// socket input path sees it (daemon/server.cpp Connection::onReadable): a
// byte stream cut into frames by decodeHeader, each payload handed to the
// record decoder of its opcode. The first input byte picks the direction
// (requests, replies) or the bootstrap framing. A decoded record must
// re-encode to exactly the bytes it came from.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "fuzz_common.hpp"
#include "proto/bootstrap.hpp"
#include "proto/client_msg.hpp"

using namespace tpf;
using namespace tpf::client_proto;

namespace {

ByteView frameBytes(ByteView stream, std::size_t at, const MsgHeader& h) {
    return stream.subspan(at, sizeof(MsgHeader) + h.length);
}

template <class T>
void fixedRecord(ByteView frame, const MsgHeader& h, ByteView payload, const char* what) {
    auto m = decodeFixed<T>(payload, what);
    if (!m) {
        TPF_FUZZ_CHECK(m.code() != Errc::Ok);
        return;
    }
    TPF_FUZZ_CHECK(payload.size() == sizeof(T));
    const Bytes again = encode(h.opcode, h.seq, *m);
    TPF_FUZZ_CHECK(again.size() == frame.size() && std::memcmp(again.data(), frame.data(), frame.size()) == 0);
}

void clientRecord(ByteView frame, const MsgHeader& h, ByteView payload) {
    switch (h.opcode) {
    case kHello: fixedRecord<Hello>(frame, h, payload, "Hello"); break;
    case kHelloReply: fixedRecord<HelloReply>(frame, h, payload, "HelloReply"); break;
    case kNodeCardRequest:
    case kClose:
    case kClosed: {
        auto s = expectEmpty(payload, "empty");
        TPF_FUZZ_CHECK(bool(s) == payload.empty());
        break;
    }
    case kNodeCard: {
        auto m = decodeNodeCard(payload);
        if (!m) break;
        TPF_FUZZ_CHECK(m->hcas.size() == m->fixed.hcaCount && m->hcas.size() <= kMaxStripes);
        const Bytes again = encode(h.seq, *m);
        TPF_FUZZ_CHECK(again.size() == frame.size() && std::memcmp(again.data(), frame.data(), frame.size()) == 0);
        break;
    }
    case kGroupOpen: {
        auto m = decodeGroupOpen(payload);
        if (!m) break;
        TPF_FUZZ_CHECK(m->fixed.world >= 2 && m->fixed.world <= kMaxWorld);
        TPF_FUZZ_CHECK(m->roster.size() == m->fixed.world && m->fixed.rank < m->fixed.world);
        const Bytes again = encode(h.seq, *m);
        TPF_FUZZ_CHECK(again.size() == frame.size() && std::memcmp(again.data(), frame.data(), frame.size()) == 0);
        break;
    }
    case kVerdict: fixedRecord<Verdict>(frame, h, payload, "Verdict"); break;
    case kAbort: fixedRecord<Abort>(frame, h, payload, "Abort"); break;
    case kStatusRequest: fixedRecord<StatusRequest>(frame, h, payload, "StatusRequest"); break;
    case kStatusReply: {
        auto m = decodeStatusReply(payload);
        if (m) TPF_FUZZ_CHECK(m->size() == payload.size() && m->find('\0') == std::string::npos);
        break;
    }
    case kErrorReply: fixedRecord<ErrorReply>(frame, h, payload, "ErrorReply"); break;
    case kShareRegion: fixedRecord<ShareRegion>(frame, h, payload, "ShareRegion"); break;
    case kPeerRegion: fixedRecord<PeerRegion>(frame, h, payload, "PeerRegion"); break;
    case kOpenReport: {
        fixedRecord<OpenReport>(frame, h, payload, "OpenReport");
        if (auto m = decodeFixed<OpenReport>(payload, "OpenReport"))
            TPF_FUZZ_CHECK(m->errc != 0 && (m->outcome == kOutcomeNccl || m->outcome == kOutcomeUnavailable));
        break;
    }
    default: break; // the daemon refuses an unknown opcode by name
    }
}

void bootstrapRecord(const MsgHeader& h, ByteView payload) {
    using namespace tpf::bootstrap_proto;
    // The loopback bootstrap carries a join, then all-gathers of OpenCard / OpenVote arrays.
    Reader r(payload, "bootstrap");
    switch (h.opcode) {
    case kJoin: {
        std::uint32_t rank = 0, world = 0;
        if (r.get(rank) && r.get(world)) (void)r.finish();
        break;
    }
    case kGatherPart:
    case kGatherAll: {
        if (payload.size() % sizeof(OpenCard) == 0) {
            std::vector<OpenCard> cards;
            TPF_FUZZ_CHECK(bool(r.getAll(cards, payload.size() / sizeof(OpenCard))));
            for (const auto& c : cards) (void)validate(c.entry);
        } else {
            std::vector<OpenVote> votes;
            if (r.getAll(votes, payload.size() / sizeof(OpenVote))) (void)r.finish();
        }
        break;
    }
    default: break;
    }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size < 1) return 0;
    const std::uint8_t mode = data[0] % 3;
    const ByteView stream(data + 1, size - 1);
    const ProtocolSpec& spec = mode == 0 ? kRequestSpec : mode == 1 ? kReplySpec : bootstrap_proto::kBootstrapSpec;

    // decodeFrame on the whole input must agree with decodeHeader + the length rule.
    auto whole = decodeFrame(stream, spec);
    auto head = decodeHeader(stream, spec);
    if (whole) {
        TPF_FUZZ_CHECK(head.ok() && whole->payload.size() == head->length);
        TPF_FUZZ_CHECK(whole->payload.data() == stream.data() + sizeof(MsgHeader));
    }

    // The daemon's read loop: every whole frame, in order, until one is refused.
    std::size_t used = 0;
    while (stream.size() - used >= sizeof(MsgHeader)) {
        auto h = decodeHeader(stream.subspan(used), spec);
        if (!h) {
            TPF_FUZZ_CHECK(h.code() == Errc::BadMagic || h.code() == Errc::VersionMismatch || h.code() == Errc::TooLarge);
            break;
        }
        TPF_FUZZ_CHECK(h->length <= spec.maxPayload);
        if (stream.size() - used - sizeof(MsgHeader) < h->length) break; // waits for the rest
        const ByteView frame = frameBytes(stream, used, *h);
        const ByteView payload = frame.subspan(sizeof(MsgHeader));
        used += frame.size();
        if (mode == 2) bootstrapRecord(*h, payload);
        else clientRecord(frame, *h, payload);
    }
    return 0;
}
