// The tcp wire (docs/wires.md): one group's data link to one other node, a
// TCP connection opened by the group's negotiation beside its peer link
// (proto/peer_msg.hpp, kPeerData) and carrying TcpFrames both ways
// (proto/tcp_frame.hpp). The proxy thread writes frames on it
// (TcpTransport::carry, daemon/proxy/tcp_transport.hpp); the tcp receiver's
// thread reads the other node's frames and stores each payload and then its
// flag into the receiving rank's region (TcpReceiver, tcp_receiver.hpp): what
// the HCA does on the verbs wire.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <tpfabric/error.hpp>

#include "common/fd.hpp"
#include "common/ids.hpp"
#include "daemon/proxy/shared_state.hpp"
#include "proto/layout.hpp"
#include "proto/tcp_frame.hpp"

namespace tpf::daemon {

class TcpReceiver;

/// One group's data link to one other node. Sending: proxy thread only.
/// Receiving: the receiver thread only. The counters and `failed` are read
/// by any thread (status).
class TcpLink {
public:
    /// `fd`: the connected socket (made non-blocking here, its send buffer
    /// `sendBuffer` bytes). `remoteRanks` / `localRanks`: the ranks the other
    /// node and this one serve; `regions`: this node's ranks' regions (by
    /// rank), where frames land.
    TcpLink(UniqueFd fd, const Layout& layout, std::uint32_t groupHandle, const NodeId& node, std::string endpoint,
            std::uint32_t remoteRanks, std::uint32_t localRanks,
            std::array<std::shared_ptr<HostRegion>, kMaxWorld> regions, std::uint64_t sendBuffer);
    TcpLink(const TcpLink&) = delete;
    TcpLink& operator=(const TcpLink&) = delete;

    // ---- sending (proxy thread) ----
    enum class Sent : std::uint8_t {
        Done,   ///< the whole frame is in the socket
        Full,   ///< the socket is at its send buffer: the rest waits in the link (flush())
        Failed, ///< the link failed; `first`: here, so the caller reports it (error())
    };
    /// Start frame `f` with `f.bytes` of `payload` (valid until the frame is
    /// flushed: the sending rank's slot, whose doorbell waits meanwhile).
    /// Only when nothing is pending.
    Sent send(const peer_proto::TcpFrame& f, const std::uint8_t* payload, bool& first);
    /// Write what is left of a frame that came back Full; Done when nothing is left.
    Sent flush(bool& first);
    /// Bytes written to the socket and not yet acknowledged by the other
    /// node, or a frame not all written: what may not have landed yet.
    bool inFlight() const;

    // ---- receiving (receiver thread) ----
    enum class Read : std::uint8_t { More, Closed, Failed };
    /// Read what the socket has: frames are validated, stored into the
    /// regions, flags released, waits woken. Closed: the other side closed
    /// between frames (its group went); Failed: the link failed here first
    /// (error() says why: the caller reports it).
    Read receive();

    /// Every byte the other node's kernel had acknowledged is landed: none
    /// waits in this socket's receive queue and no frame is half read. The
    /// other daemon tells a rank's orderly leave once its last frames were
    /// acknowledged (TcpTransport::inFlight), on the peer link, which may
    /// come first: the leave is applied once this holds. Any thread.
    bool drained() const;

    int fd() const { return fd_.get(); }
    std::uint32_t groupHandle() const { return groupHandle_; }
    const NodeId& node() const { return node_; }
    const std::string& endpoint() const { return endpoint_; }
    std::uint32_t remoteRanks() const { return remoteRanks_; }
    /// The other node's lowest rank, the one a failure names.
    std::uint32_t firstRemoteRank() const;
    /// A send or a receive failed: nothing more is carried on it.
    bool failed() const { return failState_.load(std::memory_order_acquire) != 0; }
    /// Why it failed, once that is written (any thread).
    std::optional<Error> error() const;

    std::uint64_t bytesSent() const { return bytesSent_.load(std::memory_order_relaxed); }
    std::uint64_t framesSent() const { return framesSent_.load(std::memory_order_relaxed); }
    std::uint64_t bytesReceived() const { return bytesReceived_.load(std::memory_order_relaxed); }
    std::uint64_t framesReceived() const { return framesReceived_.load(std::memory_order_relaxed); }
    std::uint64_t sendBuffer() const { return sendBuffer_; }

    /// Called on the receiver thread once the link fails there (set before
    /// the receiver serves the link).
    std::function<void(const Error&)> onReceiveFailed;

private:
    Sent write(bool& first);
    /// Mark the link failed; true for the first caller only, which reports it.
    bool fail(Errc code, const std::string& why);
    /// The frame in hdr_ is complete: release its flag and wake the rank.
    void land();

    UniqueFd fd_;
    const Layout layout_;
    const std::uint32_t groupHandle_;
    const NodeId node_;
    const std::string endpoint_;
    const std::uint32_t remoteRanks_;
    const std::uint32_t localRanks_;
    const std::array<std::shared_ptr<HostRegion>, kMaxWorld> regions_;
    std::uint64_t sendBuffer_ = 0;
    std::atomic<int> failState_{0}; ///< 0 fine, 1 failing (error_ being written), 2 failed
    Error error_;

    // The frame going out (proxy thread).
    peer_proto::TcpFrame out_{};
    const std::uint8_t* outPayload_ = nullptr;
    std::size_t outDone_ = 0;  ///< bytes of header + payload written
    std::size_t outTotal_ = 0; ///< 0: none pending

    // The frame coming in (receiver thread).
    peer_proto::TcpFrame in_{};
    std::size_t inHeader_ = 0;          ///< header bytes read
    std::uint8_t* inDst_ = nullptr;     ///< where the payload goes
    std::size_t inLeft_ = 0;            ///< payload bytes still to read
    bool inPayload_ = false;
    /// Set before each read and kept while a frame is half read; cleared once it landed (drained()).
    std::atomic<bool> reading_{false};

    std::atomic<std::uint64_t> bytesSent_{0}, framesSent_{0}, bytesReceived_{0}, framesReceived_{0};
};

/// One group's tcp wire: its data links, one per other node, as the
/// negotiation brings them up. The receiver serves each link from when it
/// is added until the group's wire goes (the destructor takes them out).
struct TcpGroup {
    explicit TcpGroup(TcpReceiver& r) : receiver(r) {}
    ~TcpGroup();
    TcpGroup(const TcpGroup&) = delete;
    TcpGroup& operator=(const TcpGroup&) = delete;

    TcpReceiver& receiver;
    std::vector<std::shared_ptr<TcpLink>> links;
    /// Remote rank -> its node's link (null for this node's ranks). Set on
    /// the control thread before the group opens; read by the proxy after.
    std::array<TcpLink*, kMaxWorld> byRank{};

    /// Add a node's link and let the receiver serve it (errors: the receiver's).
    Status add(std::shared_ptr<TcpLink> link);
    /// The node's daemon restarted and came back: `link` takes the place of
    /// its old link (control thread; transports built from now on use it).
    /// The old one is no longer served and stays alive with the group
    /// (transports of earlier proxy tables still point at it).
    Status replace(std::shared_ptr<TcpLink> link);
    /// Links that were replaced.
    std::vector<std::shared_ptr<TcpLink>> replaced;
    const TcpLink* linkTo(const NodeId& node) const;
};

} // namespace tpf::daemon
