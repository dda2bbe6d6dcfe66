#include "harness.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>

#include "common/shm.hpp"
#include "common/unix_socket.hpp"
#include "proto/client_msg.hpp"

namespace tpf::testing {

std::string envPath(const char* name) {
    const char* v = std::getenv(name);
    if (!v || !*v) throw std::runtime_error(std::string("environment variable ") + name + " is not set (run through meson test)");
    return v;
}

std::uint16_t freePort() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);
    return ntohs(a.sin_port);
}

Child spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
    Child c;
    c.pid = ::fork();
    if (c.pid == 0) {
        ::dup2(p[1], 1);
        for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
        std::vector<char*> args;
        for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
        args.push_back(nullptr);
        ::execv(args[0], args.data());
        std::_Exit(127);
    }
    ::close(p[1]);
    c.out = p[0];
    ::fcntl(c.out, F_SETFL, O_NONBLOCK);
    return c;
}

void readOutput(Child& c) {
    char buf[4096];
    ssize_t n;
    while (c.out >= 0 && (n = ::read(c.out, buf, sizeof buf)) > 0) c.output.append(buf, std::size_t(n));
}

bool waitForOutput(Child& c, const std::string& needle, int timeoutMs) {
    const std::uint64_t deadline = monotonicNs() + std::uint64_t(timeoutMs) * 1000000ull;
    for (;;) {
        readOutput(c);
        if (c.output.find(needle) != std::string::npos) return true;
        if (c.out < 0 || monotonicNs() > deadline) return false;
        int st;
        if (!c.reaped && ::waitpid(c.pid, &st, WNOHANG) == c.pid) {
            c.status = st;
            c.reaped = true;
            c.endedNs = monotonicNs();
            readOutput(c);
            return c.output.find(needle) != std::string::npos;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
}

bool waitAll(std::vector<Child*> children, int timeoutMs) {
    const std::uint64_t deadline = monotonicNs() + std::uint64_t(timeoutMs) * 1000000ull;
    bool clean = true;
    for (;;) {
        bool all = true;
        for (Child* c : children) {
            readOutput(*c);
            if (c->reaped) continue;
            int st;
            if (::waitpid(c->pid, &st, WNOHANG) == c->pid) {
                c->status = st;
                c->reaped = true;
                c->endedNs = monotonicNs();
                readOutput(*c);
            } else {
                all = false;
            }
        }
        if (all) break;
        if (monotonicNs() > deadline) {
            clean = false;
            for (Child* c : children)
                if (!c->reaped) ::kill(c->pid, SIGKILL);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    for (Child* c : children)
        if (c->out >= 0) ::close(std::exchange(c->out, -1));
    return clean;
}

int exitCode(const Child& c) {
    if (WIFEXITED(c.status)) return WEXITSTATUS(c.status);
    if (WIFSIGNALED(c.status)) return 128 + WTERMSIG(c.status);
    return -1;
}

Daemon::Daemon(std::vector<std::string> extraArgs) : extraArgs_(std::move(extraArgs)) {
    char tmpl[] = "/tmp/tpf-it-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    socket_ = dir_ + "/tpfabricd.sock";
    start();
}

void Daemon::start() {
    stopped_ = false;
    std::vector<std::string> argv{envPath("TPF_DAEMON"), "--socket", socket_, "--foreground", "--log-level", "info"};
    argv.insert(argv.end(), extraArgs_.begin(), extraArgs_.end());
    // The daemon logs to stderr: keep it in a file for failing tests (appended across restarts).
    const int logFd = ::open((dir_ + "/daemon.log").c_str(), O_CREAT | O_WRONLY | O_APPEND | O_CLOEXEC, 0644);
    const int saved = ::fcntl(2, F_DUPFD_CLOEXEC, 0); // not inherited by the daemon
    ::dup2(logFd, 2);
    child_ = spawn(argv);
    ::dup2(saved, 2);
    ::close(saved);
    ::close(logFd);
    for (int i = 0; i < 500; ++i) {
        if (connectUnix(socket_)) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    throw std::runtime_error("tpfabricd did not listen on " + socket_ + ": " + log());
}

Daemon::~Daemon() {
    if (!stopped_) stop();
    std::string cmd = "rm -rf '" + dir_ + "'";
    [[maybe_unused]] int r = std::system(cmd.c_str());
}

int Daemon::stop() {
    stopped_ = true;
    if (!child_.reaped) {
        ::kill(child_.pid, SIGTERM);
        waitAll({&child_}, 10000);
    }
    return exitCode(child_);
}

void Daemon::signal(int sig) {
    if (child_.reaped) return;
    ::kill(child_.pid, sig);
    if (sig == SIGKILL) {
        stopped_ = true;
        waitAll({&child_}, 10000);
    }
}

void Daemon::restart() {
    if (!stopped_) stop();
    start();
}

void Daemon::restart(std::vector<std::string> extraArgs) {
    if (!stopped_) stop();
    extraArgs_ = std::move(extraArgs);
    start();
}

std::string Daemon::log() {
    std::ifstream f(dir_ + "/daemon.log");
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

RankRun startRanks(const Daemon& d, std::uint32_t world, const std::vector<std::string>& common,
                   const std::map<std::uint32_t, std::vector<std::string>>& perRank,
                   const std::map<std::string, std::string>& env) {
    RankRun run;
    const std::string boot = "127.0.0.1:" + std::to_string(freePort());
    for (std::uint32_t r = 0; r < world; ++r) {
        std::vector<std::string> argv{envPath("TPF_TESTRANK"), "--socket", d.socket(), "--bootstrap", boot,
                                      "--rank", std::to_string(r), "--world", std::to_string(world)};
        argv.insert(argv.end(), common.begin(), common.end());
        if (auto it = perRank.find(r); it != perRank.end()) argv.insert(argv.end(), it->second.begin(), it->second.end());
        run.ranks.push_back(spawn(argv, env));
    }
    return run;
}

RankRun::~RankRun() {
    for (Child& c : ranks) {
        if (!c.reaped && c.pid > 0) {
            ::kill(c.pid, SIGKILL);
            ::waitpid(c.pid, nullptr, 0);
        }
        if (c.out >= 0) ::close(std::exchange(c.out, -1));
    }
}

std::string RankRun::line(std::uint32_t r) const {
    const std::string& out = ranks[r].output;
    const auto at = out.rfind("RESULT");
    if (at == std::string::npos) return "(no RESULT line; output: " + out + ")";
    return out.substr(at, out.find('\n', at) - at);
}

std::string statusJson(const std::string& socket) {
    using namespace client_proto;
    auto fd = connectUnix(socket);
    if (!fd) throw std::runtime_error(fd.error().describe());
    if (!sendMessage(fd->get(), encode(kHello, 1, Hello{kRoleControl, 0, 0}), {}, 2000)) throw std::runtime_error("send");
    auto h = receiveMessage(fd->get(), kReplySpec, 2000);
    if (!h || h->header.opcode != kHelloReply) throw std::runtime_error("no HelloReply");
    if (!sendMessage(fd->get(), encode(kStatusRequest, 2, StatusRequest{}), {}, 2000)) throw std::runtime_error("send");
    auto m = receiveMessage(fd->get(), kReplySpec, 5000);
    if (!m || m->header.opcode != kStatusReply) throw std::runtime_error("no StatusReply");
    return std::string(m->payload.begin(), m->payload.end());
}

} // namespace tpf::testing
