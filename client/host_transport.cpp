// The host path's transports (client/host_transport.hpp): carried by the
// daemon's proxy, or host-direct between same-node ranks.
#include "client/host_transport.hpp"

#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <vector>

#include "client/format.hpp"
#include "client/impl.hpp"
#include "common/unix_socket.hpp"

namespace tpf {

namespace {

// A host-direct call needs no daemon, but only the daemon sees ranks die:
// calls look at it this often (Impl::daemonCheck) and end DaemonLost once it
// is gone for good (not back in time to re-adopt the group, or refused).
constexpr std::uint64_t kDaemonCheckNs = 1000 * 1000;

// Carried: the daemon's proxy moves this rank's row into every carried
// peer's region (a copy within the node, RDMA WRITEs across) and the peers'
// rows into ours, so a peer's row is read from our own region. One doorbell
// per call covers every carried peer.
class CarriedTransport final : public HostTransport {
public:
    std::uint8_t* connect(Group::Impl& g, PeerOffer&) override { return g.region.data(); }

    Status publish(Group::Impl& g, std::uint64_t e, std::uint32_t, std::uint32_t rowBytes) override {
        const Doorbell d{e, rowBytes, g.handle};
        const std::uint64_t deadline = monotonicNs() + std::uint64_t(g.options.timeout.count()) * 1000000ull;
        while (!g.ring.push(d)) { // full only if the proxy stalls, or the daemon is gone
            if (auto s = g.daemonCheck(); !s) return s;
            if (const std::uint64_t now = monotonicNs(); now >= deadline)
                return g.timedOut(Error{Errc::Timeout, format("this rank's command ring stayed full for {} ms: tpfabricd's proxy "
                                                              "takes no doorbells{}",
                                                              g.options.timeout.count(), g.proxyStalled(now))},
                                  g.rank);
            ::sched_yield();
        }
        if (g.ring.proxyNeedsWake()) {
            const std::uint64_t one = 1;
            [[maybe_unused]] auto n = ::write(g.proxyEvent.get(), &one, sizeof one);
        }
        return okStatus();
    }

    std::string stalled(const Group::Impl& g, std::uint64_t now) const override { return g.proxyStalled(now); }
};

// Host-direct is "pull": our row of epoch e is staged in our own slot
// (exchange, allGatherV); our own flags, released in our own region, publish
// it, and each direct peer polls them and reads the row from our region
// (its source), so a call writes nothing into a peer's region but a wake.
// Safe by the two-phase rule: we re-stage slot phase(e) at epoch e + 2 only
// after completing e + 1, which needs every peer's e + 1 flag, which a peer
// releases only after it finished reading our row of epoch e. Nothing is
// published once the group broke (the proxy drops a broken group's doorbells
// too), but an orderly leave after epoch E breaks nothing up to E: we still
// publish those epochs, as the proxy still carries them (stillCarried).
class HostDirectTransport final : public HostTransport {
public:
    std::uint8_t* connect(Group::Impl&, PeerOffer& peer) override {
        peers_.push_back(std::move(peer.region));
        return peers_.back().data();
    }

    Status publish(Group::Impl& g, std::uint64_t e, std::uint32_t phase, std::uint32_t) override {
        if (const std::uint64_t now = monotonicNs(); now - daemonCheckedNs_ >= kDaemonCheckNs) {
            daemonCheckedNs_ = now;
            if (auto s = g.daemonCheck(); !s) return s;
        }
        if (!g.stillCarried(e)) return okStatus(); // the group broke: waitPeers reports it
        for (std::uint32_t k = 0; k < g.layout.stripes; ++k)
            std::atomic_ref(*g.flag(phase, g.rank, k)).store(e, std::memory_order_release);
        for (const Mapping& peer : peers_) {
            auto& c = *reinterpret_cast<ControlBlock*>(peer.data() + g.layout.controlOffset());
            wakeIfWaiting(&c.waiters, &c.wakeSeq);
        }
        return okStatus();
    }

    std::string stalled(const Group::Impl&, std::uint64_t) const override { return {}; }

private:
    std::vector<Mapping> peers_;      ///< the peers' regions, in the order peerAt(rank, i) names them
    std::uint64_t daemonCheckedNs_ = 0; ///< when a call last looked at the daemon's socket
};

template <class T>
std::unique_ptr<HostTransport> make() {
    return std::make_unique<T>();
}

constexpr HostTransportKind kHostTransports[] = {
    // carried: every wire the daemons' proxies carry, unless the peer's region is here
    {[](const Group::Impl&, const PeerOffer& p) { return proxyCarries(p.wire) && !p.region; }, make<CarriedTransport>},
    // host-direct: a same-node peer whose region the daemon handed over
    {[](const Group::Impl&, const PeerOffer& p) { return p.wire == kWireShm && bool(p.region); }, make<HostDirectTransport>},
};

} // namespace

std::span<const HostTransportKind> hostTransports() { return kHostTransports; }

Status connectTransports(Group::Impl& g, std::span<PeerOffer> offers) {
    const auto kinds = hostTransports();
    std::vector<std::unique_ptr<HostTransport>> of(kinds.size()); // per kind, made for its first peer
    g.sources[g.rank] = g.region.data();
    for (std::uint32_t i = 0; i + 1 < g.world; ++i) {
        PeerOffer& peer = offers[peerAt(g.rank, i, g.world)];
        std::size_t k = 0;
        while (k < kinds.size() && !kinds[k].canConnect(g, peer)) ++k;
        if (k == kinds.size())
            return Error{Errc::BadMessage, format("verdict: no host transport reaches rank {} over wire {}", peer.rank,
                                                  std::string_view(wireName(peer.wire)))};
        if (!of[k]) of[k] = kinds[k].make();
        g.sources[peer.rank] = of[k]->connect(g, peer);
    }
    for (auto& t : of)
        if (t) g.transports.push_back(std::move(t));
    return okStatus();
}

} // namespace tpf
