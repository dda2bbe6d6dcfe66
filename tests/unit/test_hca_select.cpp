// HCA selection (daemon/hca_select.hpp): the default (every ACTIVE RoCE port,
// one card per IPv4 GID), verbs.hcas and $TPF_HCA entries (names, dev:port,
// IPs), $NCCL_IB_HCA in NCCL's syntax, their precedence, every refusal, and
// the card's subnet and text forms (daemon/hca.hpp).
#include <arpa/inet.h>

#include <cstring>
#include <string>
#include <vector>

#include "catch.hpp"
#include "daemon/verbs/hca.hpp"
#include "daemon/verbs/hca_select.hpp"

using namespace tpf;
using namespace tpf::daemon;

namespace {

constexpr std::uint32_t kDown = 1, kActive = 4;

std::array<std::uint8_t, 16> gidOf(const char* ip) {
    std::array<std::uint8_t, 16> g{};
    if (::inet_pton(AF_INET, ip, g.data() + 12) == 1) {
        g[10] = g[11] = 0xff;
        return g;
    }
    REQUIRE(::inet_pton(AF_INET6, ip, g.data()) == 1);
    return g;
}

PortAddress addr(const char* ip, std::uint32_t index, std::uint8_t prefix) { return {gidOf(ip), index, prefix}; }

CandidatePort port(std::string dev, std::uint8_t p, std::uint32_t state, std::vector<PortAddress> addrs,
                   bool ethernet = true) {
    CandidatePort c;
    c.device = std::move(dev);
    c.port = p;
    c.state = state;
    c.ethernet = ethernet;
    c.mtu = 1024;
    c.speedMbps = 10000;
    c.addresses = std::move(addrs);
    return c;
}

/// The soft-RoCE guest of tests/vm: rxe0..rxe3, GID 0 link-local, GID 1 the IPv4.
std::vector<CandidatePort> guest() {
    std::vector<CandidatePort> v;
    const char* ips[] = {"10.77.0.1", "10.77.0.2", "10.78.0.1", "10.78.0.2"};
    for (int i = 0; i < 4; ++i)
        v.push_back(port("rxe" + std::to_string(i), 1, kActive,
                         {addr(("fe80::" + std::to_string(i + 1)).c_str(), 0, 64), addr(ips[i], 1, 24)}));
    return v;
}

std::string dev(const client_proto::HcaCard& c) {
    std::string s;
    getText(c.device, s);
    return s;
}

std::vector<std::string> devs(const HcaSelection& s) {
    std::vector<std::string> out;
    for (const auto& c : s.hcas) out.push_back(dev(c) + ":" + std::to_string(c.port) + " " + hcaIp(c));
    return out;
}

using Names = std::vector<std::string>;

HcaRequest config(Names n) { return {std::move(n), std::nullopt, std::nullopt}; }
HcaRequest tpfHca(std::string v) { return {{}, std::move(v), std::nullopt}; }
HcaRequest nccl(std::string v) { return {{}, std::nullopt, std::move(v)}; }

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

} // namespace

TEST_CASE("default: every ACTIVE RoCE port, one card per IPv4 GID, link-local never") {
    auto ports = guest();
    ports[3].state = kDown;
    ports.push_back(port("mlx5_0", 1, kActive, {}, false));                     // InfiniBand
    ports.push_back(port("mlx5_1", 1, kActive, {addr("fe80::9", 0, 64)}));      // no routable address
    ports.push_back(port("mlx5_2", 1, kActive, {addr("fe80::a", 0, 64), addr("10.1.0.5", 1, 16),
                                                 addr("fd00::5", 2, 64), addr("10.2.0.5", 3, 20)}));
    auto r = selectHcas(ports, {});
    REQUIRE(r.ok());
    CHECK(r->source == HcaSource::AllActive);
    CHECK(devs(*r) == Names{"rxe0:1 10.77.0.1", "rxe1:1 10.77.0.2", "rxe2:1 10.78.0.1", "mlx5_2:1 10.1.0.5",
                            "mlx5_2:1 10.2.0.5"});
    CHECK(r->warnings.empty());

    const auto& c = r->hcas[0];
    CHECK(c.gidIndex == 1);
    CHECK(gidText(c.gid) == "::ffff:10.77.0.1");
    CHECK(hcaSubnetText(c) == "10.77.0.0/24");
    CHECK(c.prefixLen == 120);
    CHECK(c.mtu == 1024);
    CHECK(c.speedMbps == 10000);
    CHECK(c.state == kActive);
    CHECK(c.port == 1);
    CHECK(hcaSubnetText(r->hcas[4]) == "10.2.0.0/20");
    CHECK(r->hcas[4].gidIndex == 3);
}

TEST_CASE("default: a port with IPv6 only gives its global IPv6 GIDs") {
    std::vector<CandidatePort> ports{port("mlx5_0", 1, kActive, {addr("fe80::1", 0, 64), addr("fd00:1:2:3::7", 1, 64)})};
    auto r = selectHcas(ports, {});
    REQUIRE(r.ok());
    REQUIRE(r->hcas.size() == 1);
    CHECK(hcaIp(r->hcas[0]) == "fd00:1:2:3::7");
    CHECK(gidText(r->hcas[0].gid) == "fd00:1:2:3::7");
    CHECK(r->hcas[0].prefixLen == 64);
    CHECK(hcaSubnetText(r->hcas[0]) == "fd00:0001:0002:0003:0000:0000:0000:0000/64");
}

TEST_CASE("default: nothing usable is Unavailable with each port's reason") {
    SECTION("no devices") {
        auto r = selectHcas({}, {});
        REQUIRE(r.code() == Errc::Unavailable);
        CHECK(has(r.error().detail, "no RDMA device found"));
    }
    SECTION("down, InfiniBand, no address") {
        std::vector<CandidatePort> ports{port("rxe0", 1, kDown, {addr("10.77.0.1", 1, 24)}),
                                         port("mlx5_0", 1, kActive, {}, false),
                                         port("mlx5_1", 1, kActive, {addr("fe80::1", 0, 64)})};
        auto r = selectHcas(ports, {});
        REQUIRE(r.code() == Errc::Unavailable);
        INFO(r.error().detail);
        CHECK(has(r.error().detail, "no ACTIVE RoCE port with an IP address: "));
        CHECK(has(r.error().detail, "rxe0:1 is DOWN"));
        CHECK(has(r.error().detail, "mlx5_0:1 is InfiniBand"));
        CHECK(has(r.error().detail, "mlx5_1:1 has no RoCE v2 GID of an IPv4 or global IPv6 address"));
    }
}

TEST_CASE("verbs.hcas: names, dev:port and IPs, in the order listed") {
    const auto ports = guest();
    SECTION("names") {
        auto r = selectHcas(ports, config({"rxe2", "rxe0"}));
        REQUIRE(r.ok());
        CHECK(r->source == HcaSource::Config);
        CHECK(devs(*r) == Names{"rxe2:1 10.78.0.1", "rxe0:1 10.77.0.1"});
        CHECK(r->warnings.empty());
    }
    SECTION("dev:port picks one port of a device") {
        std::vector<CandidatePort> two{port("mlx5_0", 1, kActive, {addr("10.1.0.1", 3, 24)}),
                                       port("mlx5_0", 2, kActive, {addr("10.2.0.1", 3, 24)})};
        auto r = selectHcas(two, config({"mlx5_0:2"}));
        REQUIRE(r.ok());
        CHECK(devs(*r) == Names{"mlx5_0:2 10.2.0.1"});
        auto all = selectHcas(two, config({"mlx5_0"}));
        REQUIRE(all.ok());
        CHECK(devs(*all) == Names{"mlx5_0:1 10.1.0.1", "mlx5_0:2 10.2.0.1"});
    }
    SECTION("an IPv4 address picks the port with that GID, that GID only") {
        auto r = selectHcas(ports, config({"10.78.0.2"}));
        REQUIRE(r.ok());
        CHECK(devs(*r) == Names{"rxe3:1 10.78.0.2"});
        CHECK(r->hcas[0].gidIndex == 1);
        std::vector<CandidatePort> multi{port("mlx5_0", 1, kActive, {addr("10.1.0.1", 1, 24), addr("10.2.0.1", 2, 24)})};
        auto one = selectHcas(multi, config({"10.2.0.1"}));
        REQUIRE(one.ok());
        CHECK(devs(*one) == Names{"mlx5_0:1 10.2.0.1"});
        CHECK(one->hcas[0].gidIndex == 2);
    }
    SECTION("an IPv6 address") {
        std::vector<CandidatePort> v6{port("mlx5_0", 1, kActive, {addr("10.1.0.1", 1, 24), addr("fd00::7", 2, 64)})};
        auto r = selectHcas(v6, config({"fd00::7"}));
        REQUIRE(r.ok());
        CHECK(devs(*r) == Names{"mlx5_0:1 fd00::7"});
    }
    SECTION("one port named twice (by name and by IP) gives one card") {
        auto r = selectHcas(ports, config({"rxe0", "10.77.0.1", "rxe0:1"}));
        REQUIRE(r.ok());
        CHECK(devs(*r) == Names{"rxe0:1 10.77.0.1"});
        CHECK(r->warnings.empty());
    }
    SECTION("a named port that is not ACTIVE is kept, with a warning") {
        auto p = ports;
        p[2].state = kDown;
        auto r = selectHcas(p, config({"rxe0", "rxe2"}));
        REQUIRE(r.ok());
        CHECK(devs(*r) == Names{"rxe0:1 10.77.0.1", "rxe2:1 10.78.0.1"});
        CHECK(r->hcas[1].state == kDown);
        REQUIRE(r->warnings.size() == 1);
        CHECK(has(r->warnings[0], "verbs.hcas entry \"rxe2\": rxe2:1 is DOWN"));
    }
}

TEST_CASE("verbs.hcas: entries that match nothing are named, with why") {
    const auto ports = guest();
    SECTION("some match: the rest are warnings") {
        auto r = selectHcas(ports, config({"rxe0", "mlx5_9", "10.9.9.9", "rxe1:2"}));
        REQUIRE(r.ok());
        CHECK(devs(*r) == Names{"rxe0:1 10.77.0.1"});
        REQUIRE(r->warnings.size() == 3);
        CHECK(has(r->warnings[0], "verbs.hcas entry \"mlx5_9\" matched no HCA port: no RDMA device of that name "
                                  "(devices: rxe0, rxe1, rxe2, rxe3)"));
        CHECK(has(r->warnings[1], "\"10.9.9.9\" matched no HCA port: no port has a RoCE v2 GID of 10.9.9.9"));
        CHECK(has(r->warnings[2], "\"rxe1:2\" matched no HCA port: rxe1 has no port 2"));
    }
    SECTION("none match: Unavailable naming each") {
        auto r = selectHcas(ports, config({"mlx5_9", "10.9.9.9"}));
        REQUIRE(r.code() == Errc::Unavailable);
        INFO(r.error().detail);
        CHECK(has(r.error().detail, "no HCA chosen by verbs.hcas"));
        CHECK(has(r.error().detail, "\"mlx5_9\""));
        CHECK(has(r.error().detail, "\"10.9.9.9\""));
    }
    SECTION("a link-local address, an InfiniBand port, a port without an address") {
        auto p = ports;
        p.push_back(port("mlx5_0", 1, kActive, {}, false));
        p.push_back(port("mlx5_1", 1, kActive, {addr("fe80::9", 0, 64)}));
        auto r = selectHcas(p, config({"fe80::1", "mlx5_0", "mlx5_1"}));
        REQUIRE(r.code() == Errc::Unavailable);
        INFO(r.error().detail);
        CHECK(has(r.error().detail, "rxe0:1 GID 0 is link-local"));
        CHECK(has(r.error().detail, "mlx5_0:1 is InfiniBand, not RoCE"));
        CHECK(has(r.error().detail, "mlx5_1:1 has no RoCE v2 GID"));
    }
    SECTION("no devices at all") {
        auto r = selectHcas({}, config({"rxe0"}));
        REQUIRE(r.code() == Errc::Unavailable);
        CHECK(has(r.error().detail, "no RDMA devices at all"));
    }
    SECTION("a device name too long for the node card") {
        std::vector<CandidatePort> p{port("a_very_long_name0", 1, kActive, {addr("10.1.0.1", 1, 24)})};
        auto r = selectHcas(p, config({"a_very_long_name0"}));
        REQUIRE(r.code() == Errc::Unavailable);
        CHECK(has(r.error().detail, "longer than 15 bytes"));
    }
}

TEST_CASE("verbs.hcas and $TPF_HCA: unparsable entries are ConfigError naming them") {
    const auto ports = guest();
    for (const char* bad : {"rxe0:x", "rxe0:0", "rxe0:256", "rxe0:", ":1", "rxe0:1:2"}) {
        INFO(bad);
        auto r = selectHcas(ports, config({"rxe0", bad}));
        REQUIRE(r.code() == Errc::ConfigError);
        CHECK(has(r.error().detail, std::string("verbs.hcas entry \"") + bad + "\""));
        auto t = selectHcas(ports, tpfHca(std::string("rxe0,") + bad));
        REQUIRE(t.code() == Errc::ConfigError);
        CHECK(has(t.error().detail, std::string("TPF_HCA entry \"") + bad + "\""));
    }
}

TEST_CASE("precedence: verbs.hcas, then TPF_HCA, then NCCL_IB_HCA, then every ACTIVE port") {
    const auto ports = guest();
    HcaRequest all{{"rxe0"}, "rxe1", "rxe2"};
    auto r = selectHcas(ports, all);
    REQUIRE(r.ok());
    CHECK(devs(*r) == Names{"rxe0:1 10.77.0.1"});

    all.config.clear();
    r = selectHcas(ports, all);
    REQUIRE(r.ok());
    CHECK(r->source == HcaSource::TpfHca);
    CHECK(devs(*r) == Names{"rxe1:1 10.77.0.2"});

    all.tpfHca = " , ";   // blank: not given
    r = selectHcas(ports, all);
    REQUIRE(r.ok());
    CHECK(r->source == HcaSource::NcclIbHca);
    CHECK(devs(*r) == Names{"rxe2:1 10.78.0.1"});

    all.ncclIbHca = "";
    r = selectHcas(ports, all);
    REQUIRE(r.ok());
    CHECK(r->source == HcaSource::AllActive);
    CHECK(r->hcas.size() == 4);
}

TEST_CASE("TPF_HCA: a comma list of the same entries as verbs.hcas") {
    auto r = selectHcas(guest(), tpfHca(" rxe3 ,10.77.0.1,,rxe9"));
    REQUIRE(r.ok());
    CHECK(devs(*r) == Names{"rxe3:1 10.78.0.2", "rxe0:1 10.77.0.1"});
    REQUIRE(r->warnings.size() == 1);
    CHECK(has(r->warnings[0], "TPF_HCA entry \"rxe9\" matched no HCA port"));
}

TEST_CASE("NCCL_IB_HCA: prefixes, exact names, ports, exclusion; ACTIVE ports only") {
    std::vector<CandidatePort> ports{
        port("mlx5_0", 1, kActive, {addr("10.0.0.1", 1, 24)}),
        port("mlx5_1", 1, kActive, {addr("10.1.0.1", 1, 24)}),
        port("mlx5_1", 2, kActive, {addr("10.11.0.1", 1, 24)}),
        port("mlx5_10", 1, kActive, {addr("10.10.0.1", 1, 24)}),
        port("mlx5_2", 1, kDown, {addr("10.2.0.1", 1, 24)}),
    };
    const auto pick = [&](const char* spec) {
        auto r = selectHcas(ports, nccl(spec));
        REQUIRE(r.ok());
        CHECK(r->source == HcaSource::NcclIbHca);
        return devs(*r);
    };
    CHECK(pick("mlx5") == Names{"mlx5_0:1 10.0.0.1", "mlx5_1:1 10.1.0.1", "mlx5_1:2 10.11.0.1", "mlx5_10:1 10.10.0.1"});
    CHECK(pick("mlx5_1") == Names{"mlx5_1:1 10.1.0.1", "mlx5_1:2 10.11.0.1", "mlx5_10:1 10.10.0.1"}); // NCCL: prefix
    CHECK(pick("=mlx5_1") == Names{"mlx5_1:1 10.1.0.1", "mlx5_1:2 10.11.0.1"});
    CHECK(pick("=mlx5_1:2,mlx5_0:1") == Names{"mlx5_0:1 10.0.0.1", "mlx5_1:2 10.11.0.1"}); // port order, as NCCL
    CHECK(pick("^mlx5_1") == Names{"mlx5_0:1 10.0.0.1"});
    CHECK(pick("^=mlx5_1") == Names{"mlx5_0:1 10.0.0.1", "mlx5_10:1 10.10.0.1"});
    CHECK(pick("^=mlx5_1:1") == Names{"mlx5_0:1 10.0.0.1", "mlx5_1:2 10.11.0.1", "mlx5_10:1 10.10.0.1"});

    SECTION("a DOWN port is skipped; an entry matching nothing is named") {
        auto r = selectHcas(ports, nccl("mlx5_2,mlx5_0,bnxt"));
        REQUIRE(r.ok());
        CHECK(devs(*r) == Names{"mlx5_0:1 10.0.0.1"});
        REQUIRE(r->warnings.size() == 1);
        CHECK(has(r->warnings[0], "NCCL_IB_HCA entry \"bnxt\" matched no HCA port"));
    }
    SECTION("an exclusion matching nothing is named with its '^' and '=', and excludes nothing") {
        auto r = selectHcas(ports, nccl("^bnxt"));
        REQUIRE(r.ok());
        CHECK(devs(*r) == Names{"mlx5_0:1 10.0.0.1", "mlx5_1:1 10.1.0.1", "mlx5_1:2 10.11.0.1", "mlx5_10:1 10.10.0.1"});
        REQUIRE(r->warnings.size() == 1);
        CHECK(has(r->warnings[0], "NCCL_IB_HCA entry \"^bnxt\" matched no HCA port, so it excludes nothing"));
        auto exact = selectHcas(ports, nccl("^=mlx5_1,mlx5"));
        REQUIRE(exact.ok());
        REQUIRE(exact->warnings.size() == 1);
        CHECK(has(exact->warnings[0], "NCCL_IB_HCA entry \"^=mlx5\" matched no HCA port, so it excludes nothing"));
        auto plain = selectHcas(ports, nccl("=mlx5_0,mlx5"));
        REQUIRE(plain.ok());
        REQUIRE(plain->warnings.size() == 1);
        CHECK(has(plain->warnings[0], "NCCL_IB_HCA entry \"=mlx5\" matched no HCA port"));
        CHECK(!has(plain->warnings[0], "excludes"));
    }
    SECTION("only DOWN ports match: Unavailable saying so") {
        auto r = selectHcas(ports, nccl("=mlx5_2"));
        REQUIRE(r.code() == Errc::Unavailable);
        CHECK(has(r.error().detail, "mlx5_2:1 is DOWN"));
    }
    SECTION("unparsable") {
        for (const char* bad : {"^", "=", "^=", "mlx5_0:x", "mlx5_0:0"}) {
            INFO(bad);
            auto r = selectHcas(ports, nccl(bad));
            REQUIRE(r.code() == Errc::ConfigError);
            CHECK(has(r.error().detail, "NCCL_IB_HCA"));
        }
    }
    SECTION("IP literals are no NCCL syntax") {
        auto r = selectHcas(ports, nccl("10.0.0.1"));
        REQUIRE(r.code() == Errc::Unavailable);
    }
}

TEST_CASE("at most 8 cards; the rest are dropped with a warning") {
    std::vector<CandidatePort> ports;
    for (int i = 0; i < 5; ++i) {
        const std::string a = "10." + std::to_string(i) + ".0.1", b = "10." + std::to_string(i) + ".1.1";
        ports.push_back(port("mlx5_" + std::to_string(i), 1, kActive, {addr(a.c_str(), 1, 24), addr(b.c_str(), 2, 24)}));
    }
    auto r = selectHcas(ports, {});
    REQUIRE(r.ok());
    CHECK(r->hcas.size() == kMaxStripes);
    REQUIRE(r->warnings.size() == 1);
    CHECK(has(r->warnings[0], "10 HCAs chosen by every ACTIVE RoCE port, at most 8 are served; dropped "
                              "mlx5_4:1 10.4.0.1, mlx5_4:1 10.4.1.1"));
}

TEST_CASE("makeHcaCard: subnet in the 128-bit form, host bits cleared") {
    const auto p = port("rxe0", 1, kActive, {});
    struct Case {
        const char* ip;
        std::uint8_t prefix;
        const char* subnet;
        std::uint8_t len;
    } cases[] = {
        {"10.77.0.1", 24, "10.77.0.0/24", 120}, {"10.77.200.9", 20, "10.77.192.0/20", 116},
        {"192.168.1.7", 32, "192.168.1.7/32", 128}, {"192.168.1.7", 0, "0.0.0.0/0", 96},
        {"fd00::1:2", 112, "fd00:0000:0000:0000:0000:0000:0001:0000/112", 112},
    };
    for (const auto& c : cases) {
        INFO(c.ip << "/" << int(c.prefix));
        const auto card = makeHcaCard(p, addr(c.ip, 5, c.prefix));
        CHECK(hcaSubnetText(card) == c.subnet);
        CHECK(card.prefixLen == c.len);
        CHECK(card.gidIndex == 5);
        CHECK(hcaAddress(card).prefixLen == c.len);
        CHECK(std::memcmp(hcaAddress(card).gid.data(), card.gid, 16) == 0);
    }
    // Two nodes' cards of one rail have the same subnet: pairing's premise.
    CHECK(sameSubnet(hcaAddress(makeHcaCard(p, addr("10.77.0.1", 1, 24))),
                     hcaAddress(makeHcaCard(p, addr("10.77.0.2", 1, 24)))));
    CHECK_FALSE(sameSubnet(hcaAddress(makeHcaCard(p, addr("10.77.0.1", 1, 24))),
                           hcaAddress(makeHcaCard(p, addr("10.78.0.1", 1, 24)))));
}

TEST_CASE("text forms: gidText as ibv_devinfo prints, hcaIp, portStateName") {
    const auto p = port("rxe0", 1, kActive, {});
    const auto v4 = makeHcaCard(p, addr("10.77.0.1", 1, 24));
    CHECK(gidText(v4.gid) == "::ffff:10.77.0.1");
    CHECK(hcaIp(v4) == "10.77.0.1");
    const auto ll = makeHcaCard(p, addr("fe80::5054:ff:fe12:3456", 0, 64));
    CHECK(gidText(ll.gid) == "fe80::5054:ff:fe12:3456");
    CHECK(portStateName(0) == "NOP");
    CHECK(portStateName(1) == "DOWN");
    CHECK(portStateName(2) == "INIT");
    CHECK(portStateName(3) == "ARMED");
    CHECK(portStateName(4) == "ACTIVE");
    CHECK(portStateName(5) == "ACTIVE_DEFER");
    CHECK(portStateName(9) == "UNKNOWN(9)");
    CHECK(hcaSourceName(HcaSource::Config) == "verbs.hcas");
}

TEST_CASE("messages stay one line whatever the environment holds") {
    auto r = selectHcas(guest(), tpfHca("rxe0,rx\ne9"));
    REQUIRE(r.ok());
    REQUIRE(r->warnings.size() == 1);
    CHECK(has(r->warnings[0], "TPF_HCA entry \"rx\\ne9\" matched no HCA port"));
    auto bad = selectHcas(guest(), nccl("mlx5_0:\x1b"));
    REQUIRE(bad.code() == Errc::ConfigError);
    CHECK(bad.error().detail.find('\x1b') == std::string::npos);
}
