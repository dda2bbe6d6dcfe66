// The shm wire on the daemon side: the proxy copies a rank's shard into a
// same-node peer's region and releases the flag there (transport.hpp).
#pragma once

#include <cstdint>
#include <memory>

#include "daemon/proxy/shared_state.hpp"
#include "daemon/proxy/transport.hpp"
#include "proto/layout.hpp"

namespace tpf::daemon {

/// Local rank `rank` to a same-node peer that does not read the rank's
/// region itself (either end opened without host-direct, or a Device group
/// on the proxy route). carry() adds one row per stripe, slot (phase, rank)
/// of `src` to the same slot of `dst`, to step.rows, each with its flag
/// (phase, rank, stripe) in `dst`; the proxy copies them at the end of the
/// doorbell (Proxy::carryBatch). Always Done.
class ShmTransport final : public Transport {
public:
    ShmTransport(const Layout& layout, std::uint32_t rank, std::shared_ptr<const HostRegion> src,
                 std::shared_ptr<const HostRegion> dst)
        : layout_(layout), rank_(rank), src_(std::move(src)), dst_(std::move(dst)) {}

    Carried carry(CarryStep& step) override;

private:
    const Layout layout_;
    const std::uint32_t rank_;
    const std::shared_ptr<const HostRegion> src_; ///< the rank's own region: its shard
    const std::shared_ptr<const HostRegion> dst_; ///< the peer's region
};

} // namespace tpf::daemon
