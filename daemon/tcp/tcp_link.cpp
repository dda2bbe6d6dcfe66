// The tcp wire's data link: frames out on the proxy thread, in on the
// receiver's (see tcp_link.hpp).
#include "daemon/tcp/tcp_link.hpp"

#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "daemon/tcp/tcp_receiver.hpp"

namespace tpf::daemon {

using peer_proto::TcpFrame;

TcpLink::TcpLink(UniqueFd fd, const Layout& layout, std::uint32_t groupHandle, const NodeId& node, std::string endpoint,
                 std::uint32_t remoteRanks, std::uint32_t localRanks,
                 std::array<std::shared_ptr<HostRegion>, kMaxWorld> regions, std::uint64_t sendBuffer)
    : fd_(std::move(fd)), layout_(layout), groupHandle_(groupHandle), node_(node), endpoint_(std::move(endpoint)),
      remoteRanks_(remoteRanks), localRanks_(localRanks), regions_(std::move(regions)) {
    const int flags = ::fcntl(fd_.get(), F_GETFL);
    ::fcntl(fd_.get(), F_SETFL, flags | O_NONBLOCK);
    const int one = 1;
    ::setsockopt(fd_.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    // The kernel doubles what it is given (socket(7)); what it holds is what status shows.
    const int want = int(std::min<std::uint64_t>(sendBuffer / 2, 1u << 30));
    ::setsockopt(fd_.get(), SOL_SOCKET, SO_SNDBUF, &want, sizeof want);
    int got = 0;
    socklen_t len = sizeof got;
    sendBuffer_ = ::getsockopt(fd_.get(), SOL_SOCKET, SO_SNDBUF, &got, &len) == 0 ? std::uint64_t(got) : sendBuffer;
}

std::uint32_t TcpLink::firstRemoteRank() const {
    std::uint32_t r = 0;
    while (r < kMaxWorld && !(remoteRanks_ >> r & 1u)) ++r;
    return r;
}

bool TcpLink::fail(Errc code, const std::string& why) {
    int expected = 0;
    if (!failState_.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) return false;
    error_ = Error{code, "tcp link to node " + node_.shortHex() + " (" + endpoint_ + ") failed: " + why};
    failState_.store(2, std::memory_order_release);
    return true;
}

std::optional<Error> TcpLink::error() const {
    if (failState_.load(std::memory_order_acquire) != 2) return std::nullopt;
    return error_;
}

// ---- sending ---------------------------------------------------------------

TcpLink::Sent TcpLink::send(const TcpFrame& f, const std::uint8_t* payload, bool& first) {
    first = false;
    if (failed()) return Sent::Failed;
    out_ = f;
    outPayload_ = payload;
    outDone_ = 0;
    outTotal_ = sizeof f + f.bytes;
    framesSent_.fetch_add(1, std::memory_order_relaxed);
    return write(first);
}

TcpLink::Sent TcpLink::flush(bool& first) {
    first = false;
    if (failed()) return Sent::Failed;
    return outTotal_ ? write(first) : Sent::Done;
}

TcpLink::Sent TcpLink::write(bool& first) {
    while (outDone_ < outTotal_) {
        iovec iov[2];
        int n = 0;
        if (outDone_ < sizeof out_)
            iov[n++] = {reinterpret_cast<std::uint8_t*>(&out_) + outDone_, sizeof out_ - outDone_};
        const std::size_t payloadDone = outDone_ > sizeof out_ ? outDone_ - sizeof out_ : 0;
        if (out_.bytes > payloadDone)
            iov[n++] = {const_cast<std::uint8_t*>(outPayload_) + payloadDone, out_.bytes - payloadDone};
        msghdr msg{};
        msg.msg_iov = iov;
        msg.msg_iovlen = std::size_t(n);
        const ssize_t w = ::sendmsg(fd_.get(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return Sent::Full;
            first = fail(Errc::PeerLost, std::string("send: ") + std::strerror(errno));
            return Sent::Failed;
        }
        outDone_ += std::size_t(w);
        bytesSent_.fetch_add(std::uint64_t(w), std::memory_order_relaxed);
    }
    outTotal_ = 0;
    outPayload_ = nullptr;
    return Sent::Done;
}

bool TcpLink::inFlight() const {
    if (failed()) return false;
    if (outTotal_) return true;
    int queued = 0; // unsent plus unacknowledged bytes (tcp(7), SIOCOUTQ)
    return ::ioctl(fd_.get(), SIOCOUTQ, &queued) == 0 && queued > 0;
}

// ---- receiving -------------------------------------------------------------

bool TcpLink::drained() const {
    if (failed()) return true;
    int unread = 0; // bytes in the receive queue (tcp(7), FIONREAD); then whether one is being landed
    if (::ioctl(fd_.get(), FIONREAD, &unread) != 0 || unread > 0) return false;
    return !reading_.load(std::memory_order_seq_cst);
}

TcpLink::Read TcpLink::receive() {
    if (failed()) return Read::Failed;
    const auto done = [this](Read r) {
        reading_.store(r == Read::More && (inHeader_ != 0 || inPayload_), std::memory_order_seq_cst);
        return r;
    };
    for (;;) {
        reading_.store(true, std::memory_order_seq_cst);
        std::uint8_t* to;
        std::size_t want;
        if (!inPayload_) {
            to = reinterpret_cast<std::uint8_t*>(&in_) + inHeader_;
            want = sizeof in_ - inHeader_;
        } else {
            to = inDst_;
            want = inLeft_;
        }
        const ssize_t r = ::recv(fd_.get(), to, want, MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return done(Read::More);
            return done(fail(Errc::PeerLost, std::string("receive: ") + std::strerror(errno)) ? Read::Failed : Read::Closed);
        }
        if (r == 0) {
            if (!inPayload_ && inHeader_ == 0) return done(Read::Closed);
            return done(fail(Errc::PeerLost, "the other node closed it in the middle of a frame") ? Read::Failed
                                                                                                   : Read::Closed);
        }
        bytesReceived_.fetch_add(std::uint64_t(r), std::memory_order_relaxed);
        if (!inPayload_) {
            inHeader_ += std::size_t(r);
            if (inHeader_ < sizeof in_) continue;
            inHeader_ = 0;
            if (auto s = peer_proto::validate(in_, layout_, remoteRanks_, localRanks_); !s)
                return done(fail(s.code(), s.error().detail) ? Read::Failed : Read::Closed);
            inDst_ = regions_[in_.dst]->slot(in_.phase, in_.src) + in_.offset;
            inLeft_ = in_.bytes;
            inPayload_ = true;
        } else {
            inDst_ += r;
            inLeft_ -= std::size_t(r);
        }
        if (inLeft_ == 0) {
            inPayload_ = false;
            land();
        }
    }
}

// The payload is in: the stripe's flag, every copy of its line (copy 0
// first, as the proxy releases a same-node row a GPU reads), then the rank's
// sleeping waits.
void TcpLink::land() {
    const HostRegion& r = *regions_[in_.dst];
    std::uint64_t* flag = r.flag(in_.phase, in_.src, in_.stripe);
    for (std::uint32_t c = 0; c < kFlagCopies; ++c)
        std::atomic_ref(flag[c * kFlagCopyStride / sizeof *flag]).store(in_.epoch, std::memory_order_release);
    framesReceived_.fetch_add(1, std::memory_order_relaxed);
    r.wakeIfWaiting();
}

// ---- group -----------------------------------------------------------------

TcpGroup::~TcpGroup() {
    for (const auto& l : links) receiver.remove(*l);
}

Status TcpGroup::add(std::shared_ptr<TcpLink> link) {
    if (auto s = receiver.add(link); !s) return s;
    for (std::uint32_t r = 0; r < kMaxWorld; ++r)
        if (link->remoteRanks() >> r & 1u) byRank[r] = link.get();
    links.push_back(std::move(link));
    return okStatus();
}

Status TcpGroup::replace(std::shared_ptr<TcpLink> link) {
    for (auto it = links.begin(); it != links.end(); ++it)
        if ((*it)->node() == link->node()) {
            receiver.remove(**it);
            replaced.push_back(std::move(*it));
            links.erase(it);
            break;
        }
    return add(std::move(link));
}

const TcpLink* TcpGroup::linkTo(const NodeId& node) const {
    for (const auto& l : links)
        if (l->node() == node) return l.get();
    return nullptr;
}

} // namespace tpf::daemon
