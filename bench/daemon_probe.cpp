// The daemon as the control-plane columns see it: started by the bench
// (--daemon) or found behind the socket, its memory and CPU read from /proc.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "bench/bench.hpp"

namespace tpf::bench {

namespace {

std::string readText(const std::string& path) {
    std::ifstream f(path);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

// "VmRSS:    1234 kB" -> 1234; -1 when absent.
long statusKiB(const std::string& status, const char* key) {
    const std::size_t at = status.find(std::string("\n") + key + ":");
    if (at == std::string::npos) return -1;
    return std::strtol(status.c_str() + at + std::strlen(key) + 2, nullptr, 10);
}

} // namespace

StartedDaemon startDaemon(const std::string& exe, const std::string& dir, const std::string& name, const std::string& config) {
    StartedDaemon d;
    d.socket = dir + "/" + name + ".sock";
    d.log = dir + "/" + name + ".log";
    const int logFd = ::open(d.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (logFd < 0) throw std::runtime_error("cannot create " + d.log + ": " + std::strerror(errno));
    std::vector<std::string> args{exe, "--socket", d.socket, "--foreground", "--log-level", "warn"};
    if (!config.empty()) args.insert(args.end(), {"--config", config});
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    d.pid = ::fork();
    if (d.pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
    if (d.pid == 0) {
        ::dup2(logFd, 1);
        ::dup2(logFd, 2);
        ::execv(argv[0], argv.data());
        std::fprintf(stderr, "exec %s: %s\n", argv[0], std::strerror(errno));
        std::_Exit(127);
    }
    ::close(logFd);
    const std::uint64_t deadline = nowNs() + 10'000'000'000ull;
    for (;;) {
        struct stat st{};
        if (::stat(d.socket.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) return d;
        int status;
        if (::waitpid(d.pid, &status, WNOHANG) == d.pid || nowNs() > deadline) {
            ::kill(d.pid, SIGKILL);
            ::waitpid(d.pid, nullptr, 0);
            throw std::runtime_error(exe + " did not listen on " + d.socket + " (exited, or not within 10 s); its log: " +
                                     readText(d.log));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
}

void stopDaemon(StartedDaemon& d) {
    if (d.pid <= 0) return;
    ::kill(d.pid, SIGTERM);
    const std::uint64_t deadline = nowNs() + 5'000'000'000ull;
    while (::waitpid(d.pid, nullptr, WNOHANG) == 0) {
        if (nowNs() > deadline) {
            ::kill(d.pid, SIGKILL);
            ::waitpid(d.pid, nullptr, 0);
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    d.pid = -1;
}

pid_t daemonPidBehind(const std::string& socket) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    if (fd < 0 || socket.size() >= sizeof a.sun_path) {
        if (fd >= 0) ::close(fd);
        return -1;
    }
    std::memcpy(a.sun_path, socket.c_str(), socket.size() + 1);
    ucred cred{};
    socklen_t len = sizeof cred;
    const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                    ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0;
    ::close(fd);
    // The process that listened: under socket activation that is systemd, not the daemon.
    if (!ok || cred.pid <= 0) return -1;
    std::string comm = readText("/proc/" + std::to_string(cred.pid) + "/comm");
    while (!comm.empty() && comm.back() == '\n') comm.pop_back();
    return comm == "tpfabricd" ? cred.pid : -1;
}

std::uint64_t processCpuNs(pid_t pid) {
    // Every thread's run time in ns (schedstat); else utime + stime in clock ticks.
    const std::string taskDir = "/proc/" + std::to_string(pid) + "/task";
    if (DIR* d = ::opendir(taskDir.c_str())) {
        std::uint64_t sum = 0;
        bool any = false;
        while (const dirent* e = ::readdir(d)) {
            if (e->d_name[0] == '.') continue;
            unsigned long long run = 0;
            if (std::sscanf(readText(taskDir + "/" + e->d_name + "/schedstat").c_str(), "%llu", &run) == 1) {
                sum += run;
                any = true;
            }
        }
        ::closedir(d);
        if (any) return sum;
    }
    const std::string stat = readText("/proc/" + std::to_string(pid) + "/stat");
    const std::size_t paren = stat.rfind(')');
    if (paren == std::string::npos) return 0;
    std::istringstream in(stat.substr(paren + 2));
    std::string field;
    unsigned long long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && in >> field; ++i) {
        if (i == 14) utime = std::stoull(field);
        if (i == 15) stime = std::stoull(field);
    }
    return (utime + stime) * (1000000000ull / std::uint64_t(::sysconf(_SC_CLK_TCK)));
}

DaemonSample sampleDaemon(pid_t pid, std::uint32_t windowMs) {
    DaemonSample s;
    if (pid <= 0) return s;
    const std::string status = readText("/proc/" + std::to_string(pid) + "/status");
    s.rssKiB = statusKiB(status, "VmRSS");
    s.shmemKiB = statusKiB(status, "RssShmem");
    s.hwmKiB = statusKiB(status, "VmHWM");
    const std::uint64_t c0 = processCpuNs(pid), t0 = nowNs();
    std::this_thread::sleep_for(std::chrono::milliseconds(windowMs));
    const std::uint64_t c1 = processCpuNs(pid), t1 = nowNs();
    s.windowMs = double(t1 - t0) / 1e6;
    // A thread that ended inside the window takes its time with it: never below 0.
    s.cpuPercent = s.rssKiB >= 0 ? 100.0 * double(c1 > c0 ? c1 - c0 : 0) / double(t1 - t0) : -1;
    return s;
}

} // namespace tpf::bench
