// connectUnix: a listener that stopped accepting (full backlog) is reported
// by name within the timeout instead of blocking; the fd it returns is in
// blocking mode, as every user expects.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "catch.hpp"
#include "common/shm.hpp"
#include "common/unix_socket.hpp"

using namespace tpf;

namespace {

struct Listener {
    std::string dir, path;
    UniqueFd fd;
    explicit Listener(int backlog) {
        char tmpl[] = "/tmp/tpf-us-XXXXXX";
        REQUIRE(::mkdtemp(tmpl));
        dir = tmpl;
        path = dir + "/s.sock";
        fd = UniqueFd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
        REQUIRE(fd);
        sockaddr_un a{};
        a.sun_family = AF_UNIX;
        std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
        REQUIRE(::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
        REQUIRE(::listen(fd.get(), backlog) == 0);
    }
    ~Listener() {
        ::unlink(path.c_str());
        ::rmdir(dir.c_str());
    }
};

} // namespace

TEST_CASE("connectUnix connects, and the fd is blocking") {
    Listener l(8);
    auto fd = connectUnix(l.path, 1000);
    REQUIRE(fd.ok());
    CHECK((::fcntl(fd->get(), F_GETFL) & O_NONBLOCK) == 0);
}

TEST_CASE("connectUnix names a missing socket at once") {
    auto fd = connectUnix("/tmp/tpf-no-such-dir/none.sock", 1000);
    REQUIRE(!fd.ok());
    CHECK(fd.code() == Errc::DaemonUnreachable);
    CHECK(fd.error().detail.find("connect to /tmp/tpf-no-such-dir/none.sock") != std::string::npos);
}

TEST_CASE("connectUnix gives up on a full backlog within its timeout") {
    Listener l(0);
    // Fill the backlog: connections nobody accepts, until the listener refuses.
    std::vector<UniqueFd> held;
    for (int i = 0; i < 64; ++i) {
        UniqueFd c(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
        sockaddr_un a{};
        a.sun_family = AF_UNIX;
        std::memcpy(a.sun_path, l.path.c_str(), l.path.size() + 1);
        if (::connect(c.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
            REQUIRE(errno == EAGAIN);
            break;
        }
        held.push_back(std::move(c));
    }
    const std::uint64_t t0 = monotonicNs();
    auto fd = connectUnix(l.path, 200);
    const double ms = double(monotonicNs() - t0) / 1e6;
    REQUIRE(!fd.ok());
    CHECK(fd.code() == Errc::DaemonUnreachable);
    CHECK(fd.error().detail.find("accepted no connection within 200 ms") != std::string::npos);
    CHECK(ms >= 190);
    CHECK(ms < 5000); // bounded, not a timing assertion
}
