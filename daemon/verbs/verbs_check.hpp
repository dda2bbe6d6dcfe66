// The one way a libibverbs call is checked (daemon/verbs/qp.cpp, hca_verbs.cpp):
// a failure becomes a named Error carrying the call's text, its site and errno's
// text, and is logged at debug level.
#pragma once

#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>
#include <string>

#include <tpfabric/error.hpp>

namespace tpf::daemon {

/// `code` with "CALL failed: STRERROR(err) (FILE:LINE)"; logged at debug.
inline Error verbsError(Errc code, const char* call, const char* file, int line, int err) {
    std::string msg = std::string(call) + " failed: " + std::strerror(err) + " (" + file + ":" + std::to_string(line) + ")";
    spdlog::debug("verbs: {}", msg);
    return Error{code, std::move(msg)};
}

} // namespace tpf::daemon

/// A Status for an ibv_* call that returns 0 on success and an errno value
/// (or -1 with errno set; EIO when it sets none) on failure; `code` names it.
#define TPF_VERBS(code, call)                                                                                         \
    [&]() -> ::tpf::Status {                                                                                          \
        errno = 0;                                                                                                    \
        const int tpf_rc_ = (call);                                                                                   \
        if (tpf_rc_ == 0) return ::tpf::okStatus();                                                                   \
        return ::tpf::daemon::verbsError(code, #call, __FILE__, __LINE__,                                             \
                                         tpf_rc_ > 0 ? tpf_rc_ : (errno ? errno : EIO));                              \
    }()

/// Assigns an ibv_* call that returns a pointer (nullptr with errno on failure)
/// to `lhs`; on failure returns the Error named `code` from the enclosing function.
#define TPF_VERBS_PTR(code, lhs, call)                                                                                \
    do {                                                                                                              \
        errno = 0;                                                                                                    \
        lhs = (call);                                                                                                 \
        if (!(lhs)) return ::tpf::daemon::verbsError(code, #call, __FILE__, __LINE__, errno ? errno : EIO);          \
    } while (0)
