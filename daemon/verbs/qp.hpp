// RDMA resources of the verbs wire (docs/design.md, "3. Negotiation" and
// "4. Data path"), by stage: open an HCA
// port (context, protection domain, CQ), register a host region, create and
// connect an RC queue pair from exchanged records, post a stripe (payload
// WRITE unsignaled, chained to an inline flag WRITE), poll completions.
//
// No libibverbs type leaks into this header, so the proxy and the group table
// build without verbs; qp_stub.cpp answers Unsupported there.
//
// Threads: open/register/create/connect run on the control thread; post and
// poll only on the proxy thread. A QpLink and its HCA outlive every work
// request posted on it (the proxy keeps a retiring group until its QPs drained).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <tpfabric/error.hpp>

#include "daemon/verbs/inflight.hpp"
#include "proto/client_msg.hpp"
#include "proto/layout.hpp"

struct ibv_context;
struct ibv_pd;
struct ibv_cq;
struct ibv_mr;
struct ibv_qp;

namespace tpf::daemon {

/// One opened HCA port, shared by every group that uses it.
class VerbsHca {
public:
    static Result<std::shared_ptr<VerbsHca>> open(const client_proto::HcaCard& card, std::uint32_t cqDepth);
    ~VerbsHca();
    VerbsHca(const VerbsHca&) = delete;
    VerbsHca& operator=(const VerbsHca&) = delete;

    const client_proto::HcaCard& card() const { return card_; }
    std::string name() const;
    ibv_pd* pd() const { return pd_; }
    ibv_cq* cq() const { return cq_; }
    std::uint32_t cqDepth() const { return cqDepth_; }

    /// Signaled work requests posted on this CQ's QPs and not yet polled (proxy thread).
    std::uint32_t outstanding = 0;

private:
    VerbsHca() = default;
    client_proto::HcaCard card_{};
    ibv_context* ctx_ = nullptr;
    ibv_pd* pd_ = nullptr;
    ibv_cq* cq_ = nullptr;
    std::uint32_t cqDepth_ = 0;
};

/// A host region registered on one HCA (local write + remote write).
class VerbsMr {
public:
    /// Register `bytes` at `addr`; `memory` keeps that mapping alive until
    /// the registration is gone (the NIC may write into it until then).
    static Result<std::unique_ptr<VerbsMr>> reg(std::shared_ptr<VerbsHca> hca, void* addr, std::uint64_t bytes,
                                                std::shared_ptr<const void> memory);
    ~VerbsMr();
    VerbsMr(const VerbsMr&) = delete;
    VerbsMr& operator=(const VerbsMr&) = delete;

    std::uint32_t lkey() const;
    std::uint32_t rkey() const;
    std::uint64_t addr() const { return addr_; }
    std::uint64_t bytes() const { return bytes_; }

private:
    VerbsMr() = default;
    std::shared_ptr<VerbsHca> hca_;
    std::shared_ptr<const void> memory_; ///< released after mr_ is deregistered
    ibv_mr* mr_ = nullptr;
    std::uint64_t addr_ = 0;
    std::uint64_t bytes_ = 0;
};

/// What the remote end of a QP told us (peer_proto records).
struct RemoteQp {
    std::uint32_t qpn = 0;
    std::uint32_t psn = 0;
    std::uint8_t gid[16] = {};
    std::uint16_t mtu = 1024;      ///< the remote port's active MTU, bytes
    std::uint64_t regionAddr = 0;  ///< the remote rank's region, as registered on the remote HCA
    std::uint32_t rkey = 0;
};

/// The flag line's copies as one inline WRITE: copy 0 at 0 to the last copy's
/// 8 bytes (104 bytes; the bytes between the copies are unused).
inline constexpr std::uint32_t kFlagLineInline = (kFlagCopies - 1) * kFlagCopyStride + sizeof(std::uint64_t);

/// The RC queue pair between one local rank and one remote rank on one rail,
/// with everything the proxy needs to post a stripe on it.
class QpLink {
public:
    /// A QP in INIT on `hca`, with a fresh random PSN.
    static Result<std::unique_ptr<QpLink>> create(std::shared_ptr<VerbsHca> hca, std::uint32_t maxSendWr,
                                                  std::uint64_t inflightCap);
    ~QpLink();
    QpLink(const QpLink&) = delete;
    QpLink& operator=(const QpLink&) = delete;

    std::uint32_t qpn() const;
    std::uint32_t psn() const { return psn_; }
    /// Bytes of the flag WRITE: kFlagLineInline (every copy) or 8 (copy 0).
    std::uint32_t flagBytes() const { return flagBytes_; }
    /// INIT -> RTR -> RTS towards `remote`. Retry count 6: rxe treats 7 as
    /// "retry forever", and a cut link must end in an error, not a stall.
    Status connect(const RemoteQp& remote);

    /// Post stripe `s` of the shard staged in the local slot (phase, src) and
    /// the epoch flag of (phase, src, stripe) into the remote region: payload
    /// WRITE unsignaled (skipped when empty), chained to a signaled inline
    /// WRITE of the flag on this QP, so the flag cannot land first. The flag
    /// WRITE carries every copy of the flag (kFlagLineInline bytes: a GPU's
    /// poller warps each read their own, proto/layout.hpp) where the HCA
    /// takes that much inline data, else copy 0 alone (flagBytes()).
    /// The caller checked gate.mustWait(2) first.
    Status postStripe(const Layout& layout, std::uint32_t phase, std::uint32_t src, std::uint32_t stripe,
                      const Stripe& s, std::uint64_t epoch);

    /// Account a post that went out: the gate, the HCA's signaled count, the
    /// post counter. postStripe calls it once ibv_post_send took the post.
    void notePosted(std::uint64_t bytes, std::uint32_t wrs) {
        gate.posted(bytes, wrs);
        ++hca_->outstanding;
        posts.fetch_add(1, std::memory_order_relaxed);
    }
    /// A completion of this QP's signaled flag WRITE (proxy thread): the
    /// oldest post retires.
    void retireOne() {
        if (gate.retireOldest()) --hca_->outstanding;
    }
    /// Move the QP to the error state: every posted request flushes at once
    /// (a dropped group's QPs must drain before they are destroyed).
    void flush();

    VerbsHca& hca() const { return *hca_; }
    InflightGate gate;

    // Set at connect time by the group table, read by the proxy.
    std::uint32_t groupHandle = 0;
    std::uint32_t localRank = 0;
    std::uint32_t remoteRank = 0;
    std::uint32_t rail = 0;
    std::uint8_t* localBase = nullptr; ///< the local rank's region as the daemon maps it (registered as `lkey`)
    std::uint32_t lkey = 0;
    RemoteQp remote;
    bool failed = false;               ///< a completion came back with an error (proxy thread)
    /// The remote node's daemon went away and the group goes on without this
    /// QP (Negotiation::goAway; control thread): its failure is expected, not reported.
    std::atomic<bool> replaced{false};
    std::atomic<std::uint64_t> posts{0};

private:
    QpLink() = default;
    std::shared_ptr<VerbsHca> hca_;
    ibv_qp* qp_ = nullptr;
    std::uint32_t psn_ = 0;
    std::uint32_t flagBytes_ = sizeof(std::uint64_t);
};

/// Poll one HCA's CQ once (proxy thread). Successful completions retire
/// their post; a failed one (flag or, tagged in its wr_id, the unsignaled
/// payload) marks its link failed and is reported through
/// `onError(link, status text)` once per link. Returns the completions seen.
using QpErrorFn = void (*)(void* ctx, QpLink& link, const std::string& why);
std::uint32_t pollCompletions(VerbsHca& hca, QpErrorFn onError, void* ctx);


} // namespace tpf::daemon
