// libFuzzer target: tpfabricd's configuration file. The input is written to a
// temporary file and read with loadConfig; a bad file must end in
// ConfigError (one line, naming the key) and nothing else: any other
// exception escapes and libFuzzer reports it as a crash.
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "daemon/config/config.hpp"
#include "fuzz_common.hpp"

namespace {

const std::string& tempPath() {
    static const std::string path = [] {
        const char* dir = std::getenv("TMPDIR");
        std::string tmpl = std::string(dir && *dir ? dir : "/tmp") + "/tpf-fuzz-config-XXXXXX";
        const int fd = ::mkstemp(tmpl.data());
        TPF_FUZZ_CHECK(fd >= 0);
        ::close(fd);
        std::atexit([] { ::unlink(tempPath().c_str()); });
        return tmpl;
    }();
    return path;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string& path = tempPath();
    const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
    TPF_FUZZ_CHECK(fd >= 0);
    std::size_t done = 0;
    while (done < size) {
        const ssize_t n = ::write(fd, data + done, size - done);
        TPF_FUZZ_CHECK(n > 0);
        done += std::size_t(n);
    }
    ::close(fd);
    try {
        const auto cfg = tpf::daemon::loadConfig(path);
        // What a loaded file promises the daemon (config.hpp ranges).
        TPF_FUZZ_CHECK(cfg.ringEntries >= 8 && cfg.ringEntries <= 4096 && (cfg.ringEntries & (cfg.ringEntries - 1)) == 0);
        TPF_FUZZ_CHECK(cfg.maxBytes >= 4096 && cfg.maxBytes <= (1ull << 30));
        TPF_FUZZ_CHECK(cfg.maxClients >= 1 && cfg.maxGroups >= 1);
        TPF_FUZZ_CHECK(cfg.socketPath.empty() || (cfg.socketPath[0] == '/' && cfg.socketPath.size() < 108));
        TPF_FUZZ_CHECK(cfg.source == path);
        (void)tpf::daemon::resolveSocketPath(cfg);
    } catch (const tpf::daemon::ConfigError& e) {
        const std::string what = e.what();
        TPF_FUZZ_CHECK(!what.empty() && what.find('\n') == std::string::npos);
    }
    return 0;
}
