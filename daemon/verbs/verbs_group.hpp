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
/// When another node's daemon restarts, the group goes on with a new
/// VerbsGroup that shares the registrations and the other nodes' links with
/// this one and has new links to that node (Negotiation::takeRejoin).
struct VerbsGroup {
    std::uint32_t world = 0;
    std::uint32_t hcas = 0;                    ///< HCAs of this node = rails = the layout's stripes
    std::vector<std::shared_ptr<VerbsMr>> mrs; ///< by mrIndex(rank, hca); local ranks only
    QpTable<std::shared_ptr<QpLink>> links;    ///< lanes are rails; null where the remote rank is on this node

    std::size_t mrIndex(std::uint32_t rank, std::uint32_t hca) const { return std::size_t(rank) * hcas + hca; }
    VerbsMr* mr(std::uint32_t rank, std::uint32_t hca) const { return mrs[mrIndex(rank, hca)].get(); }
    QpLink* link(std::uint32_t local, std::uint32_t remote, std::uint32_t rail) const {
        return links.at(local, remote, rail).get();
    }
    /// Link `l` is this group's alone: no later VerbsGroup shares it.
    static bool own(const std::shared_ptr<QpLink>& l) { return l && l.use_count() == 1; }
    /// Work requests still posted on a link this group alone holds (proxy
    /// thread): a retired group waits for them (the shared ones are the
    /// later group's).
    bool busy() const {
        for (const auto& l : links)
            if (own(l) && l->gate.wrs()) return true;
        return false;
    }
};

} // namespace tpf::daemon
