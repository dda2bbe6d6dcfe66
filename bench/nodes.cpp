// Two nodes on one machine (--nodes 2): two tpfabricd with their own sockets
// and peer ports on loopback, and the check that their groups crossed over tcp.
#include <fstream>
#include <set>
#include <stdexcept>

#include "bench/bench.hpp"
#include "bench/launch.hpp"

namespace tpf::bench {

std::vector<StartedDaemon> startNodes(const std::string& exe, const std::string& dir, std::uint32_t nodes) {
    if (nodes == 1) return {startDaemon(exe, dir)};
    std::vector<StartedDaemon> started;
    try {
        for (std::uint32_t n = 0; n < nodes; ++n) {
            const std::string name = "node" + std::to_string(n), config = dir + "/" + name + ".toml";
            std::ofstream f(config);
            // The socket comes from --socket; a node id hashes it, so the two daemons are two nodes.
            f << "[peer]\nlisten = \"127.0.0.1\"\nport = " << freeLoopbackPort() << "\nwire = \"tcp\"\n";
            f.close();
            if (!f) throw std::runtime_error("cannot write " + config);
            started.push_back(startDaemon(exe, dir, name, config));
        }
    } catch (...) {
        for (auto& d : started) stopDaemon(d);
        throw;
    }
    return started;
}

std::string worldRoutes(const WorldRun& run, std::uint32_t nodes) {
    std::set<std::string> seen;
    for (std::uint32_t r = 0; r < run.reports.size(); ++r) {
        const auto routes = run.reports[r].value("routes", std::vector<std::string>{});
        for (std::uint32_t q = 0; q < routes.size(); ++q) {
            if (q == r) continue;
            seen.insert(routes[q]);
            if (nodes > 1 && r % nodes != q % nodes && routes[q] != "tcp")
                throw std::runtime_error(
                    "W=" + std::to_string(run.world) + ": rank " + std::to_string(r) + " (node " + std::to_string(r % nodes) +
                    ") reaches rank " + std::to_string(q) + " (node " + std::to_string(q % nodes) + ") over '" + routes[q] +
                    "', not the tcp wire; --nodes 2 measures the tcp wire: " +
                    (routes[q] == "shm" ? std::string("the two sockets lead to one daemon (one node); give two daemons")
                                        : std::string("give one of the daemons peer.wire = \"tcp\"")) +
                    " (or let tpf-bench start two: --daemon PATH)");
        }
    }
    std::string out;
    for (const auto& s : seen) out += (out.empty() ? "" : ", ") + s;
    return out.empty() ? "-" : out;
}

} // namespace tpf::bench
