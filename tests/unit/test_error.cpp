// Error vocabulary (<tpfabric/error.hpp>): every code has a unique name and a message.
#include <set>
#include <string>

#include "catch.hpp"
#include <tpfabric/error.hpp>

using namespace tpf;

TEST_CASE("every error code has a unique name and an actionable message") {
    std::set<std::string> names;
    for (std::uint32_t v = 0; v <= std::uint32_t(kLastErrc); ++v) {
        Errc e;
        REQUIRE(errcFromWire(v, e));
        auto name = std::string(errcName(e));
        CHECK(name != "Unknown");
        CHECK(names.insert(name).second);
        CHECK(errcMessage(e).size() > 5);
    }
    Errc e;
    CHECK_FALSE(errcFromWire(std::uint32_t(kLastErrc) + 1, e));
    CHECK_FALSE(errcFromWire(0xffff, e));
    // The failures docs/design.md (Faults) and the mission name.
    for (auto n : {"Unsupported", "Misaligned", "Timeout", "PeerLost", "DaemonLost", "Aborted", "CapMismatch",
                   "NonOneToOnePairing", "BadMessage"})
        CHECK(names.count(n) == 1);
}

TEST_CASE("the C status codes and tpf::Errc are one numbering") {
    // Values that crossed the wire before the C ABI existed keep their meaning.
    STATIC_REQUIRE(int(Errc::PeerLost) == TPF_PEER_LOST && TPF_PEER_LOST == 4);
    STATIC_REQUIRE(int(Errc::SystemError) == TPF_SYSTEM_ERROR && TPF_SYSTEM_ERROR == 27);
    STATIC_REQUIRE(int(Errc::InvalidArgument) == TPF_INVALID_ARGUMENT && TPF_INVALID_ARGUMENT == 28);
    STATIC_REQUIRE(int(kLastErrc) == TPF_BUSY && TPF_BUSY == 29);
    CHECK(errcName(Errc::InvalidArgument) == "InvalidArgument");
    CHECK(errcName(Errc::Busy) == "Busy");
}

TEST_CASE("Result carries a value or a named error") {
    Result<int> ok = 5;
    CHECK(ok.ok());
    CHECK(*ok == 5);
    Result<int> bad{Errc::PeerLost, "rank 3 closed its connection"};
    CHECK_FALSE(bad.ok());
    CHECK(bad.code() == Errc::PeerLost);
    CHECK(bad.error().describe() == "PeerLost: rank 3 closed its connection");
    Status st{Errc::Timeout};
    CHECK(st.error().describe().rfind("Timeout: ", 0) == 0);
}

TEST_CASE("value() of a failed Result throws BadResultAccess naming the failure") {
    Result<int> bad{Errc::SystemError, "bootstrap: bind 127.0.0.1:29500: Address already in use"};
    try {
        (void)bad.value();
        FAIL("value() of a failure returned");
    } catch (const BadResultAccess& e) {
        CHECK(std::string(e.what()) == "tpf::Result holds no value: SystemError: bootstrap: bind 127.0.0.1:29500: Address already in use");
        CHECK(e.error().code == Errc::SystemError);
    }
    CHECK_THROWS_AS(*bad, BadResultAccess);
    CHECK_THROWS_AS(std::move(bad).value(), std::logic_error);
    Result<int> ok = 7;
    CHECK(ok.value() == 7);
}
