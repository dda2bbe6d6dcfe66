/* tpfabric — status codes: the one numbering of every named failure.
 *
 * Shared by the C ABI (tpfabric.h: every function returns one of these) and
 * the C++ API (tpfabric/error.hpp: tpf::Errc has the same values). The values
 * also cross sockets and shared memory between libtpfabric and tpfabricd, so a
 * value, once assigned, never changes meaning; new codes are appended.
 * Names as strings and one-sentence messages: tpf_status_name() and
 * tpf_strerror() in tpfabric.h, tpf::errcName() / errcMessage() in C++. */
#ifndef TPFABRIC_ERRC_H
#define TPFABRIC_ERRC_H

enum tpf_status_code {
    TPF_OK = 0,                      /**< success */
    TPF_UNSUPPORTED = 1,             /**< feature or route not built in / not available here */
    TPF_MISALIGNED = 2,              /**< a buffer address violates the alignment rule */
    TPF_TIMEOUT = 3,                 /**< a bounded wait ran out; the detail names the missing rank */
    TPF_PEER_LOST = 4,               /**< a member of the group died or its node went away */
    TPF_DAEMON_LOST = 5,             /**< the local tpfabricd went away mid-call */
    TPF_ABORTED = 6,                 /**< some rank called abort */
    TPF_CAP_MISMATCH = 7,            /**< a size above the agreed cap */
    TPF_NON_ONE_TO_ONE_PAIRING = 8,  /**< HCAs of two nodes do not pair one to one by subnet */
    TPF_BAD_MESSAGE = 9,             /**< malformed record: length, count, field out of range */
    TPF_VERSION_MISMATCH = 10,       /**< protocol version outside the accepted range (daemon, or another rank's library) */
    TPF_BAD_MAGIC = 11,              /**< not our protocol, or another record layout */
    TPF_TRUNCATED = 12,              /**< fewer bytes than a header or count promises */
    TPF_TOO_LARGE = 13,              /**< a length above the protocol's maximum */
    TPF_OUT_OF_RANGE = 14,           /**< rank, world, stripe or slot outside its bounds */
    TPF_UNAVAILABLE = 15,            /**< the fabric path is refused for this group (reason given) */
    TPF_AUTH_FAILED = 16,            /**< a peer daemon did not prove the cluster key */
    TPF_QP_ERROR = 17,               /**< an RDMA queue pair failed or could not be brought up */
    TPF_REGISTRATION_FAILED = 18,    /**< memory registration failed */
    TPF_CUDA_ERROR = 19,             /**< a CUDA call failed */
    TPF_NCCL_ERROR = 20,             /**< an NCCL call failed */
    TPF_CONFIG_ERROR = 21,           /**< bad configuration: a config key or a TPF_* variable */
    TPF_DAEMON_UNREACHABLE = 22,     /**< no daemon answers on the socket */
    TPF_GROUP_MISMATCH = 23,         /**< ranks of one group disagree (world, duplicate rank; a call's size, dtype, op or counts) */
    TPF_PERMISSION_DENIED = 24,      /**< the caller may not do this */
    TPF_CLOSED = 25,                 /**< the group or connection is closed */
    TPF_PROBE_FAILED = 26,           /**< the load-time probe disagreed with the reference */
    TPF_SYSTEM_ERROR = 27,           /**< an operating-system call failed (errno in the detail) */
    TPF_INVALID_ARGUMENT = 28,       /**< an API argument is null or not accepted */
    TPF_BUSY = 29                    /**< tpfabricd serves as many clients as it allows (all, or this user's share) */
};

#endif /* TPFABRIC_ERRC_H */
