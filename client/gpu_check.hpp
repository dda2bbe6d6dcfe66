// One checking macro for every CUDA runtime, driver and NCCL call of the
// client: a failure becomes a Status (CudaError / NcclError) naming the call's
// text and its site, which the caller receives (and the open's fallback line
// prints); nothing is printed twice. A cleanup call whose failure nobody
// receives (TPF_GPU_CLEANUP) prints it on stderr instead.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include <tpfabric/error.hpp>
#include "tpf_config.h"
#if TPF_HAVE_NCCL
#include <nccl.h>
#endif

namespace tpf::gpucheck {

/// "what (call at client/x.cpp:12)": the failure first, the site after it,
/// the build directory's "../" off the file name.
inline Status fail(Errc code, const std::string& what, const char* call, const char* file, int line) {
    while (file[0] == '.' && file[1] == '.' && file[2] == '/') file += 3;
    return Error{code, what + " (" + call + " at " + file + ":" + std::to_string(line) + ")"};
}

inline Status check(cudaError_t e, const char* call, const char* file, int line) {
    if (e == cudaSuccess) return okStatus();
    std::string what = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || e == cudaErrorDevicesUnavailable ||
        e == cudaErrorStubLibrary)
        what += "; this process has no usable GPU or CUDA driver: a group with device buffers needs one "
                "(host buffers need none)";
    return fail(Errc::CudaError, what, call, file, line);
}

inline Status check(CUresult e, const char* call, const char* file, int line) {
    if (e == CUDA_SUCCESS) return okStatus();
    return fail(Errc::CudaError, "CUresult " + std::to_string(int(e)), call, file, line);
}

#if TPF_HAVE_NCCL
inline Status check(ncclResult_t e, const char* call, const char* file, int line) {
    if (e == ncclSuccess) return okStatus();
    return fail(Errc::NcclError, std::string("NCCL: ") + ncclGetErrorString(e), call, file, line);
}
#endif

/// A cleanup's failure, which no caller receives: said once on stderr.
inline void logged(const Status& s) {
    if (!s) std::fprintf(stderr, "tpfabric: cleanup: %s\n", s.error().describe().c_str());
}

} // namespace tpf::gpucheck

/// Evaluates to a Status naming the call and its site on failure.
#define TPF_GPU(call) ::tpf::gpucheck::check((call), #call, __FILE__, __LINE__)
/// Returns the failure from the enclosing function (Status or Result<T>).
#define TPF_GPU_TRY(call)                                                                                             \
    do {                                                                                                              \
        if (auto tpf_s_ = TPF_GPU(call); !tpf_s_) return tpf_s_.error();                                              \
    } while (0)
/// A cleanup call (a free, an unmap, a destroy) whose failure no caller receives: printed on stderr.
#define TPF_GPU_CLEANUP(call) ::tpf::gpucheck::logged(TPF_GPU(call))
