// The C ABI (<tpfabric/tpfabric.h>): a thin skin over the C++ API. Every
// function catches what it must (a C caller cannot take an exception), maps
// Status to its code and keeps the detail in a thread-local last error.
#include <tpfabric/tpfabric.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "client/format.hpp"
#include "client/impl.hpp"

struct tpf_group {
    std::unique_ptr<tpf::Group> group;
};

struct tpf_tcp_bootstrap {
    std::unique_ptr<tpf::TcpBootstrap> boot;
};

namespace tpf {

namespace {

thread_local std::string lastError;

tpf_status report(const Error& e) {
    lastError = e.describe();
    return tpf_status(e.code);
}

tpf_status report(const Status& s) { return s ? tpf_status(TPF_OK) : report(s.error()); }

tpf_status invalid(const char* what) { return report(Error{Errc::InvalidArgument, what}); }

// The last tpf_group_open of this thread returned Unavailable with a fallback allowed.
thread_local bool lastOpenFallBack = false;

// While a callback of tpf_group_open runs: the open's deadline (tpf_bootstrap_time_left_ms).
thread_local std::optional<Bootstrap::Clock::time_point> callbackDeadline;

// The engine's all-gather, as a Bootstrap.
class CallbackBootstrap final : public Bootstrap {
public:
    // The callback places each record at its caller's own rank, which only
    // the engine's communicator knows: `rank` is what tpf_group_open was
    // given. One outside the world still takes part in round 0 as a rank of
    // it (Group::open refuses it OutOfRange, and the others hear which
    // bootstrap rank opened as what instead of waiting for it).
    CallbackBootstrap(std::uint32_t rank, std::uint32_t world, tpf_allgather_fn fn, void* ctx)
        : rank_(rank < world ? rank : 0), world_(world), fn_(fn), ctx_(ctx) {}
    std::uint32_t rank() const override { return rank_; }
    std::uint32_t world() const override { return world_; }
    // The open cannot interrupt a callback: it tells it the deadline instead.
    Status allGatherUntil(const void* mine, void* out, std::size_t bytes, Clock::time_point deadline) override {
        const auto outer = std::exchange(callbackDeadline, deadline);
        Status s = allGather(mine, out, bytes);
        callbackDeadline = outer;
        return s;
    }
    Status allGather(const void* mine, void* out, std::size_t bytes) override {
        const tpf_status rc = fn_(ctx_, mine, out, bytes);
        if (rc == TPF_OK) return okStatus();
        Errc code = Errc::PeerLost;
        if (rc < 0 || !errcFromWire(std::uint32_t(rc), code) || code == Errc::Ok) code = Errc::PeerLost;
        return Error{code, format("the bootstrap's all-gather callback returned {} ({})", rc, std::string_view(errcName(code)))};
    }

private:
    std::uint32_t rank_, world_;
    tpf_allgather_fn fn_;
    void* ctx_;
};

// The C face of Health: fixed for the ABI's life.
static_assert(sizeof(tpf_health) == 32 && offsetof(tpf_health, rank) == 4 && offsetof(tpf_health, flags) == 8 &&
              offsetof(tpf_health, reserved) == 12);
static_assert(Health::kNoRank == TPF_NO_RANK);

// The C face of DType: one set of values.
static_assert(int(DType::F32) == TPF_DTYPE_F32 && int(DType::F16) == TPF_DTYPE_F16 && int(DType::BF16) == TPF_DTYPE_BF16);

DType dtypeOf(std::int32_t d, bool& ok) {
    ok = d >= TPF_DTYPE_F32 && d <= TPF_DTYPE_BF16;
    return ok ? DType(d) : DType::F32;
}

// The fields of a caller's options that its header had (struct_size).
Status optionsOf(const tpf_open_options* in, Options& out) {
    if (!in) return okStatus();
    if (in->struct_size < offsetof(tpf_open_options, socket_path))
        return Error{Errc::InvalidArgument,
                     format("tpf_open_options.struct_size is {}; call tpf_open_options_init first", in->struct_size)};
    // An older caller's shorter struct keeps our defaults for the fields it
    // lacks; a newer caller's extra fields are not ours to read.
    tpf_open_options o;
    tpf_open_options_init(&o);
    std::memcpy(&o, in, std::min<std::size_t>(in->struct_size, sizeof o));
    switch (o.buffers) {
    case TPF_BUFFERS_HOST: out.buffers = Buffers::Host; break;
    case TPF_BUFFERS_DEVICE: out.buffers = Buffers::Device; break;
    default: return Error{Errc::InvalidArgument, "tpf_open_options.buffers " + std::to_string(o.buffers) + " is not a tpf_buffers value"};
    }
    if (o.socket_path) out.socketPath = o.socket_path;
    if (o.timeout_ms) out.timeout = std::chrono::milliseconds(o.timeout_ms);
    if (o.open_timeout_ms) out.openTimeout = std::chrono::milliseconds(o.open_timeout_ms);
    if (o.spin_us) out.spin = std::chrono::microseconds(o.spin_us);
    switch (o.fallback) {
    case TPF_FALLBACK_DEFAULT: break;
    case TPF_FALLBACK_NCCL: out.fallback = Fallback::Nccl; break;
    case TPF_FALLBACK_ERROR: out.fallback = Fallback::Error; break;
    default: return Error{Errc::InvalidArgument, "tpf_open_options.fallback " + std::to_string(o.fallback) + " is not a tpf_fallback value"};
    }
    switch (o.gpu_route) {
    case TPF_GPU_ROUTE_DEFAULT: break;
    case TPF_GPU_ROUTE_AUTO: out.gpuRoute = GpuRoute::Auto; break;
    case TPF_GPU_ROUTE_IPC: out.gpuRoute = GpuRoute::Ipc; break;
    case TPF_GPU_ROUTE_PROXY: out.gpuRoute = GpuRoute::Proxy; break;
    default: return Error{Errc::InvalidArgument, "tpf_open_options.gpu_route " + std::to_string(o.gpu_route) + " is not a tpf_gpu_route value"};
    }
    out.maxBlocks = o.max_blocks;
    out.ncclComm = o.nccl_comm;
    return okStatus();
}

// Runs `f` (returning a tpf_status) with the exceptions a C caller cannot take turned into codes.
template <class F>
tpf_status guarded(F&& f) noexcept {
    try {
        return f();
    } catch (const std::bad_alloc&) {
        return report(Error{Errc::SystemError, "out of memory"});
    } catch (const std::exception& e) {
        return report(Error{Errc::SystemError, std::string("internal error: ") + e.what()});
    } catch (...) {
        return report(Error{Errc::SystemError, "internal error"});
    }
}

} // namespace

} // namespace tpf

using namespace tpf;

extern "C" {

void tpf_open_options_init(tpf_open_options* options) {
    if (!options) return;
    *options = tpf_open_options{};
    options->struct_size = sizeof(tpf_open_options);
}

tpf_status tpf_group_open(uint32_t rank, uint32_t world, uint64_t max_bytes, tpf_allgather_fn allgather, void* ctx,
                          const tpf_open_options* options, tpf_group** group) {
    return guarded([&]() -> tpf_status {
        lastOpenFallBack = false;
        if (!group) return invalid("tpf_group_open: group (the out parameter) is NULL");
        *group = nullptr;
        if (!allgather) return invalid("tpf_group_open: allgather (the bootstrap callback) is NULL");
        if (allgather == &tpf_tcp_bootstrap_allgather && !ctx)
            return invalid("tpf_group_open: allgather is tpf_tcp_bootstrap_allgather but ctx (its tpf_tcp_bootstrap) is NULL");
        Options o;
        if (auto s = optionsOf(options, o); !s) return report(s);
        CallbackBootstrap callback(rank, world, allgather, ctx);
        // The library's own TCP bootstrap takes part directly: bounded by the
        // open's deadline, and its rank and world checked against the call's.
        Bootstrap& boot = allgather == &tpf_tcp_bootstrap_allgather && ctx
                              ? static_cast<Bootstrap&>(*static_cast<tpf_tcp_bootstrap*>(ctx)->boot)
                              : static_cast<Bootstrap&>(callback);
        auto g = Group::open(boot, rank, world, max_bytes, o);
        if (!g) {
            lastOpenFallBack = g.error().code == Errc::Unavailable && lastOpenMayFallBack();
            return report(g.error());
        }
        *group = new tpf_group{std::move(*g)};
        return TPF_OK;
    });
}

void tpf_group_close(tpf_group* group) { delete group; } // ~Group closes

tpf_status tpf_all_gather(tpf_group* group, const void* send, void* recv, size_t bytes) {
    if (!group) return invalid("tpf_all_gather: group is NULL");
    if ((!send || !recv) && bytes) return invalid("tpf_all_gather: send or recv is NULL");
    return guarded([&] { return report(group->group->allGather(send, recv, bytes)); });
}

tpf_status tpf_all_gather_v(tpf_group* group, const void* send, void* recv, const size_t* counts) {
    if (!group) return invalid("tpf_all_gather_v: group is NULL");
    if (!counts) return invalid("tpf_all_gather_v: counts is NULL");
    const std::span<const std::size_t> c(counts, group->group->world());
    return guarded([&] { return report(group->group->allGatherV(send, recv, c)); });
}

tpf_status tpf_all_gather_v_async(tpf_group* group, const void* send, void* recv, const size_t* counts, void* stream) {
    if (!group) return invalid("tpf_all_gather_v_async: group is NULL");
    if (!counts) return invalid("tpf_all_gather_v_async: counts is NULL");
    const std::span<const std::size_t> c(counts, group->group->world());
    return guarded([&] { return report(group->group->allGatherV(send, recv, c, static_cast<CUstream_st*>(stream))); });
}

tpf_status tpf_all_reduce_sum(tpf_group* group, const void* send, void* recv, size_t count, int32_t dtype) {
    if (!group) return invalid("tpf_all_reduce_sum: group is NULL");
    if ((!send || !recv) && count) return invalid("tpf_all_reduce_sum: send or recv is NULL");
    bool ok = false;
    const DType t = dtypeOf(dtype, ok);
    if (!ok) return invalid(("tpf_all_reduce_sum: dtype " + std::to_string(dtype) + " is not a tpf_dtype value").c_str());
    return guarded([&] { return report(group->group->allReduceSum(send, recv, count, t)); });
}

tpf_status tpf_all_gather_async(tpf_group* group, const void* send, void* recv, size_t bytes, void* stream) {
    if (!group) return invalid("tpf_all_gather_async: group is NULL");
    if ((!send || !recv) && bytes) return invalid("tpf_all_gather_async: send or recv is NULL");
    return guarded([&] { return report(group->group->allGather(send, recv, bytes, static_cast<CUstream_st*>(stream))); });
}

tpf_status tpf_all_reduce_sum_async(tpf_group* group, const void* send, void* recv, size_t count, int32_t dtype,
                                    void* stream) {
    if (!group) return invalid("tpf_all_reduce_sum_async: group is NULL");
    if ((!send || !recv) && count) return invalid("tpf_all_reduce_sum_async: send or recv is NULL");
    bool ok = false;
    const DType t = dtypeOf(dtype, ok);
    if (!ok) return invalid(("tpf_all_reduce_sum_async: dtype " + std::to_string(dtype) + " is not a tpf_dtype value").c_str());
    return guarded([&] {
        return report(group->group->allReduceSum(send, recv, count, t, static_cast<CUstream_st*>(stream)));
    });
}

tpf_status tpf_check(const tpf_group* group) {
    if (!group) return invalid("tpf_check: group is NULL");
    return guarded([&] { return report(group->group->check()); });
}

tpf_status tpf_group_health(const tpf_group* group, tpf_health* health) {
    if (!group) {
        if (health) *health = tpf_health{TPF_INVALID_ARGUMENT, TPF_NO_RANK, 0, {}};
        return invalid("tpf_group_health: group is NULL");
    }
    const Health h = group->group->health(); // noexcept: nothing to guard
    const tpf_status status = tpf_status(h.code);
    if (health) *health = tpf_health{status, h.rank, (h.flags & Health::kNccl) ? TPF_HEALTH_NCCL : 0u, {}};
    return status;
}

tpf_status tpf_abort(tpf_group* group) {
    if (!group) return invalid("tpf_abort: group is NULL");
    return guarded([&] { return report(group->group->abort()); });
}

uint64_t tpf_agreed_cap(const tpf_group* group) { return group ? group->group->agreedCap() : 0; }
int tpf_fits(const tpf_group* group, size_t bytes) { return group && group->group->fits(bytes) ? 1 : 0; }

const char* tpf_path(const tpf_group* group) {
    if (!group) return "";
    return group->group->path() == "nccl" ? "nccl" : "fabric";
}

const char* tpf_route(const tpf_group* group, uint32_t peer) {
    if (!group) return "none";
    const std::string r = group->group->route(peer);
    for (const char* name : {"self", "shm", "verbs", "ipc", "tcp"})
        if (r == name) return name;
    return "none";
}

uint32_t tpf_rank(const tpf_group* group) { return group ? group->group->rank() : 0; }
uint32_t tpf_world(const tpf_group* group) { return group ? group->group->world() : 0; }

tpf_status tpf_tcp_bootstrap_create(uint32_t rank, uint32_t world, const char* host_port, uint32_t timeout_ms,
                                    tpf_tcp_bootstrap** bootstrap) {
    return guarded([&]() -> tpf_status {
        if (!bootstrap) return invalid("tpf_tcp_bootstrap_create: bootstrap (the out parameter) is NULL");
        *bootstrap = nullptr;
        if (!host_port) return invalid("tpf_tcp_bootstrap_create: host_port is NULL");
        auto b = TcpBootstrap::create(rank, world, host_port, std::chrono::milliseconds(timeout_ms ? timeout_ms : 30000));
        if (!b) return report(b.error());
        *bootstrap = new tpf_tcp_bootstrap{std::move(*b)};
        return TPF_OK;
    });
}

void tpf_tcp_bootstrap_destroy(tpf_tcp_bootstrap* bootstrap) { delete bootstrap; }

tpf_status tpf_tcp_bootstrap_allgather(void* ctx, const void* mine, void* out, size_t bytes) {
    if (!ctx) return invalid("tpf_tcp_bootstrap_allgather: ctx (the tpf_tcp_bootstrap) is NULL");
    if (bytes != 0 && (!mine || !out)) return invalid("tpf_tcp_bootstrap_allgather: mine or out is NULL");
    return guarded([&] { return report(static_cast<tpf_tcp_bootstrap*>(ctx)->boot->allGather(mine, out, bytes)); });
}

uint32_t tpf_bootstrap_time_left_ms(void) {
    if (!callbackDeadline) return UINT32_MAX;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*callbackDeadline - Bootstrap::Clock::now()).count();
    return uint32_t(std::clamp<std::int64_t>(left, 0, UINT32_MAX - 1));
}

const char* tpf_status_name(tpf_status status) {
    Errc e;
    if (status < 0 || !errcFromWire(std::uint32_t(status), e)) return "Unknown";
    return errcName(e).data(); // string literals: NUL-terminated
}

const char* tpf_strerror(tpf_status status) {
    Errc e;
    if (status < 0 || !errcFromWire(std::uint32_t(status), e)) return "unknown status code (not from this release of libtpfabric)";
    return errcMessage(e).data();
}

int tpf_last_open_may_fall_back(void) { return lastOpenFallBack ? 1 : 0; }

const char* tpf_last_error(void) { return lastError.c_str(); }

const char* tpf_version(void) { return TPF_VERSION_STRING; }

} // extern "C"
