// One group's verbs wire as the proxy posts on it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "daemon/verbs/qp.hpp"
#include "daemon/verbs/qp_index.hpp"

namespace tpf::daemon {

/// A group's local regions registered on every HCA of this node and one
/// connected QpLink per (local rank, remote rank, rail). Built and connected
/// by the group's negotiation on the control thread before the group opens;
/// afterwards only the proxy touches the links. Members are destroyed QPs
/// first, then the registrations (each keeps its region mapped until then).
struct VerbsGroup {
    std::uint32_t world = 0;
    std::uint32_t hcas = 0;                    ///< HCAs of this node = rails = the layout's stripes
    std::vector<std::unique_ptr<VerbsMr>> mrs; ///< by mrIndex(rank, hca); local ranks only
    QpTable<std::unique_ptr<QpLink>> links;    ///< lanes are rails; null where the remote rank is on this node

    std::size_t mrIndex(std::uint32_t rank, std::uint32_t hca) const { return std::size_t(rank) * hcas + hca; }
    VerbsMr* mr(std::uint32_t rank, std::uint32_t hca) const { return mrs[mrIndex(rank, hca)].get(); }
    QpLink* link(std::uint32_t local, std::uint32_t remote, std::uint32_t rail) const {
        return links.at(local, remote, rail).get();
    }
    /// Work requests still posted on any link (proxy thread).
    bool busy() const {
        for (const auto& l : links)
            if (l && l->gate.wrs()) return true;
        return false;
    }
};

} // namespace tpf::daemon
