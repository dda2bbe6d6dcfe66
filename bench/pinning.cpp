// The floors' two processes on two CPUs of different physical cores.
#include <sched.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench.hpp"

namespace tpf::bench {

namespace {

/// A number from a sysfs topology file of `cpu`, -1 when unreadable.
int topology(int cpu, const char* what) {
    std::ifstream f("/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/" + what);
    int v = -1;
    return (f >> v) ? v : -1;
}

/// Two CPUs this process may run on, of different physical cores (one package
/// preferred), or why there are none.
std::optional<std::pair<int, int>> twoCores(std::string& whyNot) {
    cpu_set_t allowed;
    if (::sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
        whyNot = std::string("sched_getaffinity: ") + std::strerror(errno);
        return std::nullopt;
    }
    std::vector<int> cpus;
    for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
    if (cpus.size() < 2) {
        whyNot = "fewer than 2 CPUs allowed";
        return std::nullopt;
    }
    const int a = cpus[0], coreA = topology(a, "core_id"), packageA = topology(a, "physical_package_id");
    if (coreA < 0 || packageA < 0) {
        whyNot = "no CPU topology in sysfs";
        return std::nullopt;
    }
    std::optional<int> otherPackage;
    for (std::size_t i = 1; i < cpus.size(); ++i) {
        const int core = topology(cpus[i], "core_id"), package = topology(cpus[i], "physical_package_id");
        if (package == packageA && core != coreA) return std::pair{a, cpus[i]};
        if (package != packageA && package >= 0 && !otherPackage) otherPackage = cpus[i];
    }
    if (otherPackage) return std::pair{a, *otherPackage};
    whyNot = "every allowed CPU is a thread of one physical core";
    return std::nullopt;
}

bool pinTo(int cpu) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    return ::sched_setaffinity(0, sizeof one, &one) == 0;
}

} // namespace

FloorPins::FloorPins() {
    haveBefore_ = ::sched_getaffinity(0, sizeof before_, &before_) == 0;
    std::string whyNot;
    const auto pair = haveBefore_ ? twoCores(whyNot) : std::nullopt;
    if (!haveBefore_) whyNot = std::string("sched_getaffinity: ") + std::strerror(errno);
    if (pair && !pinTo(pair->second)) whyNot = std::string("sched_setaffinity: ") + std::strerror(errno);
    else if (pair) {
        pinned_ = true;
        mine_ = pair->first;
        describe_ = "pinned to CPUs " + std::to_string(pair->first) + " and " + std::to_string(pair->second) +
                    " (two physical cores)";
    }
    if (!pinned_) describe_ = "not pinned (" + whyNot + ")";
}

void FloorPins::afterSpawn() {
    if (pinned_) pinTo(mine_);
}

FloorPins::~FloorPins() {
    if (pinned_) ::sched_setaffinity(0, sizeof before_, &before_);
}

} // namespace tpf::bench
