// Rank processes: start W of them, collect their reports over pipes, reap them.
#include "bench/launch.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <ctime>
#include <algorithm>
#include <map>
#include <stdexcept>
#include <thread>

#include "bench/bench.hpp"

namespace tpf::bench {

std::uint64_t nowNs() {
    timespec ts;
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return std::uint64_t(ts.tv_sec) * 1000000000ull + std::uint64_t(ts.tv_nsec);
}

std::string selfExe() {
    char buf[4096];
    const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) throw std::runtime_error("cannot read /proc/self/exe");
    return std::string(buf, std::size_t(n));
}

unsigned onlineCpus() {
    const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? unsigned(n) : 1;
}

pid_t spawnSelf(const std::vector<std::string>& args, const std::vector<int>& passFds) {
    const std::string exe = selfExe();
    std::vector<char*> argv{const_cast<char*>(exe.c_str())};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
    if (pid == 0) {
        // Out of the way of 3, 4, ... first, then into place (dup2 clears close-on-exec).
        std::vector<int> high;
        for (int fd : passFds) {
            high.push_back(::fcntl(fd, F_DUPFD_CLOEXEC, 64));
            if (high.back() < 0) std::_Exit(127);
        }
        for (std::size_t i = 0; i < high.size(); ++i)
            if (::dup2(high[i], 3 + int(i)) < 0) std::_Exit(127);
        ::execv(argv[0], argv.data());
        std::_Exit(127);
    }
    return pid;
}

pid_t spawnSelf(const std::vector<std::string>& args, int passFd) {
    return spawnSelf(args, passFd >= 0 ? std::vector<int>{passFd} : std::vector<int>{});
}

std::uint16_t freeLoopbackPort() {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
        throw std::runtime_error(std::string("no free loopback port: ") + std::strerror(errno));
    ::close(fd);
    return ntohs(a.sin_port);
}

std::string joinSizes(const std::vector<std::uint64_t>& sizes) {
    std::string s;
    for (auto v : sizes) s += (s.empty() ? "" : ",") + std::to_string(v);
    return s;
}

namespace {

void killAll(WorldRun& run) {
    releaseWorld(run);
    for (pid_t p : run.pids) ::kill(p, SIGKILL);
    for (pid_t p : run.pids) ::waitpid(p, nullptr, 0);
}

std::string opList(const std::vector<Op>& ops) {
    std::string s;
    for (Op o : ops) s += std::string(s.empty() ? "" : ",") + opKey(o);
    return s;
}

} // namespace

WorldRun runWorld(const RankPlan& plan, std::uint32_t deadlineS, bool holdUntilRelease) {
    WorldRun run;
    run.world = plan.world;
    std::vector<int> fds;
    std::vector<std::string> bufs(plan.world);
    for (std::uint32_t r = 0; r < plan.world; ++r) {
        int p[2], rel[2] = {-1, -1};
        if (::pipe2(p, O_CLOEXEC) != 0 || (holdUntilRelease && ::pipe2(rel, O_CLOEXEC) != 0))
            throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
        std::vector<std::string> args{"rank", "--socket", plan.sockets[r % plan.sockets.size()], "--bootstrap", plan.bootstrap, "--rank",
                                      std::to_string(r), "--world", std::to_string(plan.world), "--sizes",
                                      joinSizes(plan.sizes), "--ops", opList(plan.ops), "--iters",
                                      std::to_string(plan.iters), "--warmup", std::to_string(plan.warmup),
                                      "--point-ms", std::to_string(plan.pointMs), "--min-iters", std::to_string(plan.minIters),
                                      "--timeout-ms", std::to_string(plan.timeoutMs), "--spin-us",
                                      std::to_string(plan.spinUs), "--hold-ms", std::to_string(plan.holdMs),
                                      "--opens", std::to_string(plan.opens), "--report-fd", "3"};
        if (holdUntilRelease) {
            args.insert(args.end(), {"--release-fd", "4"});
            run.pids.push_back(spawnSelf(args, {p[1], rel[0]}));
            ::close(rel[0]);
            run.releaseFds.push_back(rel[1]);
        } else {
            run.pids.push_back(spawnSelf(args, p[1]));
        }
        ::close(p[1]);
        fds.push_back(p[0]);
    }
    // Read every report to EOF (a rank closes its pipe before holding).
    const std::uint64_t deadline = nowNs() + std::uint64_t(deadlineS) * 1000000000ull;
    std::size_t open = fds.size();
    while (open) {
        std::vector<pollfd> pfds;
        std::vector<std::uint32_t> who;
        for (std::uint32_t r = 0; r < fds.size(); ++r)
            if (fds[r] >= 0) {
                pfds.push_back({fds[r], POLLIN, 0});
                who.push_back(r);
            }
        const int n = ::poll(pfds.data(), pfds.size(), 200);
        if (n < 0 && errno != EINTR) throw std::runtime_error(std::string("poll: ") + std::strerror(errno));
        for (std::size_t i = 0; n > 0 && i < pfds.size(); ++i) {
            if (!pfds[i].revents) continue;
            char buf[65536];
            const ssize_t got = ::read(pfds[i].fd, buf, sizeof buf);
            if (got > 0) bufs[who[i]].append(buf, std::size_t(got));
            else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
                ::close(std::exchange(fds[who[i]], -1));
                --open;
            }
        }
        if (open && nowNs() > deadline) {
            for (int fd : fds)
                if (fd >= 0) ::close(fd);
            killAll(run);
            throw std::runtime_error("W=" + std::to_string(plan.world) + ": ranks did not report within " +
                                     std::to_string(deadlineS) + " s (raise --deadline-s or lower --iters)");
        }
    }
    std::string errors;
    for (std::uint32_t r = 0; r < plan.world; ++r) {
        auto j = nlohmann::json::parse(bufs[r], nullptr, false);
        if (j.is_discarded() || !j.is_object()) errors += "\n  rank " + std::to_string(r) + ": exited without a report (crashed or killed?)";
        else if (j.contains("error")) errors += "\n  rank " + std::to_string(r) + ": " + j["error"].get<std::string>();
        run.reports.push_back(std::move(j));
    }
    if (!errors.empty()) {
        killAll(run);
        throw std::runtime_error("W=" + std::to_string(plan.world) + " failed:" + errors);
    }
    return run;
}

void releaseWorld(WorldRun& run) {
    for (int fd : run.releaseFds) ::close(fd);
    run.releaseFds.clear();
}

void reapWorld(WorldRun& run, std::uint32_t timeoutMs) {
    releaseWorld(run);
    const std::uint64_t deadline = nowNs() + std::uint64_t(timeoutMs) * 1000000ull;
    std::map<pid_t, int> status;
    while (status.size() < run.pids.size()) {
        for (pid_t p : run.pids) {
            int st;
            if (!status.count(p) && ::waitpid(p, &st, WNOHANG) == p) status[p] = st;
        }
        if (status.size() == run.pids.size()) break;
        if (nowNs() > deadline) {
            for (pid_t p : run.pids)
                if (!status.count(p)) ::kill(p, SIGKILL);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    for (std::uint32_t r = 0; r < run.pids.size(); ++r) {
        const int st = status[run.pids[r]];
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            throw std::runtime_error("W=" + std::to_string(run.world) + " rank " + std::to_string(r) + " ended with " +
                                     (WIFEXITED(st) ? "exit status " + std::to_string(WEXITSTATUS(st))
                                                    : "signal " + std::to_string(WTERMSIG(st))));
    }
}

std::vector<Point> poolReports(const WorldRun& run) {
    std::vector<Point> pooled;
    for (const auto& rep : run.reports) {
        std::size_t i = 0;
        for (const auto& p : rep.at("points")) {
            if (pooled.size() <= i) pooled.push_back(Point{opOfKey(p.at("op").get<std::string>()), p.at("size").get<std::uint64_t>(), {}});
            const auto ns = p.at("ns").get<std::vector<std::uint64_t>>();
            pooled[i].ns.insert(pooled[i].ns.end(), ns.begin(), ns.end());
            ++i;
        }
    }
    return pooled;
}

std::vector<std::uint64_t> openTimes(const WorldRun& run) {
    std::vector<std::uint64_t> slowest;
    for (const auto& rep : run.reports) {
        const auto ns = rep.value("open_ns", std::vector<std::uint64_t>{});
        if (slowest.size() < ns.size()) slowest.resize(ns.size(), 0);
        for (std::size_t i = 0; i < ns.size(); ++i) slowest[i] = std::max(slowest[i], ns[i]);
    }
    return slowest;
}

} // namespace tpf::bench
