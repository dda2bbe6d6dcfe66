// tpfabric — framing shared by every socket protocol (client<->daemon Unix
// socket, daemon<->daemon TCP): a 16-byte header, then `length` payload bytes.
//
// Byte order: little-endian throughout; wire structs are copied as bytes, so
// the build refuses a big-endian host (static_assert below).
// Every record is a fixed-width, trivially copyable struct with explicit
// reserved fields, optionally followed by counted arrays of such structs.
// Decoders check every length, count and range and return a named error;
// they never assert and never read past the given bytes.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <tpfabric/error.hpp>

namespace tpf {

static_assert(std::endian::native == std::endian::little, "tpfabric wire format is little-endian");

using Bytes = std::vector<std::uint8_t>;
using ByteView = std::span<const std::uint8_t>;

constexpr std::uint32_t fourcc(char a, char b, char c, std::uint8_t rev) {
    return std::uint32_t(std::uint8_t(a)) | std::uint32_t(std::uint8_t(b)) << 8 |
           std::uint32_t(std::uint8_t(c)) << 16 | std::uint32_t(rev) << 24;
}

/// Starts every message on every socket. 16 bytes.
struct MsgHeader {
    std::uint32_t magic;   ///< protocol and record-layout revision (see kClientMagic, kPeerMagic)
    std::uint16_t version; ///< protocol version of the sender; receiver accepts a range
    std::uint16_t opcode;  ///< record type, per protocol
    std::uint32_t length;  ///< payload bytes after this header
    std::uint32_t seq;     ///< sender's sequence; replies echo the request's seq
};
static_assert(sizeof(MsgHeader) == 16);
static_assert(offsetof(MsgHeader, version) == 4);
static_assert(offsetof(MsgHeader, opcode) == 6);
static_assert(offsetof(MsgHeader, length) == 8);
static_assert(offsetof(MsgHeader, seq) == 12);
static_assert(std::is_trivially_copyable_v<MsgHeader>);

/// What one protocol accepts: its magic, version range, largest payload.
struct ProtocolSpec {
    std::string_view name;
    std::uint32_t magic;
    std::uint16_t minVersion;
    std::uint16_t maxVersion;
    std::uint32_t maxPayload;
};

/// Check a header against a protocol. Needs at least 16 bytes.
inline Result<MsgHeader> decodeHeader(ByteView in, const ProtocolSpec& spec) {
    if (in.size() < sizeof(MsgHeader))
        return {Errc::Truncated, std::string(spec.name) + " header: " + std::to_string(in.size()) +
                                     " of 16 bytes"};
    MsgHeader h;
    std::memcpy(&h, in.data(), sizeof h);
    if (h.magic != spec.magic) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "magic 0x%08x, expected 0x%08x", h.magic, spec.magic);
        return {Errc::BadMagic, std::string(spec.name) + ": " + buf};
    }
    if (h.version < spec.minVersion || h.version > spec.maxVersion)
        return {Errc::VersionMismatch, std::string(spec.name) + ": version " + std::to_string(h.version) +
                                           ", accepted " + std::to_string(spec.minVersion) + ".." +
                                           std::to_string(spec.maxVersion)};
    if (h.length > spec.maxPayload)
        return {Errc::TooLarge, std::string(spec.name) + ": payload of " + std::to_string(h.length) +
                                    " bytes, at most " + std::to_string(spec.maxPayload)};
    return h;
}

/// A whole message: its checked header and exactly `length` payload bytes.
struct Frame {
    MsgHeader header;
    ByteView payload;
};

/// Header check plus: the bytes given hold the whole payload (Truncated if not).
inline Result<Frame> decodeFrame(ByteView in, const ProtocolSpec& spec) {
    auto h = decodeHeader(in, spec);
    if (!h) return h.error();
    if (in.size() - sizeof(MsgHeader) < h->length)
        return {Errc::Truncated, std::string(spec.name) + ": header promises " + std::to_string(h->length) +
                                     " payload bytes, " + std::to_string(in.size() - sizeof(MsgHeader)) + " present"};
    return Frame{*h, in.subspan(sizeof(MsgHeader), h->length)};
}

inline Bytes encodeHeader(const ProtocolSpec& spec, std::uint16_t opcode, std::uint32_t seq,
                          std::uint32_t length) {
    MsgHeader h{spec.magic, spec.maxVersion, opcode, length, seq};
    Bytes out(sizeof h);
    std::memcpy(out.data(), &h, sizeof h);
    return out;
}

/// Appends trivially copyable records as bytes.
class Writer {
public:
    template <class T>
    Writer& put(const T& v) {
        static_assert(std::is_trivially_copyable_v<T>);
        auto p = reinterpret_cast<const std::uint8_t*>(&v);
        bytes_.insert(bytes_.end(), p, p + sizeof(T));
        return *this;
    }
    template <class T>
    Writer& putAll(std::span<const T> vs) {
        for (const auto& v : vs) put(v);
        return *this;
    }
    Writer& putRaw(ByteView v) {
        bytes_.insert(bytes_.end(), v.begin(), v.end());
        return *this;
    }
    const Bytes& bytes() const { return bytes_; }
    Bytes take() { return std::move(bytes_); }

private:
    Bytes bytes_;
};

/// Reads records from a payload; every read is bounds-checked.
class Reader {
public:
    explicit Reader(ByteView in, std::string_view what) : in_(in), what_(what) {}

    template <class T>
    Status get(T& out) {
        static_assert(std::is_trivially_copyable_v<T>);
        if (in_.size() - pos_ < sizeof(T))
            return {Errc::Truncated, std::string(what_) + ": " + std::to_string(in_.size()) +
                                         " payload bytes, needs at least " + std::to_string(pos_ + sizeof(T))};
        std::memcpy(&out, in_.data() + pos_, sizeof(T));
        pos_ += sizeof(T);
        return okStatus();
    }
    template <class T>
    Status getAll(std::vector<T>& out, std::size_t count) {
        // The count is checked against the bytes present before anything is allocated.
        if ((in_.size() - pos_) / sizeof(T) < count)
            return {Errc::Truncated, std::string(what_) + ": " + std::to_string(count) + " records of " +
                                         std::to_string(sizeof(T)) + " bytes do not fit in " +
                                         std::to_string(in_.size() - pos_) + " bytes"};
        out.resize(count);
        for (auto& v : out) {
            std::memcpy(&v, in_.data() + pos_, sizeof(T));
            pos_ += sizeof(T);
        }
        return okStatus();
    }
    /// The payload must be used up exactly: trailing bytes are refused.
    Status finish() const {
        if (pos_ != in_.size())
            return {Errc::BadMessage, std::string(what_) + ": " + std::to_string(in_.size() - pos_) +
                                          " unexpected trailing bytes"};
        return okStatus();
    }
    std::size_t remaining() const { return in_.size() - pos_; }
    ByteView rest() const { return in_.subspan(pos_); }

private:
    ByteView in_;
    std::size_t pos_ = 0;
    std::string_view what_;
};

/// One fixed-size record decoded from a whole payload: exactly its size,
/// then the record's own validate() (found beside its type: client_proto,
/// peer_proto).
template <class T>
inline Result<T> decodeFixed(ByteView payload, std::string_view what) {
    Reader r(payload, what);
    T rec;
    if (auto s = r.get(rec); !s) return s.error();
    if (auto s = r.finish(); !s) return s.error();
    if (auto s = validate(rec); !s) return s.error();
    return rec;
}

/// Fixed-size NUL-padded text field helpers (names, reasons).
template <std::size_t N>
inline void setText(char (&dst)[N], std::string_view s) {
    std::memset(dst, 0, N);
    std::memcpy(dst, s.data(), s.size() < N - 1 ? s.size() : N - 1);
}
/// Text of a field, refusing one without a terminating NUL (a foreign writer).
template <std::size_t N>
inline bool getText(const char (&src)[N], std::string& out) {
    const void* nul = std::memchr(src, 0, N);
    if (!nul) return false;
    out.assign(src, static_cast<const char*>(nul));
    return true;
}

} // namespace tpf
