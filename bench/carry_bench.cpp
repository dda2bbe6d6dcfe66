// tpf-carrybench: the proxy's carry threads (daemon/proxy/carry.hpp) alone,
// on this machine's CPUs: one copy of N bytes by the calling thread with
// proxy.carry_threads = 0 (alone), with helpers that slept and are woken
// after each copy (the daemon's way: copy, then wakeIdle()), and with
// helpers awake (spinning). Copies go between
// buffers rotated over 512 MiB, so each starts from memory, not from a
// core's cache (as the proxy route's: a GPU wrote the source, a GPU reads
// the destination). Cold copies are 200 µs apart, so the helpers sleep
// (proxy.spin_us 0). Then batches of rows (CarryPool::copy of CarryItems):
// the W x (W - 1) rows of a whole call of the proxy route at W ranks (each
// rank's row to each of its W - 1 peers; the daemon batches one doorbell's
// W - 1), alone and with 2 helpers awake. Prints µs per copy or batch,
// p50 / mean / p99 (docs/perf.md).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "common/cli_usage.hpp"
#include "daemon/proxy/carry.hpp"

using namespace tpf::daemon;

int main(int argc, char** argv) {
    CLI::App app{"tpf-carrybench - the daemon's carry threads alone on this machine's CPUs: µs per copy and per batch "
                 "of rows, alone and with helpers (docs/perf.md)"};
    int copies = 400;
    app.add_option("COPIES", copies, "timed copies per (bytes, mode)")->check(CLI::Range(1, 1000000))->capture_default_str();
    app.footer("Exit status: 0 measured; 1 the carry threads did not start; 2 bad usage.");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        if (e.get_exit_code() == 0) return app.exit(e);
        return tpf::cli::usageError("tpf-carrybench", e.what(), "Run 'tpf-carrybench --help' for the options.");
    }
    constexpr std::size_t kMax = 512 * 1024, kPool = 512ull << 20;
    std::vector<std::uint8_t> pool(kPool, 1);
    const std::size_t slots = kPool / kMax / 2;
    struct Mode {
        const char* name;
        std::uint32_t threads, spinUs;
    };
    const Mode modes[] = {{"alone (carry_threads 0)", 0, 0}, {"2 asleep, woken after", 2, 0}, {"2 awake (spinning)", 2, 1000000}};
    std::printf("| bytes | mode | p50 | mean | p99 | parts by helpers |\n| ---: | --- | ---: | ---: | ---: | ---: |\n");
    for (std::size_t n : {std::size_t(64 * 1024), std::size_t(128 * 1024), std::size_t(256 * 1024), kMax}) {
        for (const Mode& m : modes) {
            CarryPool carry(m.threads, m.spinUs);
            if (!carry.start()) return 1;
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
            std::vector<double> us;
            for (int i = 0; i < copies; ++i) {
                std::uint8_t* const from = pool.data() + (std::size_t(i) % slots) * 2 * kMax;
                if (m.spinUs == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
                const auto t0 = std::chrono::steady_clock::now();
                carry.copy(from + kMax, from, n, false);
                us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
                carry.wakeIdle();
            }
            std::sort(us.begin(), us.end());
            double sum = 0;
            for (double x : us) sum += x;
            std::printf("| %zu | %s | %.2f | %.2f | %.2f | %llu |\n", n, m.name, us[us.size() / 2], sum / double(us.size()),
                        us[us.size() * 99 / 100], (unsigned long long)carry.parts());
        }
    }
    // Batches: W x (W - 1) rows of n bytes, each from its own source row.
    std::printf("\n| rows x bytes | mode | p50 | mean | p99 | parts by helpers |\n| --- | --- | ---: | ---: | ---: | ---: |\n");
    struct Batch {
        std::uint32_t world;
        std::size_t bytes;
    };
    for (const Batch b : {Batch{4, 4096}, Batch{8, 4096}, Batch{8, 16384}, Batch{16, 4096}, Batch{4, 16384}}) {
        const std::size_t rows = std::size_t(b.world) * (b.world - 1), span = 2 * rows * b.bytes;
        const std::size_t batches = kPool / span;
        for (const Mode& m : {modes[0], modes[2]}) {
            CarryPool carry(m.threads, m.spinUs);
            if (!carry.start()) return 1;
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
            std::vector<double> us;
            std::vector<CarryItem> items(rows);
            for (int i = 0; i < copies; ++i) {
                std::uint8_t* const base = pool.data() + (std::size_t(i) % batches) * span;
                for (std::size_t r = 0; r < rows; ++r)
                    items[r] = CarryItem{base + (rows + r) * b.bytes, base + r * b.bytes, b.bytes, false};
                const auto t0 = std::chrono::steady_clock::now();
                carry.copy(items);
                us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
                carry.wakeIdle();
            }
            std::sort(us.begin(), us.end());
            double sum = 0;
            for (double x : us) sum += x;
            std::printf("| %zu x %zu (W = %u) | %s | %.2f | %.2f | %.2f | %llu |\n", rows, b.bytes, b.world, m.name,
                        us[us.size() / 2], sum / double(us.size()), us[us.size() * 99 / 100], (unsigned long long)carry.parts());
        }
    }
    return 0;
}
