// The backend of daemon/verbs/qp.hpp for tests: see fake_nic.hpp.
#include "fake_nic.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <map>

#include "daemon/verbs/qp.hpp"

namespace tpf::testing {
namespace {

struct Post {
    daemon::QpLink* link;
    std::uint8_t* dst;       ///< payload in the remote region
    const std::uint8_t* src; ///< the staged slot in the local region
    std::uint64_t payload;
    std::uint64_t* flag;
    std::uint64_t epoch;
    std::uint32_t srcRank;
    std::uint64_t offset; ///< of the stripe in the shard
    std::uint64_t bytes;  ///< as the gate counts them: payload + flag
    std::uint32_t wrs;
};
struct QpCount {
    std::uint32_t maxWrs = 0;
    std::uint64_t bytes = 0;
    std::uint32_t wrs = 0;
};

std::map<const daemon::VerbsHca*, std::deque<Post>> cqs; // posts not completed, in post order
std::map<const daemon::QpLink*, QpCount> qps;
std::uint32_t nextQpn = 100;

void note(const std::string& what) {
    auto& notes = fakeNic().report.notes;
    if (notes.size() < 8) notes.push_back(what);
}

void land(const Post& p) {
    NicReport& r = fakeNic().report;
    if (const auto expected = fakeNic().expected)
        for (std::uint64_t i = 0; i < p.payload; ++i)
            if (p.src[i] != expected(p.epoch, p.srcRank, p.offset + i)) {
                ++r.wrongBytes;
                note("epoch " + std::to_string(p.epoch) + " of rank " + std::to_string(p.srcRank) + ": byte " +
                     std::to_string(p.offset + i) + " is not what the rank staged");
                break;
            }
    std::memcpy(p.dst, p.src, p.payload);
    std::atomic_ref(*p.flag).store(p.epoch, std::memory_order_release); // chained after the payload, as on the wire
    auto& q = qps[p.link];
    q.bytes -= p.bytes;
    q.wrs -= p.wrs;
    ++r.completions;
}

} // namespace

FakeNic& fakeNic() {
    static FakeNic nic;
    return nic;
}

void resetFakeNic() {
    cqs.clear();
    qps.clear();
    fakeNic() = FakeNic{};
}

} // namespace tpf::testing

namespace tpf::daemon {

using testing::fakeNic;

Result<std::shared_ptr<VerbsHca>> VerbsHca::open(const client_proto::HcaCard& card, std::uint32_t cqDepth) {
    std::shared_ptr<VerbsHca> h(new VerbsHca());
    h->card_ = card;
    h->cqDepth_ = cqDepth;
    return h;
}
VerbsHca::~VerbsHca() = default;
std::string VerbsHca::name() const {
    std::string s;
    getText(card_.device, s);
    return s;
}

Result<std::unique_ptr<VerbsMr>> VerbsMr::reg(std::shared_ptr<VerbsHca> hca, void* addr, std::uint64_t bytes,
                                              std::shared_ptr<const void> memory) {
    std::unique_ptr<VerbsMr> m(new VerbsMr());
    m->hca_ = std::move(hca);
    m->memory_ = std::move(memory);
    m->addr_ = reinterpret_cast<std::uintptr_t>(addr);
    m->bytes_ = bytes;
    return m;
}
VerbsMr::~VerbsMr() = default;
std::uint32_t VerbsMr::lkey() const { return 0; }
std::uint32_t VerbsMr::rkey() const { return 0; }

Result<std::unique_ptr<QpLink>> QpLink::create(std::shared_ptr<VerbsHca> hca, std::uint32_t maxSendWr,
                                               std::uint64_t inflightCap) {
    std::unique_ptr<QpLink> l(new QpLink());
    l->hca_ = std::move(hca);
    l->gate.reset(inflightCap, maxSendWr);
    l->psn_ = testing::nextQpn++; // the fake has no ibv_qp: its psn doubles as its number
    testing::qps[l.get()].maxWrs = maxSendWr;
    return l;
}
QpLink::~QpLink() = default;
std::uint32_t QpLink::qpn() const { return psn_; }
Status QpLink::connect(const RemoteQp& r) {
    remote = r;
    return okStatus();
}
void QpLink::flush() {} // the fake never retires a group's links

// What qp.cpp posts (payload WRITE chained to the flag WRITE), queued on the
// CQ; the NIC's own counts checked before the gate's bookkeeping runs.
Status QpLink::postStripe(const Layout& layout, std::uint32_t phase, std::uint32_t src, std::uint32_t stripe,
                          const Stripe& s, std::uint64_t epoch) {
    auto& r = fakeNic().report;
    auto& q = testing::qps[this];
    auto& cq = testing::cqs[hca_.get()];
    const std::uint32_t wrs = s.bytes ? 2 : 1;
    const std::uint64_t bytes = s.bytes + sizeof epoch;
    if (q.bytes >= gate.cap()) {
        ++r.capExceeded;
        testing::note("post of " + std::to_string(bytes) + " bytes on QP " + std::to_string(qpn()) + " with " +
                      std::to_string(q.bytes) + " outstanding, cap " + std::to_string(gate.cap()));
    }
    if (q.wrs + wrs > q.maxWrs) {
        ++r.sendQueueFull;
        testing::note("post on QP " + std::to_string(qpn()) + " with its send queue full");
    }
    if (2 * (cq.size() + 1) > hca_->cqDepth()) { // an erroring QP completes payloads too: two per post
        ++r.cqOverrun;
        testing::note("post with " + std::to_string(cq.size()) + " flags outstanding on a CQ of " +
                      std::to_string(hca_->cqDepth()));
    }
    const std::uint64_t slot = layout.slotOffset(phase, src) + s.offset;
    auto* base = reinterpret_cast<std::uint8_t*>(remote.regionAddr);
    cq.push_back(testing::Post{this, base + slot, localBase + slot, s.bytes,
                               reinterpret_cast<std::uint64_t*>(base + layout.flagOffset(phase, src, stripe)), epoch,
                               src, s.offset, bytes, wrs});
    q.bytes += bytes;
    q.wrs += wrs;
    r.largestOutstanding = std::max(r.largestOutstanding, q.bytes);
    r.largestPost = std::max(r.largestPost, bytes);
    ++r.posts;
    notePosted(bytes, wrs);
    return okStatus();
}

// Up to maxPerPoll of the oldest posts complete (RC: in order per QP).
std::uint32_t pollCompletions(VerbsHca& hca, QpErrorFn, void*) {
    auto& nic = fakeNic();
    auto& cq = testing::cqs[&hca];
    std::uint32_t n = std::uint32_t(nic.rng() % (nic.maxPerPoll + 1));
    n = std::min<std::uint32_t>(n, std::uint32_t(cq.size()));
    for (std::uint32_t i = 0; i < n; ++i) {
        const testing::Post p = cq.front();
        cq.pop_front();
        testing::land(p);
        p.link->retireOne();
    }
    return n;
}

} // namespace tpf::daemon
