#include "daemon/proxy/shared_state.hpp"

#include <cstring>

namespace tpf::daemon {

Result<std::shared_ptr<HostRegion>> HostRegion::create(const Layout& layout, const std::string& name) {
    auto r = std::make_shared<HostRegion>();
    r->layout = layout;
    auto fd = createSealedMemfd(name, layout.totalBytes());
    if (!fd) return fd.error();
    r->fd = std::move(*fd);
    auto map = mapShared(r->fd.get(), layout.totalBytes(), true);
    if (!map) return map.error();
    r->map = std::move(*map);
    r->control().missingPeer = kNoPeer;
    return r;
}

Result<std::shared_ptr<HostRegion>> HostRegion::adopt(const Layout& layout, UniqueFd fd) {
    auto r = std::make_shared<HostRegion>();
    r->layout = layout;
    auto map = mapShared(fd.get(), layout.totalBytes(), true);
    if (!map) return Error{map.code(), "region: " + map.error().detail};
    r->fd = std::move(fd);
    r->map = std::move(*map);
    return r;
}

void HostRegion::fail(Errc code, std::uint32_t missingPeer, std::uint64_t carriedThrough, bool replace) const {
    auto& c = control();
    std::uint32_t was = std::atomic_ref(c.error).load(std::memory_order_acquire);
    if (was == 0 || replace) {
        // The words a wait reads after error go first: it never sees error without them.
        std::atomic_ref(c.carriedThrough).store(carriedThrough, std::memory_order_relaxed);
        std::atomic_ref(c.missingPeer).store(missingPeer, std::memory_order_relaxed);
        if (replace) std::atomic_ref(c.error).store(std::uint32_t(code), std::memory_order_release);
        else std::atomic_ref(c.error).compare_exchange_strong(was, std::uint32_t(code), std::memory_order_acq_rel);
    }
    if (code == Errc::Aborted) std::atomic_ref(c.abort).store(1, std::memory_order_release);
    std::atomic_ref(c.wakeSeq).fetch_add(1, std::memory_order_seq_cst);
    futexWakeAll(&c.wakeSeq);
}

void HostRegion::wakeIfWaiting() const {
    auto& c = control();
    tpf::wakeIfWaiting(&c.waiters, &c.wakeSeq);
}

Result<std::shared_ptr<CommandRing>> CommandRing::create(std::uint32_t entries, std::uint32_t groupHandle,
                                                         const std::string& name, std::uint32_t heartbeatMs) {
    auto r = std::make_shared<CommandRing>();
    r->layout = RingLayout{entries};
    auto fd = createSealedMemfd(name, r->layout.totalBytes());
    if (!fd) return fd.error();
    r->fd = std::move(*fd);
    auto map = mapShared(r->fd.get(), r->layout.totalBytes(), true);
    if (!map) return map.error();
    r->map = std::move(*map);
    r->view = RingView(r->map.data(), r->layout);
    auto& h = r->view.header();
    h.magic = kRingMagic;
    h.version = kRingVersion;
    h.entryBytes = sizeof(Doorbell);
    h.entries = entries;
    h.group = groupHandle;
    h.heartbeatMs = heartbeatMs;
    return r;
}

} // namespace tpf::daemon

namespace tpf::daemon {

Result<std::shared_ptr<CommandRing>> CommandRing::adopt(std::uint32_t entries, std::uint32_t groupHandle, UniqueFd fd,
                                                        std::uint32_t heartbeatMs) {
    auto r = std::make_shared<CommandRing>();
    r->layout = RingLayout{entries};
    auto map = mapShared(fd.get(), r->layout.totalBytes(), true);
    if (!map) return Error{map.code(), "ring: " + map.error().detail};
    r->fd = std::move(fd);
    r->map = std::move(*map);
    r->view = RingView(r->map.data(), r->layout);
    const RingHeader& h = r->view.header();
    const auto load = [](const auto& v) {
        using T = std::remove_cvref_t<decltype(v)>;
        return std::atomic_ref(const_cast<T&>(v)).load(std::memory_order_acquire);
    };
    if (load(h.magic) != kRingMagic || load(h.version) != kRingVersion || load(h.entries) != entries ||
        load(h.group) != groupHandle)
        return Error{Errc::BadMessage, "ring: its header (magic, version " + std::to_string(load(h.version)) + ", " +
                                           std::to_string(load(h.entries)) + " entries, group handle " +
                                           std::to_string(load(h.group)) + ") does not match the adoption (version " +
                                           std::to_string(kRingVersion) + ", " + std::to_string(entries) +
                                           " entries, group handle " + std::to_string(groupHandle) + ")"};
    std::atomic_ref(r->view.header().heartbeatMs).store(heartbeatMs, std::memory_order_relaxed);
    // The old proxy may have gone to sleep: this one is awake until it says otherwise.
    std::atomic_ref(r->view.header().proxyIdle).store(0, std::memory_order_relaxed);
    return r;
}

Doorbell CommandRing::doorbellAt(std::uint32_t index) const {
    Doorbell d;
    std::memcpy(&d, map.data() + layout.submissionOffset(index), sizeof d);
    return d;
}

} // namespace tpf::daemon
