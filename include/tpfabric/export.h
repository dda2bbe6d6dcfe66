/* tpfabric — TPF_API marks what libtpfabric exports. The library is built with
 * hidden visibility (and a linker version script as a backstop), so a symbol
 * without TPF_API is internal and absent from `nm -D libtpfabric.so`.
 * TPF_HIDDEN marks the private member functions of a TPF_API class, which
 * would otherwise be exported with it: callers cannot use them, so they are
 * no part of the ABI. */
#ifndef TPFABRIC_EXPORT_H
#define TPFABRIC_EXPORT_H

#if defined(TPFABRIC_BUILDING_LIBRARY)
#define TPF_API __attribute__((visibility("default")))
#define TPF_HIDDEN __attribute__((visibility("hidden")))
#else
#define TPF_API
#define TPF_HIDDEN
#endif

#endif /* TPFABRIC_EXPORT_H */
