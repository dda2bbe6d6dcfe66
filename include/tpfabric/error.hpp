// tpfabric — the one error vocabulary shared by the API, the daemon, the
// tools and the wire (installed as <tpfabric/error.hpp>; part of the API).
//
// Every failure the system can report has a name here. The numeric values
// come from <tpfabric/errc.h> (the C ABI's status codes) and cross sockets
// and shared memory (u16/u32 fields in proto/ records and the control block),
// so a value, once assigned, never changes meaning.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include <tpfabric/errc.h>

namespace tpf {

/// Named failures. Wire encoding: the underlying u16; 0 is success.
enum class Errc : std::uint16_t {
    Ok = TPF_OK,
    Unsupported = TPF_UNSUPPORTED,                        ///< feature or route not built in / not available here
    Misaligned = TPF_MISALIGNED,                          ///< a buffer address violates the alignment rule
    Timeout = TPF_TIMEOUT,                                ///< a bounded wait ran out; missing_peer names who
    PeerLost = TPF_PEER_LOST,                             ///< a member of the group died or its node went away
    DaemonLost = TPF_DAEMON_LOST,                         ///< the local tpfabricd went away mid-call
    Aborted = TPF_ABORTED,                                ///< some rank called Group::abort()
    CapMismatch = TPF_CAP_MISMATCH,                       ///< a size above the agreed cap, or caps that cannot agree
    NonOneToOnePairing = TPF_NON_ONE_TO_ONE_PAIRING,      ///< HCAs of two nodes do not pair one to one by subnet
    BadMessage = TPF_BAD_MESSAGE,                         ///< malformed record: length, count, field out of range
    VersionMismatch = TPF_VERSION_MISMATCH,               ///< protocol version outside the accepted range (daemon, or another rank's library)
    BadMagic = TPF_BAD_MAGIC,                             ///< wrong magic: not our protocol, or another record layout
    Truncated = TPF_TRUNCATED,                            ///< fewer bytes than the header or a count promises
    TooLarge = TPF_TOO_LARGE,                             ///< a length above the protocol's maximum
    OutOfRange = TPF_OUT_OF_RANGE,                        ///< rank, world, stripe or slot outside its bounds
    Unavailable = TPF_UNAVAILABLE,                        ///< the fabric path is refused for this group (reason given)
    AuthFailed = TPF_AUTH_FAILED,                         ///< a peer did not prove the cluster key
    QpError = TPF_QP_ERROR,                               ///< a queue pair went to error or could not be brought up
    RegistrationFailed = TPF_REGISTRATION_FAILED,         ///< memory registration (ibv_reg_mr, cudaHostRegister) failed
    CudaError = TPF_CUDA_ERROR,                           ///< a CUDA call failed
    NcclError = TPF_NCCL_ERROR,                           ///< an NCCL call failed
    ConfigError = TPF_CONFIG_ERROR,                       ///< bad configuration: a config key or a TPF_* variable
    DaemonUnreachable = TPF_DAEMON_UNREACHABLE,           ///< no daemon answers on the socket
    GroupMismatch = TPF_GROUP_MISMATCH,                   ///< ranks of one group disagree (world, duplicate rank; a call's size, dtype, op or counts)
    PermissionDenied = TPF_PERMISSION_DENIED,             ///< the caller may not do this (uid, group membership)
    Closed = TPF_CLOSED,                                  ///< the group or connection is closed
    ProbeFailed = TPF_PROBE_FAILED,                       ///< the load-time probe disagreed with the reference
    SystemError = TPF_SYSTEM_ERROR,                       ///< an OS call failed (errno in the detail)
    InvalidArgument = TPF_INVALID_ARGUMENT,               ///< an API argument is null or not accepted
    Busy = TPF_BUSY,                                      ///< the daemon is full: daemon.max_clients, or this uid's share
};
/// The largest value assigned; errcFromWire refuses anything above it.
inline constexpr Errc kLastErrc = Errc::Busy;

/// Stable identifier, as printed in logs and JSON ("PeerLost").
constexpr std::string_view errcName(Errc e) noexcept {
    switch (e) {
    case Errc::Ok: return "Ok";
    case Errc::Unsupported: return "Unsupported";
    case Errc::Misaligned: return "Misaligned";
    case Errc::Timeout: return "Timeout";
    case Errc::PeerLost: return "PeerLost";
    case Errc::DaemonLost: return "DaemonLost";
    case Errc::Aborted: return "Aborted";
    case Errc::CapMismatch: return "CapMismatch";
    case Errc::NonOneToOnePairing: return "NonOneToOnePairing";
    case Errc::BadMessage: return "BadMessage";
    case Errc::VersionMismatch: return "VersionMismatch";
    case Errc::BadMagic: return "BadMagic";
    case Errc::Truncated: return "Truncated";
    case Errc::TooLarge: return "TooLarge";
    case Errc::OutOfRange: return "OutOfRange";
    case Errc::Unavailable: return "Unavailable";
    case Errc::AuthFailed: return "AuthFailed";
    case Errc::QpError: return "QpError";
    case Errc::RegistrationFailed: return "RegistrationFailed";
    case Errc::CudaError: return "CudaError";
    case Errc::NcclError: return "NcclError";
    case Errc::ConfigError: return "ConfigError";
    case Errc::DaemonUnreachable: return "DaemonUnreachable";
    case Errc::GroupMismatch: return "GroupMismatch";
    case Errc::PermissionDenied: return "PermissionDenied";
    case Errc::Closed: return "Closed";
    case Errc::ProbeFailed: return "ProbeFailed";
    case Errc::SystemError: return "SystemError";
    case Errc::InvalidArgument: return "InvalidArgument";
    case Errc::Busy: return "Busy";
    }
    return "Unknown";
}

/// What an operator should understand and do, one sentence.
constexpr std::string_view errcMessage(Errc e) noexcept {
    switch (e) {
    case Errc::Ok: return "success";
    case Errc::Unsupported: return "not supported by this build or machine; the call goes to NCCL or must be avoided";
    case Errc::Misaligned: return "a buffer address is not 16-byte aligned as the API requires (sizes need no alignment); align the buffer";
    case Errc::Timeout: return "a peer did not deliver within the timeout; check that every rank reached the same call";
    case Errc::PeerLost: return "a rank of the group or its node died; reopen the group";
    case Errc::DaemonLost: return "the local tpfabricd went away; restart it (systemctl restart tpfabricd) and reopen";
    case Errc::Aborted: return "a rank aborted the group; reopen it";
    case Errc::CapMismatch: return "size exceeds the group's agreed cap; use NCCL for it or open with a larger maxBytes";
    case Errc::NonOneToOnePairing: return "HCAs of two nodes do not pair one to one by subnet; fix the HCA selection (config hcas, TPF_HCA)";
    case Errc::BadMessage: return "malformed message refused; the sender runs a broken or foreign client";
    case Errc::VersionMismatch: return "protocol version not accepted; run the same tpfabric release on both ends";
    case Errc::BadMagic: return "wrong magic: not a tpfabric peer, or a record layout from another release";
    case Errc::Truncated: return "message shorter than its header or counts say";
    case Errc::TooLarge: return "message length above the protocol maximum";
    case Errc::OutOfRange: return "a rank, world, count or index is outside its allowed range";
    case Errc::Unavailable: return "the fabric path is unavailable for this group (see the reason); a device group over an NCCL communicator falls back to NCCL, any other open fails";
    case Errc::AuthFailed: return "peer did not prove the cluster key; give both daemons the same key file";
    case Errc::QpError: return "an RDMA queue pair failed; check link state and GIDs (tpfabricctl status)";
    case Errc::RegistrationFailed: return "memory registration failed; check LimitMEMLOCK and free memory";
    case Errc::CudaError: return "a CUDA call failed; see the log line for the call and site";
    case Errc::NcclError: return "an NCCL call failed; see the log line for the call and site";
    case Errc::ConfigError: return "bad configuration (a tpfabricd.conf key or a TPF_* variable); the detail names it and its accepted values";
    case Errc::DaemonUnreachable: return "tpfabricd does not answer on its socket; start it (systemctl start tpfabricd) or fix the socket path";
    case Errc::GroupMismatch: return "ranks of one group disagree: on world size or rank numbers at open, or on a call's size, dtype, op or counts; the detail names the rank";
    case Errc::PermissionDenied: return "not permitted; join the group first, or run as root for changing commands";
    case Errc::Closed: return "the group or connection is closed";
    case Errc::ProbeFailed: return "load-time probe disagreed with the NCCL reference; the fabric path is disabled";
    case Errc::SystemError: return "an operating-system call failed; see the detail for errno";
    case Errc::InvalidArgument: return "an argument of the call is null or not accepted; see the detail for which";
    case Errc::Busy: return "tpfabricd serves as many clients as it allows (daemon.max_clients, daemon.max_clients_per_uid); retry, or find who holds the connections (tpfabricctl status)";
    }
    return "unknown error";
}

/// Errc from its wire value, refusing values this release does not know.
constexpr bool errcFromWire(std::uint32_t v, Errc& out) noexcept {
    if (v > static_cast<std::uint32_t>(kLastErrc)) return false;
    out = static_cast<Errc>(v);
    return true;
}

/// A failure: its name plus what exactly failed (which field, which peer).
struct Error {
    Errc code = Errc::Ok;
    std::string detail;

    /// "PeerLost: rank 3 closed its connection"
    std::string describe() const {
        std::string s(errcName(code));
        s += ": ";
        s += detail.empty() ? std::string(errcMessage(code)) : detail;
        return s;
    }
};

/// Thrown by Result::value() (and `*`, `->`) when the Result holds a failure:
/// code that skipped the check learns which failure it skipped
/// ("tpf::Result holds no value: SystemError: bootstrap: bind ...").
class BadResultAccess : public std::logic_error {
public:
    explicit BadResultAccess(const Error& e) : std::logic_error("tpf::Result holds no value: " + e.describe()), error_(e) {}
    const Error& error() const noexcept { return error_; }

private:
    Error error_;
};

/// Value or named failure. Exceptions are kept for start-up and config, and
/// for value() on a failure (BadResultAccess).
template <class T>
class [[nodiscard]] Result {
public:
    Result(T v) : v_(std::move(v)) {}
    Result(Error e) : v_(std::move(e)) {}
    Result(Errc c, std::string detail = {}) : v_(Error{c, std::move(detail)}) {}

    bool ok() const noexcept { return v_.index() == 0; }
    explicit operator bool() const noexcept { return ok(); }
    T& value() & { return checked(), std::get<0>(v_); }
    const T& value() const& { return checked(), std::get<0>(v_); }
    T&& value() && { return checked(), std::get<0>(std::move(v_)); }
    T* operator->() { return &value(); }
    const T* operator->() const { return &value(); }
    T& operator*() & { return value(); }
    const T& operator*() const& { return value(); }
    const Error& error() const& { return std::get<1>(v_); }
    Errc code() const noexcept { return ok() ? Errc::Ok : std::get<1>(v_).code; }

private:
    void checked() const {
        if (v_.index() != 0) throw BadResultAccess(std::get<1>(v_));
    }
    std::variant<T, Error> v_;
};

/// Result of an action with no value.
struct Unit {};
using Status = Result<Unit>;
inline Status okStatus() { return Unit{}; }

} // namespace tpf
