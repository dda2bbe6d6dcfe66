// `tpfabricctl status` without --json: the daemon's status document
// (docs/status.md) as a header block and tables for operators.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>

namespace tpf::ctl {

/// The status_version this tpfabricctl was written against; a document of a
/// newer version still prints, with a note that --json shows everything.
inline constexpr std::int64_t kKnownStatusVersion = 2;

/// Write `doc` for a human: header (version, pid, uptime, node id, socket,
/// config source, proxy), then HCAs, peers, groups each with its ranks,
/// regions and clients. Made for documents of any daemon release: a field
/// that is absent, null or of an unexpected type prints as "-", fields it
/// does not know are left out, and no JSON value makes it throw. Control
/// characters in daemon strings print as '?', so each row stays one line.
void printStatus(const nlohmann::ordered_json& doc, std::ostream& out);

/// "12.5s", "4m 05s", "3h 02m 07s", "2d 03h 04m"; "-" for negative or not finite.
std::string formatUptime(double seconds);

/// Link speed from Mb/s: "100 Mb/s", "25 Gb/s", "2.5 Gb/s".
std::string formatSpeed(std::uint64_t mbps);

/// Byte count rounded for reading: "512B", "7.8MiB", "1.0GiB" (binary units).
std::string formatBytesApprox(std::uint64_t bytes);

} // namespace tpf::ctl
