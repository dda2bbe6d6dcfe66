/* tpfabric — TPF_API marks what libtpfabric exports. The library is built with
 * hidden visibility (and a linker version script as a backstop), so a symbol
 * without TPF_API is internal and absent from `nm -D libtpfabric.so`. */
#ifndef TPFABRIC_EXPORT_H
#define TPFABRIC_EXPORT_H

#if defined(TPFABRIC_BUILDING_LIBRARY)
#define TPF_API __attribute__((visibility("default")))
#else
#define TPF_API
#endif

#endif /* TPFABRIC_EXPORT_H */
