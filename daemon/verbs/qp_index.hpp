// The one numbering of a group's queue pairs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tpf::daemon {

/// One RC queue pair per (local rank, remote rank, lane). A lane is one of
/// this node's HCAs while the QPs are created and advertised (before
/// pairing), and one rail, an HCA pair, once they are connected. Pairing
/// takes every HCA one to one, so a node has as many rails as HCAs and one
/// numbering serves both; what a table's lanes mean is in its name.
class QpIndex {
public:
    QpIndex() = default;
    QpIndex(std::uint32_t world, std::uint32_t lanes) : world_(world), lanes_(lanes) {}

    std::size_t operator()(std::uint32_t local, std::uint32_t remote, std::uint32_t lane) const {
        return (std::size_t(local) * world_ + remote) * lanes_ + lane;
    }
    std::size_t size() const { return std::size_t(world_) * world_ * lanes_; }
    std::uint32_t world() const { return world_; }
    std::uint32_t lanes() const { return lanes_; }

private:
    std::uint32_t world_ = 0;
    std::uint32_t lanes_ = 0;
};

/// Items numbered by a QpIndex (queue pairs by HCA or by rail); every slot
/// exists, empty (a default T) where the remote rank is on this node.
template <class T>
class QpTable {
public:
    QpTable() = default;
    QpTable(std::uint32_t world, std::uint32_t lanes) : index_(world, lanes), items_(index_.size()) {}

    T& at(std::uint32_t local, std::uint32_t remote, std::uint32_t lane) { return items_[index_(local, remote, lane)]; }
    const T& at(std::uint32_t local, std::uint32_t remote, std::uint32_t lane) const {
        return items_[index_(local, remote, lane)];
    }
    std::uint32_t lanes() const { return index_.lanes(); }
    void clear() {
        items_.clear();
        index_ = {};
    }
    auto begin() { return items_.begin(); }
    auto end() { return items_.end(); }
    auto begin() const { return items_.begin(); }
    auto end() const { return items_.end(); }

private:
    QpIndex index_;
    std::vector<T> items_;
};

} // namespace tpf::daemon
