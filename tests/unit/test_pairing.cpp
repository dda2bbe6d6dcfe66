// HCA pairing by subnet, one to one (proto/pairing.hpp).
#include <algorithm>
#include <random>
#include <vector>

#include "catch.hpp"
#include "proto/pairing.hpp"

using namespace tpf;

namespace {
// An HCA at 10.<rail>.0.<host>/24, as the daemon describes a RoCE v2 port.
HcaAddress hca(std::uint8_t rail, std::uint8_t host) {
    HcaAddress a;
    a.gid = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, rail, 0, host};
    a.subnet = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, rail, 0, 0};
    a.prefixLen = 96 + 24;
    return a;
}
std::vector<HcaAddress> node(std::uint8_t host, std::vector<std::uint8_t> rails) {
    std::vector<HcaAddress> v;
    for (auto r : rails) v.push_back(hca(r, host));
    return v;
}
} // namespace

TEST_CASE("pairing accepts 1, 2 and 4 HCAs a side in any order") {
    std::mt19937 rng(7);
    for (std::uint8_t count : {1, 2, 4}) {
        std::vector<std::uint8_t> rails;
        for (std::uint8_t i = 0; i < count; ++i) rails.push_back(std::uint8_t(70 + i));
        for (int trial = 0; trial < 20; ++trial) {
            auto a = rails, b = rails;
            std::shuffle(a.begin(), a.end(), rng);
            std::shuffle(b.begin(), b.end(), rng);
            auto A = node(1, a), B = node(2, b);
            auto ab = pairHcas(A, B);
            auto ba = pairHcas(B, A);
            REQUIRE(ab.ok());
            REQUIRE(ba.ok());
            REQUIRE(ab->size() == count);
            for (std::size_t k = 0; k < count; ++k) {
                // Same subnet on both ends of every rail...
                REQUIRE(sameSubnet(A[(*ab)[k].local], B[(*ab)[k].remote]));
                // ...and both nodes number the rails identically.
                REQUIRE((*ab)[k].local == (*ba)[k].remote);
                REQUIRE((*ab)[k].remote == (*ba)[k].local);
            }
        }
    }
}

TEST_CASE("pairing refuses every non-one-to-one shape by name") {
    SECTION("two HCAs of one node in one subnet") {
        auto r = pairHcas(node(1, {70, 70}), node(2, {70, 71}));
        CHECK(r.code() == Errc::NonOneToOnePairing);
        CHECK(r.error().detail.find("two local HCAs in subnet 10.70.0.0/24") != std::string::npos);
        CHECK(pairHcas(node(1, {70, 71}), node(2, {71, 71})).code() == Errc::NonOneToOnePairing);
    }
    SECTION("a subnet on one side only") {
        auto r = pairHcas(node(1, {70, 71}), node(2, {70, 72}));
        CHECK(r.code() == Errc::NonOneToOnePairing);
        CHECK(r.error().detail.find("only on the local node") != std::string::npos);
    }
    SECTION("unequal counts") {
        auto r = pairHcas(node(1, {70, 71}), node(2, {70}));
        CHECK(r.code() == Errc::NonOneToOnePairing);
        CHECK(r.error().detail.find("unequal HCA counts") != std::string::npos);
    }
    SECTION("no HCA at all") {
        CHECK(pairHcas(node(1, {}), node(2, {70})).code() == Errc::NonOneToOnePairing);
    }
    SECTION("same address, other prefix length is another subnet") {
        auto a = node(1, {70});
        auto b = node(2, {70});
        b[0].prefixLen = 96 + 16;
        CHECK(pairHcas(a, b).code() == Errc::NonOneToOnePairing);
    }
}
