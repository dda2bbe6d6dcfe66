// Builds without CUDA: the stream calls exist and say why they cannot run.
#include "client/impl.hpp"

namespace tpf {

namespace {
Error noCuda() { return Error{Errc::Unsupported, "libtpfabric was built without CUDA (meson feature cuda)"}; }
} // namespace

struct GpuPath {};
void GpuPathDeleter::operator()(GpuPath* p) const { delete p; }

Status Group::allGather(const void*, void*, std::size_t, CUstream_st*) { return noCuda(); }
Status Group::allReduceSum(const void*, void*, std::size_t, DType, CUstream_st*) { return noCuda(); }
Status Group::allGatherV(const void*, void*, std::span<const std::size_t>, CUstream_st*) { return noCuda(); }

void* ncclCommOf(Bootstrap&) { return nullptr; }
Status gpuAttach(Group::Impl&, Bootstrap&) { return noCuda(); }
Status gpuFallback(Group::Impl&, void*) { return noCuda(); }
void gpuFlushStats(Group::Impl&) {}
Status gpuCheck(Group::Impl& g) { return g.failure.code != Errc::Ok ? Status(g.failure) : okStatus(); }

} // namespace tpf
