// tpfabricctl — the operator's tool. An ordinary client of tpfabricd's socket.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/byte_size.hpp"
#include "common/cli_usage.hpp"
#include "ctl/metrics_render.hpp"
#include "ctl/status_client.hpp"
#include "ctl/status_print.hpp"
#include "proto/layout.hpp"
#include "tpf_config.h"

namespace {

// `tpfabricctl layout`: what one rank's region looks like for a world and cap.
int runLayout(std::uint32_t world, const std::string& maxBytesText, std::uint32_t stripes, bool json) {
    auto cap = tpf::parseByteSize(maxBytesText);
    if (!cap) {
        std::fprintf(stderr, "tpfabricctl: --max-bytes: %s\n", cap.error().describe().c_str());
        return 2;
    }
    if (*cap == 0) {
        std::fprintf(stderr, "tpfabricctl: --max-bytes: 0 is no cap: give the bytes a rank sends per call (an open "
                             "refuses 0), e.g. 4096 or 512KiB\n");
        return 2;
    }
    auto layout = tpf::Layout::of(world, tpf::slotBytesFor(*cap), stripes);
    if (!layout) {
        std::fprintf(stderr, "tpfabricctl: %s\n", layout.error().describe().c_str());
        return 2;
    }
    const auto& l = *layout;
    if (json) {
        nlohmann::json j = {{"world", l.world},
                            {"stripes", l.stripes},
                            {"agreed_cap", *cap},
                            {"slot_bytes", l.slotBytes},
                            {"flags_offset", l.flagsOffset()},
                            {"control_offset", l.controlOffset()},
                            {"region_bytes", l.totalBytes()}};
        std::cout << j.dump(2) << "\n";
        return 0;
    }
    std::printf("region of one rank: world %u, %u stripe(s), cap %s -> slot %s\n", l.world, l.stripes,
                tpf::formatByteSize(*cap).c_str(), tpf::formatByteSize(l.slotBytes).c_str());
    std::printf("  %-28s %12s %12s\n", "part", "offset", "bytes");
    for (std::uint32_t p = 0; p < 2; ++p)
        std::printf("  %-28s %12llu %12llu\n", ("slots, phase " + std::to_string(p)).c_str(),
                    (unsigned long long)l.slotOffset(p, 0), (unsigned long long)(l.world * l.slotBytes));
    std::printf("  %-28s %12llu %12llu\n", "flags (128 B lines)", (unsigned long long)l.flagsOffset(),
                (unsigned long long)l.flagsBytes());
    std::printf("  %-28s %12llu %12zu\n", "control block", (unsigned long long)l.controlOffset(),
                sizeof(tpf::ControlBlock));
    std::printf("  %-28s %12s %12llu\n", "total (page-rounded)", "", (unsigned long long)l.totalBytes());
    return 0;
}

// One line on stderr, whatever the daemon put in its error message; exit status 1.
int failLine(const std::string& detail) {
    std::string line = detail;
    for (char& c : line)
        if ((unsigned char)c < 0x20) c = '?';
    std::fprintf(stderr, "tpfabricctl: %s\n", line.c_str());
    return 1;
}

// `tpfabricctl status`: ask the daemon for its status document and print it.
int runStatus(const std::string& socketPath, int timeoutMs, bool json) {
    auto doc = tpf::ctl::fetchStatus(socketPath, timeoutMs);
    if (!doc) return failLine(doc.error().detail);
    if (json)
        std::cout << doc->dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
    else
        tpf::ctl::printStatus(*doc, std::cout);
    if (!std::cout.flush()) {
        std::fprintf(stderr, "tpfabricctl: cannot write the status to stdout\n");
        return 1;
    }
    return 0;
}

// `tpfabricctl metrics`: the same status document as Prometheus text.
int runMetrics(const std::string& socketPath, int timeoutMs) {
    auto doc = tpf::ctl::fetchStatus(socketPath, timeoutMs);
    if (!doc) return failLine(doc.error().detail);
    auto text = tpf::ctl::renderMetrics(*doc);
    if (!text) return failLine(text.error().describe() + " (tpfabricd at " + socketPath + ")");
    std::cout << *text;
    if (!std::cout.flush()) {
        std::fprintf(stderr, "tpfabricctl: cannot write the metrics to stdout\n");
        return 1;
    }
    return 0;
}

} // namespace

int main(int argc, char** argv) {
    CLI::App app{"tpfabricctl " TPF_VERSION " - inspect tpfabric regions and the tpfabricd daemon"};
    app.require_subcommand(1);
    app.set_version_flag("--version", TPF_VERSION);
    app.footer("Exit status: 0 done (--help, --version, or the command printed); 1 status or metrics: the daemon "
               "could not be reached, refused, or answered garbage or too late (one line on stderr says what and "
               "what to do); 2 bad usage (a line on stderr naming tpfabricctl and the problem, then a pointer to "
               "--help), or layout: no layout for the values given (one line on stderr says why).");

    std::uint32_t world = 8;
    std::string maxBytes = "512KiB";
    std::uint32_t stripes = 1;
    bool json = false;
    auto* layout = app.add_subcommand("layout", "print the region layout of one rank for a world and cap");
    layout->add_option("--world", world, "ranks in the group (1..16)")->capture_default_str();
    layout->add_option("--max-bytes", maxBytes, "agreed cap per rank, e.g. 4096, 64KiB, 1MiB")->capture_default_str();
    layout->add_option("--stripes", stripes, "HCA pairs between two nodes (1..8)")->capture_default_str();
    layout->add_flag("--json", json, "print JSON instead of a table");
    layout->footer("Exit status: 0 printed; 2 bad usage, or no layout for this world, cap and stripes (one line on "
                   "stderr says why).");

    // Options of the daemon's commands, accepted before or after the command:
    // `tpfabricctl --socket S status` and `tpfabricctl status --socket S`.
    std::string socketPath = tpf::ctl::defaultSocketPath();
    int timeoutMs = 5000;
    const std::string socketHelp = std::string("tpfabricd's control socket (default: $") + tpf::ctl::kSocketEnv +
                                   " if set, else " + tpf::ctl::kDefaultSocketPath + ")";
    const std::string timeoutHelp = "how long to wait for the daemon's answers, 1..600000";
    const auto addDaemonOptions = [&](CLI::App& to) {
        CLI::Option* socket = to.add_option("--socket", socketPath, socketHelp)
            ->check(tpf::cli::clientSocketPath(tpf::ctl::kSocketEnv, tpf::ctl::kDefaultSocketPath))
            ->group("Daemon options (of status and metrics, before or after the command)");
        to.add_option("--timeout-ms", timeoutMs, timeoutHelp)
            ->check(CLI::Validator(
                [](std::string& v) {
                    const bool digits = !v.empty() && v.find_first_not_of("0123456789") == std::string::npos;
                    return digits ? std::string() : v + " is not a whole number of milliseconds (1..600000)";
                },
                ""))
            ->check(CLI::Range(1, 600000))
            ->capture_default_str()
            ->group("Daemon options (of status and metrics, before or after the command)");
        return socket;
    };
    // Before the command they belong to the app: layout, which reads no daemon, refuses them below.
    CLI::Option* appSocket = addDaemonOptions(app);
    CLI::Option* appTimeout = app.get_option("--timeout-ms");
    bool jsonBefore = false;
    app.add_flag("--json", jsonBefore, "print JSON: as 'status --json' or 'layout --json'")
        ->group("Options of status and layout (before or after the command)");

    bool statusJson = false;
    auto* status = app.add_subcommand("status", "show tpfabricd's HCAs, peers, groups and registered memory");
    addDaemonOptions(*status);
    status->add_flag("--json", statusJson, "print the daemon's status document as JSON (docs/status.md)");
    status->footer("Exit status: 0 printed; 1 the daemon could not be reached, refused, or answered garbage or "
                   "too late (one line on stderr says what and what to do); 2 bad usage.");

    auto* metrics = app.add_subcommand(
        "metrics", "print tpfabricd's counters and gauges in the Prometheus text format (docs/operations.md, Metrics)");
    addDaemonOptions(*metrics);
    metrics->footer("Counters count since the daemon started (tpfabric_daemon_start_time_seconds). Serve the output "
                    "with node exporter's textfile collector or any scraper that runs this command.\n"
                    "Exit status: 0 printed; 1 the daemon could not be reached, refused, or answered garbage or too "
                    "late, or is too old for metrics (one line on stderr says what and what to do); 2 bad usage.");

    std::string helpTopic;
    auto* help = app.add_subcommand("help", "print this help, or a command's (tpfabricctl help status)");
    help->add_option("command", helpTopic, "layout, status or metrics");

    const auto usage = [](const std::string& line) {
        return tpf::cli::usageError("tpfabricctl", line, "Run 'tpfabricctl --help' for the commands and options.");
    };
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        // --help and --version exit 0; every usage error exits 2, named, as the layout checks do.
        if (e.get_exit_code() == 0) return app.exit(e);
        std::string line = tpf::cli::parseErrorLine(app, e);
        // `tpfabricctl --socket status`: CLI11 takes the command as the option's value, or finds no value at all.
        if (app.get_subcommands().empty() && argc > 1) {
            const std::string last = argv[argc - 1], prev = argc > 2 ? argv[argc - 2] : "";
            const auto valueOf = [](const std::string& w) { return w == "--socket" ? " PATH" : w == "--timeout-ms" ? " MS" : ""; };
            const bool command = last == "layout" || last == "status" || last == "metrics" || last == "help";
            if (*valueOf(last) != '\0')
                line = last + " needs a value, then a command (tpfabricctl " + last + valueOf(last) + " status)";
            else if (*valueOf(prev) != '\0' && command)
                line = prev + " took the command '" + last + "' as its value: give the value first (tpfabricctl " + prev +
                       valueOf(prev) + " " + last + ")";
        }
        return usage(line);
    }
    if (*layout && (appSocket->count() > 0 || appTimeout->count() > 0))
        return usage(std::string("layout reads no daemon: ") + (appSocket->count() > 0 ? "--socket" : "--timeout-ms") +
                     " is an option of status and metrics");
    if (jsonBefore && *metrics)
        return usage("metrics prints Prometheus text: --json is an option of status and layout");
    if (jsonBefore && *help) return usage("help takes no --json");
    if (*help) {
        if (!helpTopic.empty() && helpTopic != "layout" && helpTopic != "status" && helpTopic != "metrics")
            return usage("help: unknown command '" + helpTopic + "'; the commands are layout, status, metrics, help");
        // Not app.help(): with `help` selected it would print help's own.
        std::cout << (helpTopic.empty() ? app.get_formatter()->make_help(&app, app.get_name(), CLI::AppFormatMode::Normal)
                                        : app.get_subcommand(helpTopic)->help(app.get_name()));
        return 0;
    }
    if (*layout) return runLayout(world, maxBytes, stripes, json || jsonBefore);
    if (*status) return runStatus(socketPath, timeoutMs, statusJson || jsonBefore);
    if (*metrics) return runMetrics(socketPath, timeoutMs);
    return 2;
}
