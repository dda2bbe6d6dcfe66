#include "common/shm.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>

namespace tpf {

namespace {
Error sysError(const std::string& what) {
    return {Errc::SystemError, what + ": " + std::strerror(errno)};
}
} // namespace

Mapping& Mapping::operator=(Mapping&& o) noexcept {
    if (this != &o) {
        if (base_) ::munmap(base_, bytes_);
        base_ = std::exchange(o.base_, nullptr);
        bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
}

Mapping::~Mapping() {
    if (base_) ::munmap(base_, bytes_);
}

Result<UniqueFd> createSealedMemfd(const std::string& name, std::size_t bytes) {
    UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!fd) return sysError("memfd_create " + name);
    if (::ftruncate(fd.get(), off_t(bytes)) != 0) return sysError("ftruncate " + name);
    if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
        return sysError("seal " + name);
    return fd;
}

Result<Mapping> mapShared(int fd, std::size_t bytes, bool requireSeals) {
    struct stat st;
    if (::fstat(fd, &st) != 0) return sysError("fstat of shared memory fd");
    if (std::size_t(st.st_size) != bytes)
        return Error{Errc::BadMessage, "shared memory is " + std::to_string(st.st_size) + " bytes, expected " +
                                           std::to_string(bytes)};
    if (requireSeals) {
        const int seals = ::fcntl(fd, F_GET_SEALS);
        if (seals < 0 || !(seals & F_SEAL_SHRINK))
            return Error{Errc::BadMessage, "shared memory fd is not sealed against shrinking"};
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return sysError("mmap of " + std::to_string(bytes) + " bytes");
    return Mapping(p, bytes);
}

bool futexWait(std::uint32_t* word, std::uint32_t expected, std::uint64_t timeoutNs) {
    if (timeoutNs == 0) return false;
    timespec ts{time_t(timeoutNs / 1000000000ull), long(timeoutNs % 1000000000ull)};
    const long r = ::syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
    return !(r != 0 && errno == ETIMEDOUT);
}

void futexWakeAll(std::uint32_t* word) { ::syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0); }

void wakeIfWaiting(std::uint32_t* waiters, std::uint32_t* wakeSeq) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (std::atomic_ref(*waiters).load(std::memory_order_relaxed) == 0) return;
    std::atomic_ref(*wakeSeq).fetch_add(1, std::memory_order_seq_cst);
    futexWakeAll(wakeSeq);
}

std::uint64_t monotonicNs() {
    timespec ts;
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return std::uint64_t(ts.tv_sec) * 1000000000ull + std::uint64_t(ts.tv_nsec);
}

} // namespace tpf
