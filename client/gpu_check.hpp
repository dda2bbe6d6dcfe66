// One checking macro for every CUDA runtime, driver and NCCL call of the
// client: a failure is logged with the call's text and its site and becomes
// a Status (CudaError / NcclError) naming both.
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
    std::string msg = what + " (" + call + " at " + file + ":" + std::to_string(line) + ")";
    std::fprintf(stderr, "tpfabric: %s\n", msg.c_str());
    return Error{code, std::move(msg)};
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

} // namespace tpf::gpucheck

/// Evaluates to a Status; logs the call and its site on failure.
#define TPF_GPU(call) ::tpf::gpucheck::check((call), #call, __FILE__, __LINE__)
/// Returns the failure from the enclosing function (Status or Result<T>).
#define TPF_GPU_TRY(call)                                                                                             \
    do {                                                                                                              \
        if (auto tpf_s_ = TPF_GPU(call); !tpf_s_) return tpf_s_.error();                                              \
    } while (0)
