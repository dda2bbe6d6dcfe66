#include "daemon/proxy/shm_transport.hpp"

#include "common/stream_copy.hpp"

namespace tpf::daemon {

Carried ShmTransport::carry(CarryStep& step) {
    const std::uint32_t phase = step.phase;
    for (std::uint32_t k = 0; k < layout_.stripes; ++k) {
        const Stripe s = stripeOf(step.doorbell.bytes, layout_.stripes, k);
        // A GPU reads these rows over PCIe: streamed lines there.
        step.rows.add(CarryItem{dst_->slot(phase, rank_) + s.offset, src_->slot(phase, rank_) + s.offset, s.bytes,
                                step.gpu && s.bytes >= kStreamCopyMin},
                      dst_->flag(phase, rank_, k), dst_.get());
    }
    return Carried::Done;
}

} // namespace tpf::daemon
