// Built without libibverbs: no HCA opens, so no group reaches the verbs wire.
#include "daemon/verbs/qp.hpp"

namespace tpf::daemon {

namespace {
Error noVerbs() { return Error{Errc::Unsupported, "tpfabricd was built without libibverbs (meson -Dverbs=enabled)"}; }
} // namespace

Result<std::shared_ptr<VerbsHca>> VerbsHca::open(const client_proto::HcaCard&, std::uint32_t) { return noVerbs(); }
VerbsHca::~VerbsHca() = default;
std::string VerbsHca::name() const { return {}; }
Result<std::unique_ptr<VerbsMr>> VerbsMr::reg(std::shared_ptr<VerbsHca>, void*, std::uint64_t, std::shared_ptr<const void>) {
    return noVerbs();
}
VerbsMr::~VerbsMr() = default;
std::uint32_t VerbsMr::lkey() const { return 0; }
std::uint32_t VerbsMr::rkey() const { return 0; }
Result<std::unique_ptr<QpLink>> QpLink::create(std::shared_ptr<VerbsHca>, std::uint32_t, std::uint64_t) { return noVerbs(); }
QpLink::~QpLink() = default;
std::uint32_t QpLink::qpn() const { return 0; }
Status QpLink::connect(const RemoteQp&) { return noVerbs(); }
Status QpLink::postStripe(const Layout&, std::uint32_t, std::uint32_t, std::uint32_t, const Stripe&, std::uint64_t) {
    return noVerbs();
}
void QpLink::flush() {}
std::uint32_t pollCompletions(VerbsHca&, QpErrorFn, void*) { return 0; }

} // namespace tpf::daemon
