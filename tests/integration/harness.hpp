// Integration-test harness: the real tpfabricd on a temporary socket and real
// rank processes (tpf-testrank), started with fork/exec. Paths come from the
// environment Meson sets: TPF_DAEMON, TPF_TESTRANK, TPF_CTL.
#pragma once

#include <csignal>
#include <cstdint>
#include <map>
#include <string>
#include <sys/types.h>
#include <vector>

namespace tpf::testing {

std::string envPath(const char* name);

/// A free loopback TCP port (bound and released; good enough for tests).
std::uint16_t freePort();

/// A child process with its stdout captured.
struct Child {
    pid_t pid = -1;
    int out = -1;          ///< read end of its stdout
    std::string output;    ///< what it printed so far
    int status = -1;       ///< waitpid status once reaped
    std::uint64_t endedNs = 0;
    bool reaped = false;
};

Child spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {});
/// Reap every child (reading their output), killing all after timeoutMs. True if none had to be killed.
bool waitAll(std::vector<Child*> children, int timeoutMs);
int exitCode(const Child& c); ///< exit status, or 128+signal
/// Read what `c` printed so far (never blocks).
void readOutput(Child& c);
/// Wait until `c`'s output contains `needle` (or it exited); true if it does.
bool waitForOutput(Child& c, const std::string& needle, int timeoutMs);

/// The daemon on a fresh temporary socket.
class Daemon {
public:
    explicit Daemon(std::vector<std::string> extraArgs = {});
    ~Daemon();
    const std::string& socket() const { return socket_; }
    const std::string& dir() const { return dir_; }
    pid_t pid() const { return child_.pid; }
    /// SIGTERM and wait; returns the exit code.
    int stop();
    /// Send `sig`; SIGKILL also reaps it (socket file left behind, as after a crash).
    void signal(int sig);
    /// A new daemon on the same socket path (after stop() or signal(SIGKILL)).
    void restart();
    /// The same, the new daemon started with `extraArgs` instead (another config).
    void restart(std::vector<std::string> extraArgs);
    std::string log();

private:
    void start();
    std::vector<std::string> extraArgs_;
    std::string dir_, socket_;
    Child child_;
    bool stopped_ = false;
};

/// Ranks of one group as tpf-testrank processes; `common` args go to every
/// rank, `perRank` (rank -> args) to one.
struct RankRun {
    RankRun() = default;
    RankRun(RankRun&&) = default;
    RankRun& operator=(RankRun&&) = default;
    ~RankRun(); ///< SIGKILLs and reaps ranks still running, so a failed REQUIRE leaves no process behind
    std::vector<Child> ranks;
    std::string line(std::uint32_t r) const; ///< its RESULT line
};
RankRun startRanks(const Daemon& d, std::uint32_t world, const std::vector<std::string>& common,
                   const std::map<std::uint32_t, std::vector<std::string>>& perRank = {},
                   const std::map<std::string, std::string>& env = {});

/// One request on a fresh connection to the daemon: Hello (control) + StatusRequest; the JSON text.
std::string statusJson(const std::string& socket);

} // namespace tpf::testing
