// RDMA resources with libibverbs (see qp.hpp). Every verbs call goes
// through daemon/verbs/verbs_check.hpp, which names the call and the site in the error.
#include "daemon/verbs/qp.hpp"

#include <infiniband/verbs.h>
#include <sodium.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>

#include "daemon/verbs/verbs_check.hpp"

namespace tpf::daemon {

namespace {

ibv_mtu mtuEnum(std::uint16_t bytes) {
    switch (bytes) {
    case 256: return IBV_MTU_256;
    case 512: return IBV_MTU_512;
    case 2048: return IBV_MTU_2048;
    case 4096: return IBV_MTU_4096;
    default: return IBV_MTU_1024;
    }
}

// 4.096 us * 2^18 = 1.07 s per try: a host (or a QEMU guest) starved for a
// few hundred ms must not exhaust the retries; a dead link still errors
// within about 7 s (NCCL's default is 2^20).
constexpr std::uint8_t kAckTimeout = 18;
constexpr std::uint8_t kRetryCount = 6;  // 7 means "forever" on rxe
constexpr std::uint8_t kRnrRetry = 6;

} // namespace

// ---- HCA -----------------------------------------------------------------

Result<std::shared_ptr<VerbsHca>> VerbsHca::open(const client_proto::HcaCard& card, std::uint32_t cqDepth) {
    std::shared_ptr<VerbsHca> h(new VerbsHca());
    h->card_ = card;
    std::string name;
    getText(card.device, name);
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (!list) return Error{Errc::SystemError, std::string("ibv_get_device_list failed: ") + std::strerror(errno)};
    for (int i = 0; i < n && !h->ctx_; ++i)
        if (name == ibv_get_device_name(list[i])) h->ctx_ = ibv_open_device(list[i]);
    ibv_free_device_list(list);
    if (!h->ctx_) return Error{Errc::Unavailable, "cannot open HCA " + name + " (gone, or no permission on /dev/infiniband)"};
    TPF_VERBS_PTR(Errc::SystemError, h->pd_, ibv_alloc_pd(h->ctx_));
    TPF_VERBS_PTR(Errc::SystemError, h->cq_, ibv_create_cq(h->ctx_, int(cqDepth), nullptr, nullptr, 0));
    h->cqDepth_ = std::uint32_t(h->cq_->cqe);
    return h;
}

VerbsHca::~VerbsHca() {
    if (cq_ && ibv_destroy_cq(cq_)) spdlog::error("ibv_destroy_cq on {}: {}", name(), std::strerror(errno));
    if (pd_ && ibv_dealloc_pd(pd_)) spdlog::error("ibv_dealloc_pd on {}: {}", name(), std::strerror(errno));
    if (ctx_) ibv_close_device(ctx_);
}

std::string VerbsHca::name() const {
    std::string s;
    getText(card_.device, s);
    return s;
}

// ---- memory registration ----------------------------------------------------

Result<std::unique_ptr<VerbsMr>> VerbsMr::reg(std::shared_ptr<VerbsHca> hca, void* addr, std::uint64_t bytes,
                                              std::shared_ptr<const void> memory) {
    std::unique_ptr<VerbsMr> m(new VerbsMr());
    m->hca_ = std::move(hca);
    m->memory_ = std::move(memory);
    TPF_VERBS_PTR(Errc::RegistrationFailed, m->mr_,
                  ibv_reg_mr(m->hca_->pd(), addr, bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
    m->addr_ = reinterpret_cast<std::uintptr_t>(addr);
    m->bytes_ = bytes;
    return m;
}

VerbsMr::~VerbsMr() {
    if (mr_ && ibv_dereg_mr(mr_)) spdlog::error("ibv_dereg_mr on {}: {}", hca_->name(), std::strerror(errno));
}

std::uint32_t VerbsMr::lkey() const { return mr_->lkey; }
std::uint32_t VerbsMr::rkey() const { return mr_->rkey; }

// ---- queue pairs --------------------------------------------------------------

Result<std::unique_ptr<QpLink>> QpLink::create(std::shared_ptr<VerbsHca> hca, std::uint32_t maxSendWr,
                                               std::uint64_t inflightCap) {
    std::unique_ptr<QpLink> l(new QpLink());
    l->hca_ = std::move(hca);
    ibv_qp_init_attr init{};
    init.send_cq = l->hca_->cq();
    init.recv_cq = l->hca_->cq();
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = maxSendWr;
    init.cap.max_recv_wr = 1;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    // Inline room for the flag line's copies; an HCA that refuses that much
    // gets copy 0 alone (a GPU's lead poller still sees it, docs/verbs.md).
    init.cap.max_inline_data = kFlagLineInline;
    l->qp_ = ibv_create_qp(l->hca_->pd(), &init);
    if (!l->qp_) {
        const int refused = errno;
        init.cap.max_inline_data = sizeof(std::uint64_t);
        TPF_VERBS_PTR(Errc::QpError, l->qp_, ibv_create_qp(l->hca_->pd(), &init)); // failing again: not the inline size
        spdlog::info("{}: no queue pair with {} bytes of inline data ({}), one with {}; flags go as copy 0 alone",
                     l->hca_->name(), kFlagLineInline, std::strerror(refused), init.cap.max_inline_data);
    }
    l->flagBytes_ = init.cap.max_inline_data >= kFlagLineInline ? kFlagLineInline : sizeof(std::uint64_t);
    const std::uint32_t wrs = std::min(init.cap.max_send_wr, maxSendWr);
    l->gate.reset(inflightCap, wrs);
    l->psn_ = randombytes_uniform(1u << 24);

    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = l->hca_->card().port;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    if (auto s = TPF_VERBS(Errc::QpError,
                           ibv_modify_qp(l->qp_, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
        !s)
        return s.error();
    return l;
}

QpLink::~QpLink() {
    if (qp_ && ibv_destroy_qp(qp_)) spdlog::error("ibv_destroy_qp {} on {}: {}", qp_->qp_num, hca_->name(), std::strerror(errno));
}

std::uint32_t QpLink::qpn() const { return qp_->qp_num; }

Status QpLink::connect(const RemoteQp& r) {
    remote = r;
    const auto& card = hca_->card();
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = mtuEnum(std::min(card.mtu, r.mtu));
    a.dest_qp_num = r.qpn;
    a.rq_psn = r.psn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    std::memcpy(a.ah_attr.grh.dgid.raw, r.gid, 16);
    a.ah_attr.grh.sgid_index = std::uint8_t(card.gidIndex);
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = card.port;
    if (auto s = TPF_VERBS(Errc::QpError, ibv_modify_qp(qp_, &a,
                                                        IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                                            IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER));
        !s)
        return s;
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = kAckTimeout;
    a.retry_cnt = kRetryCount;
    a.rnr_retry = kRnrRetry;
    a.sq_psn = psn_;
    a.max_rd_atomic = 1;
    return TPF_VERBS(Errc::QpError, ibv_modify_qp(qp_, &a,
                                                  IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                                      IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC));
}

// ---- post and poll (proxy thread) -----------------------------------------------

Status QpLink::postStripe(const Layout& layout, std::uint32_t phase, std::uint32_t src, std::uint32_t stripe,
                          const Stripe& s, std::uint64_t epoch) {
    const std::uint64_t slot = layout.slotOffset(phase, src) + s.offset;
    ibv_sge payload{reinterpret_cast<std::uintptr_t>(localBase + slot), std::uint32_t(s.bytes), lkey};
    // Copied into the WQE (the flag WRITE is inline): the epoch at every copy's offset.
    std::uint64_t line[kFlagLineInline / sizeof(std::uint64_t)] = {};
    for (std::uint32_t c = 0; c < kFlagCopies; ++c) line[c * kFlagCopyStride / sizeof(std::uint64_t)] = epoch;
    ibv_sge flag{reinterpret_cast<std::uintptr_t>(line), flagBytes_, lkey};

    ibv_send_wr wr[2]{};
    // The payload is unsignaled: only an error completes it, tagged (low bit)
    // so that the error names this link and retires nothing.
    wr[0].wr_id = reinterpret_cast<std::uintptr_t>(this) | 1u;
    wr[0].sg_list = &payload;
    wr[0].num_sge = 1;
    wr[0].opcode = IBV_WR_RDMA_WRITE;
    wr[0].wr.rdma.remote_addr = remote.regionAddr + slot;
    wr[0].wr.rdma.rkey = remote.rkey;
    wr[0].next = &wr[1];
    wr[1].wr_id = reinterpret_cast<std::uintptr_t>(this);
    wr[1].sg_list = &flag;
    wr[1].num_sge = 1;
    wr[1].opcode = IBV_WR_RDMA_WRITE;
    wr[1].send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
    wr[1].wr.rdma.remote_addr = remote.regionAddr + layout.flagOffset(phase, src, stripe);
    wr[1].wr.rdma.rkey = remote.rkey;

    const std::uint32_t wrs = s.bytes ? 2 : 1;
    ibv_send_wr* bad = nullptr;
    if (int rc = ibv_post_send(qp_, s.bytes ? &wr[0] : &wr[1], &bad))
        return verbsError(Errc::QpError, "ibv_post_send", __FILE__, __LINE__, rc);
    notePosted(s.bytes + flagBytes_, wrs);
    return okStatus();
}

std::uint32_t pollCompletions(VerbsHca& hca, QpErrorFn onError, void* ctx) {
    ibv_wc wc[16];
    const int n = ibv_poll_cq(hca.cq(), 16, wc);
    if (n <= 0) return 0;
    for (int i = 0; i < n; ++i) {
        const bool payload = wc[i].wr_id & 1u;
        auto* link = reinterpret_cast<QpLink*>(wc[i].wr_id & ~std::uint64_t(1));
        if (!link) continue;
        if (!payload) link->retireOne();
        if (wc[i].status != IBV_WC_SUCCESS && !link->failed) {
            link->failed = true;
            onError(ctx, *link,
                    std::string(ibv_wc_status_str(wc[i].status)) + " on a " + (payload ? "payload" : "flag") +
                        " WRITE (vendor error " + std::to_string(wc[i].vendor_err) + ")");
        }
    }
    return std::uint32_t(n);
}

void QpLink::flush() {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    if (ibv_modify_qp(qp_, &a, IBV_QP_STATE)) spdlog::warn("moving QP {} to the error state: {}", qpn(), std::strerror(errno));
}

} // namespace tpf::daemon
