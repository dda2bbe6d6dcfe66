// The tcp wire's data link (daemon/tcp/) over a real TCP connection on
// loopback: frames land byte-exact with their flags, a frame larger than the
// send buffer goes out in parts, the receiver thread lands frames and reports
// a bad one, and a close between frames is no failure.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "catch.hpp"

#include "daemon/tcp/tcp_link.hpp"
#include "daemon/tcp/tcp_receiver.hpp"

using namespace tpf;
using namespace tpf::daemon;
using peer_proto::TcpFrame;

namespace {

// A connected pair of TCP sockets on 127.0.0.1.
std::pair<UniqueFd, UniqueFd> tcpPair() {
    UniqueFd lst(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    REQUIRE(lst);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(lst.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(lst.get(), 1) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(lst.get(), reinterpret_cast<sockaddr*>(&a), &len) == 0);
    UniqueFd c(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    REQUIRE(::connect(c.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    UniqueFd s(::accept4(lst.get(), nullptr, nullptr, SOCK_CLOEXEC));
    REQUIRE(s);
    return {std::move(c), std::move(s)};
}

// World 2: rank 0 on node A, rank 1 on node B, each with its region.
struct TwoNodes {
    Layout layout = *Layout::of(2, slotBytesFor(1 << 20), 1);
    std::shared_ptr<HostRegion> r0 = *HostRegion::create(layout, "tpf-test-tcp-r0");
    std::shared_ptr<HostRegion> r1 = *HostRegion::create(layout, "tpf-test-tcp-r1");
    std::shared_ptr<TcpLink> a, b; // a: node A's link to B; b: B's to A

    explicit TwoNodes(std::uint64_t sendBuffer = 4u << 20) {
        auto [x, y] = tcpPair();
        const int small = 32 * 1024; // a receive buffer that cannot take a whole large frame either
        if (sendBuffer < (1u << 20)) ::setsockopt(y.get(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
        std::array<std::shared_ptr<HostRegion>, kMaxWorld> ra{}, rb{};
        ra[0] = r0;
        rb[1] = r1;
        a = std::make_shared<TcpLink>(std::move(x), layout, 7, NodeId{}, "b:1", 0b10, 0b01, ra, sendBuffer);
        b = std::make_shared<TcpLink>(std::move(y), layout, 7, NodeId{}, "a:1", 0b01, 0b10, rb, sendBuffer);
    }
    // Rank 0's shard of `bytes` for `epoch` staged in its own slot.
    void stage(std::uint64_t epoch, std::uint32_t bytes) {
        std::uint8_t* p = r0->slot(phaseOf(epoch), 0);
        for (std::uint32_t i = 0; i < bytes; ++i) p[i] = std::uint8_t(epoch * 31 + i * 7);
    }
    TcpFrame frame(std::uint64_t epoch, std::uint32_t bytes) const {
        TcpFrame f{};
        f.magic = peer_proto::kTcpFrameMagic;
        f.src = 0;
        f.dst = 1;
        f.phase = std::uint8_t(phaseOf(epoch));
        f.bytes = bytes;
        f.epoch = epoch;
        return f;
    }
    bool landed(std::uint64_t epoch, std::uint32_t bytes) const {
        const std::uint64_t* flag = r1->flag(phaseOf(epoch), 0, 0);
        for (std::uint32_t c = 0; c < kFlagCopies; ++c)
            if (std::atomic_ref(flag[c * kFlagCopyStride / 8]).load() != epoch) return false;
        return std::memcmp(r1->slot(phaseOf(epoch), 0), r0->slot(phaseOf(epoch), 0), bytes) == 0;
    }
};

// Node B reads until its link ends (or 0.1 s of reads found nothing more).
TcpLink::Read readUntilEnd(TcpLink& link) {
    TcpLink::Read r = TcpLink::Read::More;
    for (int i = 0; i < 1000 && r == TcpLink::Read::More; ++i) {
        r = link.receive();
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return r;
}

// Node A sends frame `f` (16 bytes of rank 0's slot) and node B reads it: the link must fail.
void expectRefused(TwoNodes& n, const TcpFrame& f) {
    bool first = false;
    REQUIRE(n.a->send(f, n.r0->slot(1, 0), first) == TcpLink::Sent::Done);
    REQUIRE(readUntilEnd(*n.b) == TcpLink::Read::Failed);
    REQUIRE(n.b->error());
}

} // namespace

TEST_CASE("tcp frames land byte-exact with every copy of their flag") {
    TwoNodes n;
    std::uint64_t epoch = 1;
    for (std::uint32_t bytes : {0u, 16u, 24u, 1000u, 4096u, 4104u, 65536u}) {
        n.stage(epoch, bytes);
        bool first = false;
        REQUIRE(n.a->send(n.frame(epoch, bytes), n.r0->slot(phaseOf(epoch), 0), first) == TcpLink::Sent::Done);
        for (int i = 0; i < 1000 && !n.landed(epoch, bytes); ++i) {
            REQUIRE(n.b->receive() == TcpLink::Read::More);
            std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
        CHECK(n.landed(epoch, bytes));
        ++epoch;
    }
    CHECK(n.a->framesSent() == 7);
    CHECK(n.b->framesReceived() == 7);
    CHECK(n.a->bytesSent() == n.b->bytesReceived());
    CHECK_FALSE(n.a->failed());
}

TEST_CASE("a frame larger than the send buffer goes out in parts while the other node reads") {
    TwoNodes n(64 * 1024);
    const std::uint32_t bytes = 1 << 20;
    n.stage(1, bytes);
    bool first = false;
    auto sent = n.a->send(n.frame(1, bytes), n.r0->slot(1, 0), first);
    int parts = 0;
    for (int i = 0; i < 100000 && !(sent == TcpLink::Sent::Done && n.landed(1, bytes)); ++i) {
        REQUIRE(n.b->receive() == TcpLink::Read::More);
        if (sent == TcpLink::Sent::Full) {
            ++parts;
            sent = n.a->flush(first);
        }
    }
    CHECK(parts > 0);
    CHECK(sent == TcpLink::Sent::Done);
    CHECK(n.landed(1, bytes));
    CHECK_FALSE(n.a->inFlight()); // flushed and, once read, acknowledged
}

TEST_CASE("a bad frame fails the link with a named error; a close between frames does not") {
    SECTION("a frame from a rank the other node does not serve") {
        TwoNodes n;
        TcpFrame f = n.frame(1, 16);
        f.src = 1;
        expectRefused(n, f);
        CHECK(n.b->error()->code == Errc::BadMessage);
        CHECK(n.b->error()->detail.find("tcp link to node") != std::string::npos);
        CHECK(n.b->error()->detail.find("from rank 1") != std::string::npos);
    }
    SECTION("past the slot") {
        TwoNodes n;
        TcpFrame f = n.frame(1, 16);
        f.offset = n.layout.slotBytes;
        expectRefused(n, f);
        CHECK(n.b->error()->code == Errc::OutOfRange);
    }
    SECTION("closed between frames") {
        TwoNodes n;
        n.a.reset(); // closes node A's end
        CHECK(readUntilEnd(*n.b) == TcpLink::Read::Closed);
        CHECK_FALSE(n.b->failed());
    }
}

TEST_CASE("the receiver thread lands frames and reports a failed link once") {
    TwoNodes n;
    TcpReceiver receiver;
    std::atomic<int> failures{0};
    n.b->onReceiveFailed = [&](const Error&) { failures.fetch_add(1); };
    REQUIRE(receiver.add(n.b));
    CHECK(receiver.links() == 1);
    bool first = false;
    for (std::uint64_t epoch = 1; epoch <= 50; ++epoch) {
        n.stage(epoch, 4104);
        while (n.a->send(n.frame(epoch, 4104), n.r0->slot(phaseOf(epoch), 0), first) != TcpLink::Sent::Done) {}
        for (int i = 0; i < 20000 && !n.landed(epoch, 4104); ++i) std::this_thread::sleep_for(std::chrono::microseconds(50));
        REQUIRE(n.landed(epoch, 4104));
    }
    TcpFrame bad = n.frame(51, 16);
    bad.magic = 0;
    REQUIRE(n.a->send(bad, n.r0->slot(1, 0), first) == TcpLink::Sent::Done);
    for (int i = 0; i < 20000 && failures.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::microseconds(50));
    CHECK(failures.load() == 1);
    CHECK(receiver.links() == 0);
    CHECK(n.b->error()->code == Errc::BadMagic);
    receiver.stop();
}
