// libFuzzer target: the client<->daemon control protocol. The first input
// byte picks the direction and, for requests, how many fds arrive with the
// bytes and where the stream is cut in two reads.
// - Requests: the daemon's own ControlDispatch (daemon/control/dispatch.*,
//   what Connection runs on its socket) takes the stream as a client sent it.
//   Checked: every refusal names an error and ends the session; nothing is
//   dispatched after that; a record reaching the group table is in range and
//   re-encodes to the very payload it came from (DeviceAttach included); replies are whole frames;
//   fds never leak (LeakSanitizer) and reach ShareRegion (one) and Adopt (two) only.
// - Replies: each frame's record decoder, as a client reads them; a decoded
//   record re-encodes to exactly the bytes it came from.
// - Bootstrap: the loopback bootstrap's framing and records.
#include <sys/eventfd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "daemon/control/dispatch.hpp"
#include "fuzz_common.hpp"
#include "proto/bootstrap.hpp"
#include "proto/client_msg.hpp"

using namespace tpf;
using namespace tpf::client_proto;

namespace {

/// The group table and socket as the dispatch sees them, checking what it asks.
class CheckedRequests final : public daemon::ControlRequests {
public:
    CheckedRequests(std::vector<Bytes> payloads, bool refuseJoins)
        : payloads_(std::move(payloads)), refuseJoins_(refuseJoins) {}
    daemon::ControlDispatch* dispatch = nullptr;

    void reply(Bytes m) override {
        TPF_FUZZ_CHECK(!ended_);
        auto f = decodeFrame(ByteView(m), kReplySpec);
        TPF_FUZZ_CHECK(f.ok() && sizeof(MsgHeader) + f->payload.size() == m.size());
    }
    void refuse(Errc code, const std::string& why) override {
        TPF_FUZZ_CHECK(!ended_ && code != Errc::Ok && !why.empty());
        ended_ = true;
    }
    void finish() override {
        TPF_FUZZ_CHECK(!ended_);
        ended_ = true;
    }
    HelloReply helloReply() override {
        HelloReply h{};
        h.protocol = kClientVersion;
        return h;
    }
    NodeCard nodeCard() override { return NodeCard{}; }
    std::string statusJson() override { return "{}"; }
    void join(const GroupOpen& m) override {
        TPF_FUZZ_CHECK(!ended_ && !inGroup_);
        TPF_FUZZ_CHECK(m.fixed.world >= 2 && m.fixed.world <= kMaxWorld);
        TPF_FUZZ_CHECK(m.roster.size() == m.fixed.world && m.fixed.rank < m.fixed.world);
        TPF_FUZZ_CHECK(camePayload(encode(0, m)));
        inGroup_ = !refuseJoins_;
        if (refuseJoins_) dispatch->groupRefused(); // as a refusing verdict does, at once
    }
    void leave() override {
        TPF_FUZZ_CHECK(!ended_ && inGroup_);
        inGroup_ = false;
    }
    void abort() override { TPF_FUZZ_CHECK(!ended_ && inGroup_); }
    void openReport(const OpenReport& m) override {
        TPF_FUZZ_CHECK(!ended_ && !reported_);
        TPF_FUZZ_CHECK(m.errc != 0 && (m.outcome == kOutcomeNccl || m.outcome == kOutcomeUnavailable));
        TPF_FUZZ_CHECK(camePayload(encode(kOpenReport, 0, m)));
        reported_ = true;
    }
    void adopt(const Adopt& m, UniqueFd region, UniqueFd ring) override {
        TPF_FUZZ_CHECK(!ended_ && !inGroup_ && region.get() >= 0 && ring.get() >= 0);
        TPF_FUZZ_CHECK(m.fixed.world >= 2 && m.fixed.world <= kMaxWorld);
        TPF_FUZZ_CHECK(m.roster.size() == m.fixed.world && m.fixed.rank < m.fixed.world);
        TPF_FUZZ_CHECK(camePayload(encode(0, m)));
        inGroup_ = !refuseJoins_;
        if (refuseJoins_) dispatch->groupRefused(); // as a refusing Adopted does, at once
    }
    Status shareRegion(const ShareRegion& m, int fd) override {
        TPF_FUZZ_CHECK(!ended_ && inGroup_ && fd >= 0);
        TPF_FUZZ_CHECK(camePayload(encode(kShareRegion, 0, m)));
        return okStatus();
    }
    Status deviceAttach(const DeviceAttach& m) override {
        TPF_FUZZ_CHECK(!ended_ && inGroup_);
        TPF_FUZZ_CHECK(m.world >= 2 && m.world <= kMaxWorld && m.rank < m.world && m.wires[m.rank] == kWireSelf);
        TPF_FUZZ_CHECK(m.deviceBytes <= kMaxSharedRegionBytes && m.reserved == 0);
        for (std::uint32_t q = 0; q < kMaxWorld; ++q)
            TPF_FUZZ_CHECK(q < m.world ? m.wires[q] <= kLastWire && (m.wires[q] == kWireSelf) == (q == m.rank)
                                       : m.wires[q] == 0);
        TPF_FUZZ_CHECK(camePayload(encode(kDeviceAttach, 0, m)));
        // The group table refuses a report that does not fit the sender's group: so does this half the time.
        if (m.group & 1) return Error{Errc::GroupMismatch, "DeviceAttach for another group"};
        return okStatus();
    }
    bool closed() const override { return false; }

    bool ended() const { return ended_; }

private:
    // A record's encoding, less its header, is one of the stream's payloads.
    bool camePayload(const Bytes& encoded) const {
        const ByteView p = ByteView(encoded).subspan(sizeof(MsgHeader));
        return std::any_of(payloads_.begin(), payloads_.end(), [&](const Bytes& q) {
            return q.size() == p.size() && std::equal(q.begin(), q.end(), p.begin());
        });
    }
    std::vector<Bytes> payloads_;
    bool refuseJoins_;
    bool ended_ = false;
    bool inGroup_ = false;
    bool reported_ = false;
};

// Whole frames at the front of `stream`, as decodeHeader cuts them.
std::vector<Bytes> framePayloads(ByteView stream, const ProtocolSpec& spec) {
    std::vector<Bytes> out;
    std::size_t used = 0;
    while (stream.size() - used >= sizeof(MsgHeader)) {
        auto h = decodeHeader(stream.subspan(used), spec);
        if (!h) {
            TPF_FUZZ_CHECK(h.code() == Errc::BadMagic || h.code() == Errc::VersionMismatch || h.code() == Errc::TooLarge);
            break;
        }
        TPF_FUZZ_CHECK(h->length <= spec.maxPayload);
        if (stream.size() - used - sizeof(MsgHeader) < h->length) break;
        const ByteView p = stream.subspan(used + sizeof(MsgHeader), h->length);
        out.emplace_back(p.begin(), p.end());
        used += sizeof(MsgHeader) + h->length;
    }
    return out;
}

void requests(ByteView stream, std::uint8_t knobs) {
    const std::size_t nfds = knobs % 3;
    const bool refuseJoins = (knobs / 3) & 1;
    const std::size_t cut = std::min<std::size_t>(stream.size(), std::size_t(knobs / 6) * stream.size() / 14);
    CheckedRequests to(framePayloads(stream, kRequestSpec), refuseJoins);
    daemon::ControlDispatch dispatch(to);
    to.dispatch = &dispatch;
    std::vector<UniqueFd> fds;
    for (std::size_t i = 0; i < nfds; ++i) fds.emplace_back(::eventfd(0, EFD_CLOEXEC));
    // Two reads, as a socket may deliver them: the buffer keeps what was not used.
    Bytes buf(stream.begin(), stream.begin() + std::ptrdiff_t(cut));
    std::size_t used = dispatch.feed(ByteView(buf), fds);
    TPF_FUZZ_CHECK(used <= buf.size());
    if (!dispatch.ended()) {
        buf.erase(buf.begin(), buf.begin() + std::ptrdiff_t(used));
        buf.insert(buf.end(), stream.begin() + std::ptrdiff_t(cut), stream.end());
        used = dispatch.feed(ByteView(buf), fds);
        TPF_FUZZ_CHECK(used <= buf.size());
    }
    TPF_FUZZ_CHECK(dispatch.ended() == to.ended());
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

// The records a client reads.
void replyRecord(ByteView frame, const MsgHeader& h, ByteView payload) {
    switch (h.opcode) {
    case kHelloReply: fixedRecord<HelloReply>(frame, h, payload, "HelloReply"); break;
    case kClosed: TPF_FUZZ_CHECK(bool(expectEmpty(payload, "Closed")) == payload.empty()); break;
    case kNodeCard: {
        auto m = decodeNodeCard(payload);
        if (!m) break;
        TPF_FUZZ_CHECK(m->hcas.size() == m->fixed.hcaCount && m->hcas.size() <= kMaxStripes);
        const Bytes again = encode(h.seq, *m);
        TPF_FUZZ_CHECK(again.size() == frame.size() && std::memcmp(again.data(), frame.data(), frame.size()) == 0);
        break;
    }
    case kVerdict: fixedRecord<Verdict>(frame, h, payload, "Verdict"); break;
    case kStatusReply: {
        auto m = decodeStatusReply(payload);
        if (m) TPF_FUZZ_CHECK(m->size() == payload.size() && m->find('\0') == std::string::npos);
        break;
    }
    case kErrorReply: fixedRecord<ErrorReply>(frame, h, payload, "ErrorReply"); break;
    case kPeerRegion: fixedRecord<PeerRegion>(frame, h, payload, "PeerRegion"); break;
    case kPeerHostRegion: fixedRecord<PeerHostRegion>(frame, h, payload, "PeerHostRegion"); break;
    case kAdopted: fixedRecord<Adopted>(frame, h, payload, "Adopted"); break;
    case kGroupFailed: fixedRecord<GroupFailed>(frame, h, payload, "GroupFailed"); break;
    default: break; // a client ignores nothing silently: it fails the call (client/)
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
    if (mode == 0) {
        requests(stream, std::uint8_t(data[0] / 3));
        return 0;
    }
    const ProtocolSpec& spec = mode == 1 ? kReplySpec : bootstrap_proto::kBootstrapSpec;

    // decodeFrame on the whole input must agree with decodeHeader + the length rule.
    auto whole = decodeFrame(stream, spec);
    auto head = decodeHeader(stream, spec);
    if (whole) {
        TPF_FUZZ_CHECK(head.ok() && whole->payload.size() == head->length);
        TPF_FUZZ_CHECK(whole->payload.data() == stream.data() + sizeof(MsgHeader));
    }
    std::size_t used = 0;
    while (stream.size() - used >= sizeof(MsgHeader)) {
        auto h = decodeHeader(stream.subspan(used), spec);
        if (!h) break;
        if (stream.size() - used - sizeof(MsgHeader) < h->length) break;
        const ByteView frame = stream.subspan(used, sizeof(MsgHeader) + h->length);
        used += frame.size();
        if (mode == 2) bootstrapRecord(*h, frame.subspan(sizeof(MsgHeader)));
        else replyRecord(frame, *h, frame.subspan(sizeof(MsgHeader)));
    }
    return 0;
}
