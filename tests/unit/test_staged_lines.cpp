// The proxy's unpacking of a shard staged as LL lines (kDoorbellLines,
// proto/ring.hpp; daemon/proxy/staged_lines.hpp): lines written here in the
// documented format, as the GPU kernel (putLines) and the host test path
// (Group::Impl::postLines) write them, some of them late, stale or torn.
#include <cstring>
#include <vector>

#include "catch.hpp"
#include "daemon/proxy/staged_lines.hpp"

using namespace tpf;
using tpf::daemon::unpackStagedLines;

namespace {

struct Lines {
    explicit Lines(std::size_t bytes) : shard(bytes / 4), mem(bytes / 2 + 4), out(bytes / 4 + 4, 0xdeadbeef) {
        for (std::size_t w = 0; w < shard.size(); ++w) shard[w] = std::uint32_t(w * 2654435761u);
    }
    // Words 0, 1 of chunk c are line c's data, words 2, 3 line n + c's.
    void write(std::size_t word, std::uint32_t flag) {
        const std::size_t c = word / 4, k = word % 4, line = k < 2 ? c : shard.size() / 4 + c;
        mem[4 * line + 2 * (k % 2)] = shard[word];
        mem[4 * line + 2 * (k % 2) + 1] = flag;
    }
    void writeAll(std::uint32_t flag) {
        for (std::size_t w = 0; w < shard.size(); ++w) write(w, flag);
    }
    const std::uint8_t* lines() const { return reinterpret_cast<const std::uint8_t*>(mem.data()); }
    std::uint8_t* dst() { return reinterpret_cast<std::uint8_t*>(out.data()); }
    bool unpackedUpTo(std::size_t bytes) const { return std::memcmp(out.data(), shard.data(), bytes) == 0; }
    std::vector<std::uint32_t> shard;
    std::vector<std::uint32_t> mem; // 2 words a data word (malloc: 16-byte aligned)
    std::vector<std::uint32_t> out;
};

} // namespace

TEST_CASE("staged lines: a whole shard unpacks byte for byte") {
    for (std::size_t bytes : {16u, 64u, 4096u, 65536u}) {
        Lines l(bytes);
        REQUIRE(reinterpret_cast<std::uintptr_t>(l.lines()) % 16 == 0);
        l.writeAll(7);
        CHECK(unpackStagedLines(l.lines(), l.dst(), bytes, 7, 0) == bytes);
        CHECK(l.unpackedUpTo(bytes));
        CHECK(l.out[bytes / 4] == 0xdeadbeef); // nothing past the shard
    }
}

TEST_CASE("staged lines: unpacking stops at the first chunk not whole, and resumes there") {
    const std::size_t bytes = 1024;
    Lines l(bytes);
    l.writeAll(5); // the lines of epoch e - 2 (same phase)
    for (std::size_t w = 0; w < 37; ++w) l.write(w, 7);
    // Words 0..36 carry epoch 7: chunks 0..8 are whole, chunk 9 (words 36..39) is not.
    const std::uint64_t done = unpackStagedLines(l.lines(), l.dst(), bytes, 7, 0);
    CHECK(done == 9 * 16);
    CHECK(l.unpackedUpTo(done));
    CHECK(l.out[done / 4] == 0xdeadbeef);
    // The rest arrives; unpacking goes on from where it stopped.
    for (std::size_t w = 37; w < bytes / 4; ++w) l.write(w, 7);
    CHECK(unpackStagedLines(l.lines(), l.dst(), bytes, 7, done) == bytes);
    CHECK(l.unpackedUpTo(bytes));
}

TEST_CASE("staged lines: a line with one stale half is not taken") {
    const std::size_t bytes = 256;
    Lines l(bytes);
    l.writeAll(9);
    for (std::size_t half : {0u, 1u, 2u, 3u}) { // each of chunk 3's four halves in turn
        Lines t(bytes);
        t.writeAll(9);
        t.write(12 + half, 7); // the data as it was, the flag of epoch e - 2
        CHECK(unpackStagedLines(t.lines(), t.dst(), bytes, 9, 0) == 3 * 16);
    }
    // The flag's value in the data words does not make a line whole.
    Lines d(bytes);
    for (std::size_t w = 0; w < bytes / 4; ++w) d.shard[w] = 9;
    d.writeAll(8);
    CHECK(unpackStagedLines(d.lines(), d.dst(), bytes, 9, 0) == 0);
    // Never-written (zeroed) lines are not epoch 1's.
    Lines z(bytes);
    CHECK(unpackStagedLines(z.lines(), z.dst(), bytes, 1, 0) == 0);
    CHECK(unpackStagedLines(l.lines(), l.dst(), 0, 9, 0) == 0); // an empty shard is whole at once
}
