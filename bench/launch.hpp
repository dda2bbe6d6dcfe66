// Starting helper processes of tpf-bench: fork + exec of this binary.
#pragma once

#include <cstdint>
#include <string>
#include <sys/types.h>
#include <vector>

namespace tpf::bench {

/// fork + exec this binary with `args` (argv[1..]); passFds[i] becomes the
/// child's fd 3 + i, every other descriptor of ours is close-on-exec.
/// Throws on fork failure.
pid_t spawnSelf(const std::vector<std::string>& args, const std::vector<int>& passFds);
/// The same with one fd (>= 0) as fd 3, or none (-1).
pid_t spawnSelf(const std::vector<std::string>& args, int passFd);

/// A free loopback TCP port (bound to 0 and released).
std::uint16_t freeLoopbackPort();

/// "64,4096,..." (plain bytes, for a child's command line).
std::string joinSizes(const std::vector<std::uint64_t>& sizes);

} // namespace tpf::bench
