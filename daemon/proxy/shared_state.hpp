// Shared memory the daemon creates for a rank: its region (Layout-sized,
// sealed memfd) and its command ring. Both are mapped here and passed to the
// rank's process with the Verdict.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "common/fd.hpp"
#include "common/shm.hpp"
#include "proto/layout.hpp"
#include "proto/ring.hpp"

namespace tpf::daemon {

/// One rank's host region.
struct HostRegion {
    Layout layout;
    UniqueFd fd;
    Mapping map;

    static Result<std::shared_ptr<HostRegion>> create(const Layout& layout, const std::string& name);
    /// A region a rank hands back to a restarted daemon (Adopt): `fd` must be
    /// a sealed memfd of exactly layout.totalBytes(). Nothing in it is
    /// written: the control block keeps what the old daemon recorded.
    static Result<std::shared_ptr<HostRegion>> adopt(const Layout& layout, UniqueFd fd);

    std::uint8_t* slot(std::uint32_t phase, std::uint32_t src) const { return map.data() + layout.slotOffset(phase, src); }
    std::uint64_t* flag(std::uint32_t phase, std::uint32_t src, std::uint32_t stripe) const {
        return reinterpret_cast<std::uint64_t*>(map.data() + layout.flagOffset(phase, src, stripe));
    }
    ControlBlock& control() const { return *reinterpret_cast<ControlBlock*>(map.data() + layout.controlOffset()); }

    /// Record a group-wide failure naming `missingPeer` (with carriedThrough,
    /// ControlBlock::carriedThrough: an orderly leave) and wake the rank's
    /// sleeping waits. The first error stays unless `replace` (the control
    /// thread had recorded an orderly leave, now lowered or replaced by a
    /// fault); abort is set for Aborted. Control thread only: the daemon's one
    /// writer of these words (a rank's kernel may record its own failure,
    /// once, where error is 0).
    void fail(Errc code, std::uint32_t missingPeer, std::uint64_t carriedThrough = 0, bool replace = false) const;
    /// Wake the rank's host waits if any sleep (after flags were stored).
    void wakeIfWaiting() const;
};

/// One rank's command ring.
struct CommandRing {
    RingLayout layout;
    UniqueFd fd;
    Mapping map;
    RingView view;
    std::uint32_t tail = 0;    ///< the proxy's private consumer index
    std::uint64_t lastEpoch = 0; ///< the proxy's record of the last doorbell carried out
    /// The proxy's doorbell in progress: a peer's transport came back later
    /// (a verbs queue pair at its in-flight cap), so the delivery resumes at
    /// (peer index in peerAt order, stripe) on a later pass, and this ring's
    /// later doorbells wait behind it, while every other ring is served
    /// meanwhile.
    struct Delivery {
        Doorbell doorbell{};
        std::uint32_t peer = 0;
        std::uint32_t stripe = 0;
    };
    std::optional<Delivery> delivering;

    /// The doorbell at submission index `index` as the ring holds it (an old
    /// one stays until the ring wraps over it).
    Doorbell doorbellAt(std::uint32_t index) const;

    /// `heartbeatMs`: proxy.heartbeat_ms, told to the rank in the header (RingHeader::heartbeatMs).
    static Result<std::shared_ptr<CommandRing>> create(std::uint32_t entries, std::uint32_t groupHandle,
                                                       const std::string& name, std::uint32_t heartbeatMs = 0);
    /// A ring a rank hands back to a restarted daemon (Adopt): a sealed memfd
    /// of RingLayout{entries}, whose header names kRingMagic, kRingVersion and
    /// `groupHandle`. Its proxy state (tail, lastEpoch, delivering) is left
    /// at zero: the group table rebuilds it from the ring and the regions
    /// before the proxy serves it. heartbeatMs is written anew.
    static Result<std::shared_ptr<CommandRing>> adopt(std::uint32_t entries, std::uint32_t groupHandle, UniqueFd fd,
                                                      std::uint32_t heartbeatMs);
};

} // namespace tpf::daemon
