// Text an operator wrote (a config file, an environment variable), quoted for
// an error message that must stay on one line whatever the text holds.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace tpf {

/// `s` in double quotes: `"` and `\` escaped with a backslash, newline and tab
/// as \n and \t, other control characters (and DEL) as \xHH; the rest as is.
/// (Not named quoted: with <iomanip> in sight, a std::string argument would
/// find std::quoted by argument-dependent lookup.)
inline std::string quote(std::string_view s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += char(c);
        } else if (c == '\n') {
            out += "\\n";
        } else if (c == '\t') {
            out += "\\t";
        } else if (c < 0x20 || c == 0x7f) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", c);
            out += buf;
        } else {
            out += char(c);
        }
    }
    return out + '"';
}

} // namespace tpf
