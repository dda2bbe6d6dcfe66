#include "ctl/status_client.hpp"

#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <string_view>

#include "common/unix_socket.hpp"
#include "proto/client_msg.hpp"

namespace tpf::ctl {

namespace cp = tpf::client_proto;

namespace {

constexpr std::uint32_t kHelloSeq = 1;
constexpr std::uint32_t kStatusSeq = 2;

constexpr std::string_view kLogHint = "see the daemon's log: journalctl -u tpfabricd";

class Deadline {
public:
    explicit Deadline(int timeoutMs)
        : end_(std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs)) {}
    /// Milliseconds left, at least 1 so that an expired deadline still polls once.
    int leftMs() const {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end_ - std::chrono::steady_clock::now());
        return left.count() < 1 ? 1 : int(left.count());
    }

private:
    std::chrono::steady_clock::time_point end_;
};

std::string opcodeName(std::uint16_t op) {
    std::string_view name;
    switch (op) {
    case cp::kHello: name = "Hello"; break;
    case cp::kHelloReply: name = "HelloReply"; break;
    case cp::kNodeCardRequest: name = "NodeCardRequest"; break;
    case cp::kNodeCard: name = "NodeCard"; break;
    case cp::kGroupOpen: name = "GroupOpen"; break;
    case cp::kVerdict: name = "Verdict"; break;
    case cp::kAbort: name = "Abort"; break;
    case cp::kClose: name = "Close"; break;
    case cp::kStatusRequest: name = "StatusRequest"; break;
    case cp::kStatusReply: name = "StatusReply"; break;
    case cp::kErrorReply: name = "ErrorReply"; break;
    case cp::kClosed: name = "Closed"; break;
    default: return "opcode " + std::to_string(op);
    }
    return std::string(name) + " (" + std::to_string(op) + ")";
}

Error fail(Errc code, std::string line) { return Error{code, std::move(line)}; }

Error unreachable(const std::string& path, const Error& e) {
    // connectUnix says "connect to PATH: strerror"; the path is already in our line.
    std::string why = e.detail;
    const std::string prefix = "connect to " + path;
    if (why.compare(0, prefix.size(), prefix) == 0) why = "connect" + why.substr(prefix.size());
    if (why.rfind("socket path too long", 0) == 0)
        return fail(e.code, "cannot reach tpfabricd at " + path + ": path longer than a Unix socket address allows (" +
                                std::to_string(sizeof(sockaddr_un::sun_path) - 1) + " bytes; pass a shorter --socket)");
    // Something at the path that is not a socket (connect says "Connection
    // refused" for a file or directory), or a path through a file: say so.
    struct stat st {};
    const int statErr = ::stat(path.c_str(), &st) == 0 ? 0 : errno;
    const std::string check = "check --socket / TPF_SOCKET: the daemon's daemon.socket";
    if (const std::string what = nonSocketAt(path); !what.empty())
        return fail(e.code, "cannot reach tpfabricd: " + path + " is " + what + ", not a socket (" + check + ")");
    if (statErr == ENOTDIR)
        return fail(e.code, "cannot reach tpfabricd at " + path + ": " + why + " (a directory of that path is a file; " +
                                check + ")");
    std::string hint = "is the daemon running? systemctl status tpfabricd; or pass --socket or set TPF_SOCKET";
    if (why.ends_with(std::strerror(EACCES)) || why.ends_with(std::strerror(EPERM)))
        hint = permissionHint(path);
    else if (why.ends_with(std::strerror(ECONNREFUSED)))
        hint = "nothing listens on that path: a stale socket of a tpfabricd that died (one started by hand; under "
               "systemd the socket goes with the daemon): start tpfabricd (it replaces the socket), or systemctl "
               "status tpfabricd";
    return fail(e.code, "cannot reach tpfabricd at " + path + ": " + why + " (" + hint + ")");
}

// A failure while sending or receiving `what` (a request or the reply it awaits).
Error exchangeFailed(const std::string& path, std::string_view what, const Error& e, int timeoutMs) {
    const std::string at = "tpfabricd at " + path;
    switch (e.code) {
    case Errc::Timeout:
        return fail(e.code, at + " did not answer " + std::string(what) + " within " + std::to_string(timeoutMs) +
                                " ms (is it hung or overloaded? " + std::string(kLogHint) + "; or raise --timeout-ms)");
    case Errc::DaemonLost:
        return fail(e.code, at + " closed the connection during " + std::string(what) + ": " + e.detail + " (" +
                                std::string(kLogHint) + ")");
    case Errc::VersionMismatch:
        return fail(e.code, at + " speaks another protocol version: " + e.detail +
                                " (run tpfabricctl from the same tpfabric release as the daemon)");
    case Errc::BadMagic:
        return fail(e.code, at + " answered with bytes that are not a tpfabric reply: " + e.detail +
                                " (is another program listening on that socket? check --socket)");
    default:
        return fail(e.code, at + " sent a reply tpfabricctl cannot read during " + std::string(what) + ": " +
                                e.describe() + " (" + std::string(kLogHint) + ")");
    }
}

Error refused(const std::string& path, std::string_view what, const Message& m) {
    // Decoded by hand rather than with decodeFixed: an error code from a newer
    // daemon must still be shown, not turned into a complaint about the reply.
    if (m.payload.size() != sizeof(cp::ErrorReply))
        return fail(Errc::BadMessage, "tpfabricd at " + path + " refused " + std::string(what) + " with an ErrorReply of " +
                                          std::to_string(m.payload.size()) + " bytes, expected " +
                                          std::to_string(sizeof(cp::ErrorReply)) + " (" + std::string(kLogHint) + ")");
    cp::ErrorReply r;
    std::memcpy(&r, m.payload.data(), sizeof r);
    const void* nul = std::memchr(r.message, 0, sizeof r.message);
    std::string message(r.message, nul ? static_cast<const char*>(nul) - r.message : sizeof r.message);
    Errc code;
    const std::string head = "tpfabricd at " + path + " refused " + std::string(what) + ": ";
    if (!errcFromWire(r.errc, code))
        return fail(Errc::BadMessage, head + "error code " + std::to_string(r.errc) + ": " + message +
                                          " (a code this tpfabricctl does not know: run the same tpfabric release)");
    // tpfabricd starts its messages with the code's name; print it once.
    const std::string name(errcName(code));
    if (message.rfind(name + ": ", 0) == 0) message.erase(0, name.size() + 2);
    return fail(code, head + name + ": " + (message.empty() ? "-" : message) + " (" +
                          std::string(errcMessage(code)) + ")");
}

// Send one request and wait for the reply with `expected` opcode.
Result<Message> request(int fd, const std::string& path, std::string_view what, const Bytes& bytes,
                        std::uint16_t expected, std::uint32_t seq, const Deadline& deadline, int timeoutMs) {
    const Status sent = sendMessage(fd, bytes, {}, deadline.leftMs());
    // A daemon that refuses a client at once (Busy) may have closed before the
    // request arrived; its ErrorReply is still there to read.
    auto m = receiveMessage(fd, cp::kReplySpec, sent ? deadline.leftMs() : 0);
    if (!sent && (!m || m->header.opcode != cp::kErrorReply)) return exchangeFailed(path, what, sent.error(), timeoutMs);
    if (!m) return exchangeFailed(path, what, m.error(), timeoutMs);
    if (m->header.opcode == cp::kErrorReply) return refused(path, what, *m);
    if (m->header.opcode != expected)
        return fail(Errc::BadMessage, "tpfabricd at " + path + " answered " + std::string(what) + " with " +
                                          opcodeName(m->header.opcode) + ", expected " + opcodeName(expected) +
                                          " (a daemon of another release? run the same tpfabric release)");
    if (m->header.seq != seq)
        return fail(Errc::BadMessage, "tpfabricd at " + path + " answered " + std::string(what) + " with seq " +
                                          std::to_string(m->header.seq) + ", expected " + std::to_string(seq) +
                                          " (a daemon bug: " + std::string(kLogHint) + ")");
    return m;
}

Error badReply(const std::string& path, std::string_view what, const Error& e) {
    return fail(e.code, "tpfabricd at " + path + " sent a malformed " + std::string(what) + ": " + e.describe() + " (" +
                            std::string(kLogHint) + ")");
}

} // namespace

std::string defaultSocketPath() {
    const char* env = std::getenv(kSocketEnv);
    return env && *env ? std::string(env) : std::string(kDefaultSocketPath);
}

Result<nlohmann::ordered_json> fetchStatus(const std::string& socketPath, int timeoutMs) {
    auto fd = connectUnix(socketPath, timeoutMs);
    if (!fd) return unreachable(socketPath, fd.error());
    const Deadline deadline(timeoutMs);

    const cp::Hello hello{cp::kRoleControl, 0, 0};
    auto helloMsg = request(fd->get(), socketPath, "Hello", cp::encode(cp::kHello, kHelloSeq, hello), cp::kHelloReply,
                            kHelloSeq, deadline, timeoutMs);
    if (!helloMsg) return helloMsg.error();
    if (auto r = decodeFixed<cp::HelloReply>(helloMsg->payload, "HelloReply"); !r)
        return badReply(socketPath, "HelloReply", r.error());

    const cp::StatusRequest req{0, 0};
    auto statusMsg = request(fd->get(), socketPath, "the status request", cp::encode(cp::kStatusRequest, kStatusSeq, req),
                             cp::kStatusReply, kStatusSeq, deadline, timeoutMs);
    if (!statusMsg) return statusMsg.error();
    auto text = cp::decodeStatusReply(statusMsg->payload);
    if (!text) return badReply(socketPath, "StatusReply", text.error());

    nlohmann::ordered_json doc;
    try {
        doc = nlohmann::ordered_json::parse(*text);
    } catch (const nlohmann::ordered_json::parse_error& e) {
        return fail(Errc::BadMessage, "tpfabricd at " + socketPath + " sent a status document that is not JSON: " +
                                          e.what() + " (" + std::string(kLogHint) + ")");
    }
    if (!doc.is_object())
        return fail(Errc::BadMessage, "tpfabricd at " + socketPath + " sent a status document that is a JSON " +
                                          doc.type_name() + ", not an object (" + std::string(kLogHint) + ")");
    return doc;
}

} // namespace tpf::ctl
