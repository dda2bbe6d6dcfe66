// The health word (Group::health()): the host's sticky failure, else what
// the daemon and this rank's kernels recorded in the control block. Loads of
// host memory only: an engine reads it once per step.
#include <atomic>

#include "client/impl.hpp"

namespace tpf {

Health Group::Impl::health() const noexcept {
    Health h;
    if (nccl) h.flags |= Health::kNccl;
    if (forked()) { // as broken() notes it: the parent's group
        h.code = Errc::Closed;
        return h;
    }
    const std::uint64_t word = std::atomic_ref(const_cast<std::uint64_t&>(healthWord)).load(std::memory_order_acquire);
    if (word != 0) {
        h.code = Errc(word & 0xffff);
        h.rank = std::uint32_t(word >> 32);
        return h;
    }
    if (!region.data()) return h; // world 1, NCCL, or torn down
    const ControlBlock& c = control();
    const auto load = [](const std::uint32_t& v) {
        return std::atomic_ref(const_cast<std::uint32_t&>(v)).load(std::memory_order_acquire);
    };
    // An abort breaks every rank at once (broken()); a device call that
    // failed (its kernel's mark, released after the call's record) is what
    // check() reads back after a synchronisation (gpuCheck). The daemon's
    // record alone is no failure: a peer may have left in order, and only a
    // call past its last epoch fails.
    if (load(c.abort) != 0 || (gpu && load(c.callFailed) != 0)) {
        h.code = sharedCode();
        h.rank = sharedPeer();
        // A kernel's timeout while the daemon is away: what check() reports (gpuCheck).
        if (h.code == Errc::Timeout && daemonAway()) h.code = Errc::DaemonLost, h.rank = Health::kNoRank;
    }
    return h;
}

Health Group::health() const noexcept { return impl_->health(); }

} // namespace tpf
