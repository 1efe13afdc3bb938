// The one bulk copy for host memory: staging slots, outputs, FIFO rings.
//
// Why not plain memcpy: glibc (2.36 here) copies from 2 KiB to about the L2 size with
// `rep movsb` on CPUs that advertise fast string moves (ERMS/FSRM), and on AMD EPYC (Zen) that
// instruction runs 20x slower when the destination lies 1-31 bytes past the source modulo the
// page size (it takes that for a possible overlap): 2.0-2.5 GB/s against 40-49 GB/s at every
// other distance, for 64 KiB in cache (docs/performance.md, "Copies"). We meet it whenever a
// page-aligned staging slot is copied into a buffer that starts 16 bytes into a page (a C++
// caller's malloc) or into a segment at such an offset. So where memcpy is measured slow at such
// a distance (once, at the first communicator), a copy from 512 bytes to 4 MiB whose destination
// is 1-63 bytes past its source, modulo 4096, goes through a vector loop; every other copy stays
// with memcpy, which is at its best there on every CPU. Where rep movsb has no such penalty
// (Intel), memcpy beats our loop at those distances too, so it does every copy.
#pragma once

#include <cstddef>
#include <string>

namespace smddp::device {

// dst and src must not overlap.
void host_copy(void* dst, const void* src, size_t bytes);

// host_copy with non-temporal stores (x86-64: 16-byte streaming stores for every whole 64-byte
// line of dst, plain stores for the ragged ends): the lines go to memory without first being taken
// back from a core that caches them, which is what a store into a staging slot the peer just read
// costs (4-10 times a copy; docs/performance.md, "Rewriting lines a peer still caches"). Weakly
// ordered: store_fence() must follow before another core may be told the bytes are there. Off
// x86-64 it is host_copy.
void host_copy_streaming(void* dst, const void* src, size_t bytes);

// Orders every earlier non-temporal store before later stores (x86-64: sfence); off x86-64 nothing.
void store_fence();

// Whether host_copy_streaming uses non-temporal stores on this build (x86-64).
bool streaming_stores_built();

// What host_copy uses for the copies its loop takes: "avx2", "sse2" or "libc" (SMDDP_HOST_COPY,
// whose default auto picks the best loop the CPU has where memcpy is slow at short distances,
// else libc; libc off x86-64). The first call measures that. For logs and benchmarks.
const char* host_copy_kind();

// Whether host_copy runs these bytes through its loop (where the CPU has one) or memcpy.
bool host_copy_takes_loop(const void* dst, const void* src, size_t bytes);

// host_copy as SMDDP_HOST_COPY=`kind` would make it, whatever the setting is (tests, A/B
// benchmarks). InvalidArgument for a kind that is not auto/libc/avx2/sse2 or that this CPU lacks.
void host_copy_as(const std::string& kind, void* dst, const void* src, size_t bytes);

}  // namespace smddp::device
