// The tcp wire's receiver thread (see tcp_receiver.hpp).
#include "daemon/tcp/tcp_receiver.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace tpf::daemon {

TcpReceiver::~TcpReceiver() { stop(); }

Status TcpReceiver::startLocked() {
    if (running_.load(std::memory_order_relaxed)) return okStatus();
    epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
    wake_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!epoll_ || !wake_) return {Errc::SystemError, std::string("tcp wire receiver: epoll/eventfd: ") + std::strerror(errno)};
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = 0; // the stop eventfd
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &ev) != 0)
        return {Errc::SystemError, std::string("tcp wire receiver: epoll_ctl: ") + std::strerror(errno)};
    running_.store(true, std::memory_order_relaxed);
    thread_ = std::thread([this] { run(); });
    return okStatus();
}

Status TcpReceiver::add(std::shared_ptr<TcpLink> link) {
    std::lock_guard lock(mutex_);
    if (auto s = startLocked(); !s) return s;
    const std::uint64_t id = nextId_++;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = id;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, link->fd(), &ev) != 0)
        return {Errc::SystemError, std::string("tcp wire receiver: epoll_ctl: ") + std::strerror(errno)};
    links_.emplace(id, std::move(link));
    return okStatus();
}

void TcpReceiver::remove(const TcpLink& link) {
    std::lock_guard lock(mutex_);
    for (auto it = links_.begin(); it != links_.end(); ++it)
        if (it->second.get() == &link) {
            if (epoll_) ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, link.fd(), nullptr);
            links_.erase(it);
            return;
        }
}

std::size_t TcpReceiver::links() const {
    std::lock_guard lock(mutex_);
    return links_.size();
}

void TcpReceiver::stop() {
    {
        std::lock_guard lock(mutex_);
        if (!running_.exchange(false)) return;
        const std::uint64_t one = 1;
        [[maybe_unused]] auto n = ::write(wake_.get(), &one, sizeof one);
    }
    if (thread_.joinable()) thread_.join();
    std::lock_guard lock(mutex_);
    links_.clear();
}

void TcpReceiver::run() {
    epoll_event events[32];
    while (running_.load(std::memory_order_relaxed)) {
        const int n = ::epoll_wait(epoll_.get(), events, 32, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            spdlog::error("tcp wire receiver: epoll_wait: {}; frames from other nodes are no longer received",
                          std::strerror(errno));
            return;
        }
        for (int i = 0; i < n; ++i) {
            const std::uint64_t id = events[i].data.u64;
            if (id == 0) continue; // stop
            std::shared_ptr<TcpLink> link;
            {
                std::lock_guard lock(mutex_);
                auto it = links_.find(id);
                if (it == links_.end()) continue; // removed meanwhile
                link = it->second;
            }
            const TcpLink::Read r = link->receive();
            if (r == TcpLink::Read::More) continue;
            remove(*link);
            if (r == TcpLink::Read::Failed) {
                const std::optional<Error> why = link->error();
                if (why && link->onReceiveFailed) link->onReceiveFailed(*why);
            }
        }
    }
}

} // namespace tpf::daemon
