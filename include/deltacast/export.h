/* DCAST_API marks the public functions of libdeltacast: the library is built
 * with -fvisibility=hidden, so only declarations carrying it are exported
 * from libdeltacast.so (internal functions stay inside, whatever their
 * name).  Users of the library need not care: it expands to nothing but a
 * visibility attribute. */
#ifndef DELTACAST_EXPORT_H
#define DELTACAST_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define DCAST_API __attribute__((visibility("default")))
#else
#define DCAST_API
#endif

#endif
