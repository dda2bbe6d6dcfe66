// Hostile clients (random bytes, wrong version, length 2^32-1, fds where none
// belong, truncation, requests out of order) are refused and logged while a
// live group keeps working and the daemon keeps serving.
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "catch.hpp"
#include "common/unix_socket.hpp"
#include "harness.hpp"
#include "proto/client_msg.hpp"

using namespace tpf;
using namespace tpf::testing;
using namespace tpf::client_proto;

namespace {

// Send raw bytes (optionally with an fd), then read until the daemon closes.
// Returns the ErrorReply's error name, "closed" if it closed without one.
std::string attack(const std::string& socket, const Bytes& bytes, int fdToSend = -1, bool halfClose = false) {
    auto fd = connectUnix(socket);
    REQUIRE(fd.ok());
    std::vector<int> fds;
    if (fdToSend >= 0) fds.push_back(fdToSend);
    (void)sendMessage(fd->get(), bytes, fds, 2000);
    if (halfClose) ::shutdown(fd->get(), SHUT_WR);
    for (;;) {
        auto m = receiveMessage(fd->get(), kReplySpec, 3000);
        if (!m) return m.code() == Errc::DaemonLost ? "closed" : "no answer: " + m.error().describe();
        if (m->header.opcode == kErrorReply) {
            auto e = decodeFixed<ErrorReply>(m->payload, "ErrorReply");
            REQUIRE(e.ok());
            // The daemon closes after an ErrorReply.
            auto after = receiveMessage(fd->get(), kReplySpec, 3000);
            CHECK(after.code() == Errc::DaemonLost);
            Errc code;
            errcFromWire(e->errc, code);
            return std::string(errcName(code));
        }
    }
}

Bytes hello() { return encode(kHello, 1, Hello{kRoleRank, 0, 0}); }

} // namespace

TEST_CASE("hostile clients are refused by name while a live group keeps working") {
    Daemon d;
    auto run = startRanks(d, 2, {"--iters", "20000", "--sizes", "64,4096", "--mode", "mixed"});

    std::mt19937 rng(42);
    for (int i = 0; i < 20; ++i) {
        // Shorter than a header, the daemon waits for the rest: the client's
        // half-close ends it. A whole header of junk is refused at once.
        Bytes junk(1 + rng() % 200);
        for (auto& b : junk) b = std::uint8_t(rng());
        const auto r = attack(d.socket(), junk, -1, true);
        INFO("random bytes (" << junk.size() << "): " << r);
        CHECK(r == (junk.size() >= sizeof(MsgHeader) ? "BadMagic" : "closed"));
    }
    {
        Bytes b = hello();
        const std::uint16_t v = kClientVersion + 7;
        std::memcpy(b.data() + 4, &v, 2);
        CHECK(attack(d.socket(), b) == "VersionMismatch");
    }
    {
        Bytes b = hello();
        const std::uint32_t len = 0xffffffffu;
        std::memcpy(b.data() + 8, &len, 4);
        CHECK(attack(d.socket(), b) == "TooLarge");
    }
    {
        Bytes b = hello();
        const std::uint32_t len = 0;
        std::memcpy(b.data() + 8, &len, 4);
        b.resize(16);
        CHECK(attack(d.socket(), b) == "Truncated");
    }
    {
        const int fd = ::dup(0); // fds where none belong
        CHECK(attack(d.socket(), hello(), fd) == "BadMessage");
        ::close(fd);
    }
    {
        Bytes b = hello();
        b.resize(b.size() - 3); // truncated message, then the client goes quiet
        CHECK(attack(d.socket(), b, -1, true) == "closed");
    }
    {
        // A group open before Hello; an unknown opcode after Hello; abort without a group.
        CHECK(attack(d.socket(), encodeEmpty(kNodeCardRequest, 1)) == "BadMessage");
        Bytes b = hello();
        Bytes bad = encodeEmpty(999, 2);
        b.insert(b.end(), bad.begin(), bad.end());
        CHECK(attack(d.socket(), b) == "BadMessage");
        Bytes c = hello();
        Bytes ab = encode(kAbort, 2, Abort{});
        c.insert(c.end(), ab.begin(), ab.end());
        CHECK(attack(d.socket(), c) == "PermissionDenied");
    }
    {
        // A GroupOpen whose rank is out of range.
        GroupOpen m;
        m.fixed.world = 2;
        m.fixed.rank = 5;
        m.fixed.timeoutMs = 1000;
        m.fixed.regionKind = kRegionHost;
        m.roster.resize(2);
        Bytes b = hello();
        Bytes g = encode(2, m);
        b.insert(b.end(), g.begin(), g.end());
        CHECK(attack(d.socket(), b) == "OutOfRange");
    }

    std::vector<Child*> all;
    for (auto& c : run.ranks) all.push_back(&c);
    REQUIRE(waitAll(all, 300000));
    CHECK(run.line(0) == "RESULT rank=0 ok calls=20000");
    CHECK(run.line(1) == "RESULT rank=1 ok calls=20000");
    CHECK(statusJson(d.socket()).find("\"status_version\":1") != std::string::npos);
    const std::string log = d.log();
    CHECK(log.find("refused: VersionMismatch") != std::string::npos);
    CHECK(log.find("refused: TooLarge") != std::string::npos);
    CHECK(log.find("refused: BadMessage: 1 file descriptor(s) sent where none belong") != std::string::npos);
    CHECK(d.stop() == 0);
}
