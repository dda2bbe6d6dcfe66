// The tcp wire's receiving side: one thread per daemon that waits on every
// data link (epoll) and lands the frames other nodes send: payload into the
// receiving rank's region, then the stripe's flag, then a wake of the rank's
// sleeping waits (TcpLink::receive). It is to the tcp wire what the HCA is to
// the verbs wire, so the proxy needs to watch no inbound flag for it. A link
// that fails here is reported through its onReceiveFailed; one the other node
// closed between frames (its group went) is just dropped.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include <tpfabric/error.hpp>

#include "common/fd.hpp"
#include "daemon/tcp/tcp_link.hpp"

namespace tpf::daemon {

class TcpReceiver {
public:
    TcpReceiver() = default;
    ~TcpReceiver();
    TcpReceiver(const TcpReceiver&) = delete;
    TcpReceiver& operator=(const TcpReceiver&) = delete;

    /// Serve `link` from now on; the thread starts with the first link.
    /// Errors name what failed (epoll, the thread); the link is then not served.
    Status add(std::shared_ptr<TcpLink> link);
    /// Stop serving `link` (any thread); once this returns the receiver no
    /// longer calls into it, though a pass already under way may finish with
    /// the reference it holds.
    void remove(const TcpLink& link);
    void stop();

    /// Links served now.
    std::size_t links() const;

private:
    Status startLocked();
    void run();

    mutable std::mutex mutex_; // guards links_, nextId_, epoll registration, thread_ start
    std::map<std::uint64_t, std::shared_ptr<TcpLink>> links_;
    std::uint64_t nextId_ = 1;
    UniqueFd epoll_;
    UniqueFd wake_; ///< eventfd: stop
    std::thread thread_;
    std::atomic<bool> running_{false};
};

} // namespace tpf::daemon
