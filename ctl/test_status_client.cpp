// `tpfabricctl status` socket exchange (ctl/status_client.hpp) against a fake
// daemon on a temporary socket: the good path, and every way the daemon can
// fail to answer — refused, garbage, wrong opcode or seq, silence, hang-up,
// bad JSON — each named in one operator line.
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "catch.hpp"
#include "common/unix_socket.hpp"
#include "ctl/status_client.hpp"
#include "proto/client_msg.hpp"

using namespace tpf;
using namespace tpf::client_proto;

namespace {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Listens on <tmpdir>/d.sock; a thread accepts one connection and runs `script`
// on it, then waits (bounded) for the client to hang up.
class FakeDaemon {
public:
    explicit FakeDaemon(std::function<void(int)> script) {
        char tmpl[] = "/tmp/tpf-ctl-test-XXXXXX";
        REQUIRE(::mkdtemp(tmpl));
        dir_ = tmpl;
        path_ = dir_ + "/d.sock";
        listen_ = UniqueFd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        std::strcpy(addr.sun_path, path_.c_str());
        REQUIRE(::bind(listen_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
        REQUIRE(::listen(listen_.get(), 4) == 0);
        thread_ = std::thread([this, script = std::move(script)] {
            pollfd p{listen_.get(), POLLIN, 0};
            if (::poll(&p, 1, 5000) != 1) return;
            UniqueFd conn(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
            if (!conn) return;
            script(conn.get());
            pollfd q{conn.get(), POLLIN, 0};
            char sink[256];
            while (::poll(&q, 1, 5000) == 1 && ::recv(conn.get(), sink, sizeof sink, 0) > 0) {
            }
        });
    }
    ~FakeDaemon() {
        thread_.join();
        ::unlink(path_.c_str());
        ::rmdir(dir_.c_str());
    }
    const std::string& path() const { return path_; }

private:
    std::string dir_, path_;
    UniqueFd listen_;
    std::thread thread_;
};

void send(int fd, const Bytes& bytes) { (void)sendMessage(fd, bytes, {}, 2000); }

// Read one request; returns its header (opcode 0 when none arrived).
MsgHeader expectRequest(int fd) {
    auto m = receiveMessage(fd, kRequestSpec, 2000);
    return m ? m->header : MsgHeader{};
}

HelloReply helloReply() {
    HelloReply r{};
    setText(r.daemonVersion, "0.1.0");
    r.protocol = kClientVersion;
    return r;
}

ErrorReply errorReply(std::uint16_t errc, const char* message) {
    ErrorReply e{};
    e.errc = errc;
    e.missingPeer = 0xffffffffu;
    setText(e.message, message);
    return e;
}

// Answers Hello properly, then does `then` with the StatusRequest's header.
std::function<void(int)> afterHello(std::function<void(int, const MsgHeader&)> then) {
    return [then = std::move(then)](int fd) {
        const MsgHeader h = expectRequest(fd);
        if (h.opcode != kHello) return;
        send(fd, encode(kHelloReply, h.seq, helloReply()));
        const MsgHeader s = expectRequest(fd);
        if (s.opcode != kStatusRequest) return;
        then(fd, s);
    };
}

std::function<void(int)> replyJson(std::string text) {
    return afterHello([text = std::move(text)](int fd, const MsgHeader& s) { send(fd, encodeStatusReply(s.seq, text)); });
}

} // namespace

TEST_CASE("status: Hello as a control client, then the document") {
    std::uint32_t role = 0;
    FakeDaemon d([&role](int fd) {
        auto m = receiveMessage(fd, kRequestSpec, 2000);
        if (!m || m->header.opcode != kHello) return;
        auto hello = decodeFixed<Hello>(m->payload, "Hello");
        if (hello) role = hello->role;
        send(fd, encode(kHelloReply, m->header.seq, helloReply()));
        auto s = receiveMessage(fd, kRequestSpec, 2000);
        if (!s || s->header.opcode != kStatusRequest || !decodeFixed<StatusRequest>(s->payload, "StatusRequest")) return;
        send(fd, encodeStatusReply(s->header.seq, R"({"status_version": 1, "clients": 5, "hcas": []})"));
    });
    auto doc = ctl::fetchStatus(d.path(), 2000);
    REQUIRE(doc);
    CHECK(doc->value("clients", 0) == 5);
    CHECK(doc->contains("hcas"));
    CHECK(role == kRoleControl);
}

TEST_CASE("status: no daemon at the path") {
    const std::string path = "/tmp/tpf-ctl-test-no-such-dir/d.sock";
    auto doc = ctl::fetchStatus(path, 500);
    REQUIRE_FALSE(doc);
    CHECK(doc.code() == Errc::DaemonUnreachable);
    const std::string& line = doc.error().detail;
    INFO(line);
    CHECK(line == "cannot reach tpfabricd at " + path +
                      ": connect: No such file or directory (is the daemon running? systemctl status tpfabricd; "
                      "or pass --socket or set TPF_SOCKET)");
}

TEST_CASE("status: a path that is not a socket is named for what it is") {
    char tmpl[] = "/tmp/tpf-ctl-test-XXXXXX";
    REQUIRE(::mkdtemp(tmpl));
    const std::string dir = tmpl;
    const std::string file = dir + "/tpfabricd.sock";
    std::FILE* f = std::fopen(file.c_str(), "w");
    REQUIRE(f);
    std::fputs("not a socket\n", f);
    std::fclose(f);
    const std::string check = " (check --socket / TPF_SOCKET: the daemon's daemon.socket)";

    SECTION("a regular file") {
        auto doc = ctl::fetchStatus(file, 500);
        REQUIRE_FALSE(doc);
        CHECK(doc.code() == Errc::DaemonUnreachable);
        CHECK(doc.error().detail == "cannot reach tpfabricd: " + file + " is a regular file, not a socket" + check);
    }
    SECTION("a directory") {
        auto doc = ctl::fetchStatus(dir, 500);
        REQUIRE_FALSE(doc);
        CHECK(doc.error().detail == "cannot reach tpfabricd: " + dir + " is a directory, not a socket" + check);
    }
    SECTION("a path through a file") {
        auto doc = ctl::fetchStatus(file + "/d.sock", 500);
        REQUIRE_FALSE(doc);
        CHECK(doc.error().detail == "cannot reach tpfabricd at " + file +
                                        "/d.sock: connect: Not a directory (a directory of that path is a file; "
                                        "check --socket / TPF_SOCKET: the daemon's daemon.socket)");
    }
    SECTION("a socket nobody listens on is still called stale") {
        const std::string sock = dir + "/stale.sock";
        {
            UniqueFd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
            sockaddr_un addr{};
            addr.sun_family = AF_UNIX;
            std::strcpy(addr.sun_path, sock.c_str());
            REQUIRE(::bind(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
        } // closed without listening: the file stays, connect is refused
        auto doc = ctl::fetchStatus(sock, 500);
        REQUIRE_FALSE(doc);
        INFO(doc.error().detail);
        CHECK(has(doc.error().detail, ": connect: Connection refused (nothing listens on that path: a stale socket of a tpfabricd that died"));
        ::unlink(sock.c_str());
    }
    ::unlink(file.c_str());
    ::rmdir(dir.c_str());
}

TEST_CASE("status: a socket path too long for a Unix address") {
    const std::string path = "/tmp/" + std::string(120, 'x') + ".sock";
    auto doc = ctl::fetchStatus(path, 500);
    REQUIRE_FALSE(doc);
    INFO(doc.error().detail);
    CHECK(doc.code() == Errc::DaemonUnreachable);
    CHECK(has(doc.error().detail, ": path longer than a Unix socket address allows (107 bytes; pass a shorter --socket)"));
}

TEST_CASE("status: the daemon refuses with an ErrorReply") {
    SECTION("a known code: its name, the daemon's message and what to do") {
        FakeDaemon d([](int fd) {
            const MsgHeader h = expectRequest(fd);
            send(fd, encode(kErrorReply, h.seq, errorReply(std::uint16_t(Errc::PermissionDenied), "PermissionDenied: uid 1000 not in group")));
        });
        auto doc = ctl::fetchStatus(d.path(), 2000);
        REQUIRE_FALSE(doc);
        INFO(doc.error().detail);
        CHECK(doc.code() == Errc::PermissionDenied);
        CHECK(has(doc.error().detail, "tpfabricd at " + d.path() + " refused Hello: PermissionDenied: uid 1000 not in group ("));
    }
    SECTION("a code from a newer release is still shown") {
        FakeDaemon d(afterHello([](int fd, const MsgHeader& s) {
            send(fd, encode(kErrorReply, s.seq, errorReply(999, "shiny new failure")));
        }));
        auto doc = ctl::fetchStatus(d.path(), 2000);
        REQUIRE_FALSE(doc);
        INFO(doc.error().detail);
        CHECK(doc.code() == Errc::BadMessage);
        CHECK(has(doc.error().detail, "refused the status request: error code 999: shiny new failure"));
    }
}

TEST_CASE("status: replies that are not what was asked") {
    SECTION("bytes of another protocol") {
        FakeDaemon d([](int fd) {
            expectRequest(fd);
            const std::string http = "HTTP/1.1 400 Bad Request\r\n\r\n";
            (void)::send(fd, http.data(), http.size(), MSG_NOSIGNAL);
        });
        auto doc = ctl::fetchStatus(d.path(), 2000);
        REQUIRE_FALSE(doc);
        INFO(doc.error().detail);
        CHECK(doc.code() == Errc::BadMagic);
        CHECK(has(doc.error().detail, "answered with bytes that are not a tpfabric reply"));
    }
    SECTION("an unexpected opcode") {
        FakeDaemon d([](int fd) {
            const MsgHeader h = expectRequest(fd);
            send(fd, encodeEmpty(kClosed, h.seq));
        });
        auto doc = ctl::fetchStatus(d.path(), 2000);
        REQUIRE_FALSE(doc);
        INFO(doc.error().detail);
        CHECK(doc.code() == Errc::BadMessage);
        CHECK(has(doc.error().detail, "answered Hello with Closed (12), expected HelloReply (2)"));
    }
    SECTION("a reply to another request (seq)") {
        FakeDaemon d(afterHello([](int fd, const MsgHeader& s) {
            send(fd, encodeStatusReply(s.seq + 7, "{}"));
        }));
        auto doc = ctl::fetchStatus(d.path(), 2000);
        REQUIRE_FALSE(doc);
        INFO(doc.error().detail);
        CHECK(has(doc.error().detail, "with seq 9, expected 2"));
    }
    SECTION("a HelloReply of the wrong size") {
        FakeDaemon d([](int fd) {
            const MsgHeader h = expectRequest(fd);
            send(fd, encode(kHelloReply, h.seq, std::uint64_t{0}));
        });
        auto doc = ctl::fetchStatus(d.path(), 2000);
        REQUIRE_FALSE(doc);
        INFO(doc.error().detail);
        CHECK(doc.code() == Errc::Truncated);
        CHECK(has(doc.error().detail, "sent a malformed HelloReply"));
    }
}

TEST_CASE("status: silence and hang-ups") {
    SECTION("no answer within the timeout") {
        FakeDaemon d([](int fd) {
            expectRequest(fd);
            // Say nothing; the client gives up and hangs up.
        });
        auto doc = ctl::fetchStatus(d.path(), 200);
        REQUIRE_FALSE(doc);
        INFO(doc.error().detail);
        CHECK(doc.code() == Errc::Timeout);
        CHECK(has(doc.error().detail, "did not answer Hello within 200 ms"));
        CHECK(has(doc.error().detail, "--timeout-ms"));
    }
    SECTION("the daemon closes the connection") {
        FakeDaemon d(afterHello([](int fd, const MsgHeader&) { ::shutdown(fd, SHUT_RDWR); }));
        auto doc = ctl::fetchStatus(d.path(), 2000);
        REQUIRE_FALSE(doc);
        INFO(doc.error().detail);
        CHECK(doc.code() == Errc::DaemonLost);
        CHECK(has(doc.error().detail, "closed the connection during the status request"));
    }
}

TEST_CASE("status: a document that is not a JSON object") {
    SECTION("not JSON") {
        FakeDaemon d(replyJson("{\"clients\": 5,"));
        auto doc = ctl::fetchStatus(d.path(), 2000);
        REQUIRE_FALSE(doc);
        INFO(doc.error().detail);
        CHECK(doc.code() == Errc::BadMessage);
        CHECK(has(doc.error().detail, "sent a status document that is not JSON"));
    }
    SECTION("JSON, but an array") {
        FakeDaemon d(replyJson("[1, 2]"));
        auto doc = ctl::fetchStatus(d.path(), 2000);
        REQUIRE_FALSE(doc);
        INFO(doc.error().detail);
        CHECK(has(doc.error().detail, "is a JSON array, not an object"));
    }
    SECTION("a NUL byte in the text") {
        FakeDaemon d(replyJson(std::string("{}\0", 3)));
        auto doc = ctl::fetchStatus(d.path(), 2000);
        REQUIRE_FALSE(doc);
        INFO(doc.error().detail);
        CHECK(has(doc.error().detail, "sent a malformed StatusReply: BadMessage"));
    }
}

TEST_CASE("status: the default socket follows TPF_SOCKET") {
    const char* saved = std::getenv("TPF_SOCKET");
    const std::string keep = saved ? saved : "";
    ::unsetenv("TPF_SOCKET");
    CHECK(ctl::defaultSocketPath() == "/run/tpfabric/tpfabricd.sock");
    ::setenv("TPF_SOCKET", "", 1);
    CHECK(ctl::defaultSocketPath() == "/run/tpfabric/tpfabricd.sock");
    ::setenv("TPF_SOCKET", "/tmp/x.sock", 1);
    CHECK(ctl::defaultSocketPath() == "/tmp/x.sock");
    if (saved) ::setenv("TPF_SOCKET", keep.c_str(), 1);
    else ::unsetenv("TPF_SOCKET");
}
