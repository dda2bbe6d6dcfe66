// The control socket's requests, decoded, validated and handed on: the one
// place that decides what a client's message may do. Connection (server.cpp)
// runs it over its socket; fuzz/fuzz_client_msg.cpp runs the same code on
// fuzzed bytes, without a socket, so the two cannot drift apart.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <tpfabric/error.hpp>

#include "common/fd.hpp"
#include "proto/client_msg.hpp"

namespace tpf::daemon {

/// What a client's requests can do, as ControlDispatch asks for it.
class ControlRequests {
public:
    virtual ~ControlRequests() = default;
    /// Queue one encoded reply.
    virtual void reply(Bytes message) = 0;
    /// Refuse the client: an ErrorReply naming the failure, a log line, the
    /// connection closed once that is written. Nothing more is dispatched.
    virtual void refuse(Errc code, const std::string& why) = 0;
    /// Close once the replies are written (the client said Close).
    virtual void finish() = 0;
    virtual client_proto::HelloReply helloReply() = 0;
    /// Why a client whose Hello says `role` is refused Busy, "" when it is
    /// served (a connection admitted over daemon.max_clients serves only
    /// control clients: tpfabricctl still reads a full daemon's status).
    virtual std::string busyFor(std::uint32_t role) { (void)role; return {}; }
    virtual client_proto::NodeCard nodeCard() = 0;
    virtual std::string statusJson() = 0;
    /// The group table, on behalf of this client.
    virtual void join(const client_proto::GroupOpen& m) = 0;
    virtual void leave() = 0; ///< in order (Close)
    virtual void abort() = 0;
    virtual void openReport(const client_proto::OpenReport& m) = 0;
    virtual Status shareRegion(const client_proto::ShareRegion& m, int fd) = 0;
    virtual Status deviceAttach(const client_proto::DeviceAttach& m) = 0;
    /// A rank asks this (restarted) daemon to re-adopt its group, handing
    /// back its region and ring; the answer (Adopted) comes later.
    virtual void adopt(const client_proto::Adopt& m, UniqueFd region, UniqueFd ring) = 0;
    /// The connection closed meanwhile (a client that never reads its replies).
    virtual bool closed() const = 0;
};

/// One client's session: framing (decodeHeader, kRequestSpec), then by
/// opcode the record's decoder and the rules of who may send what: Hello
/// first and once; GroupOpen, OpenReport, ShareRegion and DeviceAttach from
/// ranks only; Abort, ShareRegion and DeviceAttach inside a group; fds with
/// ShareRegion only, exactly one.
class ControlDispatch {
public:
    explicit ControlDispatch(ControlRequests& to) : to_(to) {}

    /// Dispatch every whole message at the front of `in`, in order, with the
    /// fds received so far (ShareRegion takes one; any other message with
    /// fds is refused). Stops at the first message that ends the session
    /// (refused, Close, or the connection closed). Returns the bytes used;
    /// the rest is the start of a message still incomplete.
    std::size_t feed(ByteView in, std::vector<UniqueFd>& fds);
    /// The session ended: dispatch nothing more.
    bool ended() const { return ended_; }
    /// The client is in a group (its GroupOpen was not refused, no Close yet).
    bool inGroup() const { return inGroup_; }
    /// The group table refused the client's open: it is in no group.
    void groupRefused() { inGroup_ = false; }
    /// The connection dropped: it is in no group any more.
    void dropped() { inGroup_ = false; }

private:
    /// One message; false when it ends the session.
    bool handle(const MsgHeader& h, ByteView payload, std::vector<UniqueFd>& fds);
    bool refuse(Errc code, const std::string& why);
    bool handleAdopt(ByteView payload, std::vector<UniqueFd>& fds);

    ControlRequests& to_;
    std::uint32_t role_ = 0; ///< 0 until Hello
    bool inGroup_ = false;
    bool reported_ = false; ///< sent its OpenReport (one per connection)
    bool ended_ = false;
};

} // namespace tpf::daemon
