// Usage errors of the command-line programs (tpfabricd, tpfabricctl,
// tpf-bench), one shape for all: two lines on stderr, "PROG: the problem"
// and a pointer to --help, exit status 2 (docs/operations.md). Header-only;
// the programs link CLI11 themselves.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

namespace tpf::cli {

/// Prints the two lines and returns 2, the exit status of bad usage.
inline int usageError(const char* prog, const std::string& line, const char* helpLine) {
    std::fprintf(stderr, "%s: %s\n", prog, line.c_str());
    std::fprintf(stderr, "%s\n", helpLine);
    return 2;
}

/// The check of a client's --socket (tpfabricctl, tpf-bench): an empty path
/// names no socket, where leaving the flag out means $`envName`, else
/// `defaultPath`.
inline CLI::Validator clientSocketPath(const std::string& envName, const std::string& defaultPath) {
    return CLI::Validator(
        [envName, defaultPath](std::string& path) {
            return path.empty() ? "an empty path names no socket; give the daemon's socket path, or leave --socket out "
                                  "for $" + envName + " (else " + defaultPath + ")"
                                : std::string();
        },
        "");
}

/// The line for a parse error of a program that takes a command: CLI11 says
/// only "A subcommand is required", even when a word was given, so name the
/// word and the commands (hidden ones, of group "", left out); once a
/// command was selected, words it does not take named in the order given
/// (CLI11 lists them backwards), else `e.what()`.
inline std::string parseErrorLine(const CLI::App& app, const CLI::ParseError& e) {
    if (const auto selected = app.get_subcommands(); !selected.empty()) {
        if (dynamic_cast<const CLI::ExtrasError*>(&e) == nullptr) return e.what();
        std::string words;
        for (const auto& w : app.remaining(true)) words += (words.empty() ? "" : " ") + w;
        const std::string cmd = selected.front()->get_name();
        const std::string prog = app.get_name().substr(app.get_name().find_last_of('/') + 1);
        return cmd + " does not take '" + words + "' ('" + prog + " " + cmd + " --help' lists what it takes)";
    }
    std::string commands;
    for (const CLI::App* c : app.get_subcommands([](const CLI::App* s) { return !s->get_group().empty(); }))
        commands += (commands.empty() ? "" : ", ") + c->get_name();
    const auto rest = app.remaining();
    if (!rest.empty() && !rest.front().empty() && rest.front()[0] != '-')
        return "unknown command '" + rest.front() + "'; the commands are " + commands;
    if (!rest.empty()) return "unknown option " + rest.front() + " before a command; the commands are " + commands;
    return "a command is required: " + commands;
}

} // namespace tpf::cli
