// The one bulk copy for host memory: staging slots, outputs, FIFO rings.
//
// Why not plain memcpy: glibc (2.36 here) copies from 2 KiB up to about the L2 size with
// `rep movsb` on CPUs that advertise fast string moves (ERMS/FSRM), and on AMD EPYC (Zen) that
// instruction runs 20x slower when destination and source are not aligned alike to 64 bytes:
// 2.0-2.2 GB/s against 38-49 GB/s for a vector loop, for 16-128 KiB in cache (docs/performance.md,
// "Copies"). Our copies are mostly unlike-aligned: a segment of a chunk starts at any element
// offset of the user's buffer, against a page-aligned slot. So a copy from 512 bytes to 4 MiB
// whose source and destination addresses differ modulo 64 goes through a vector loop; the rest
// stay with memcpy, which is at its best there on every CPU.
#pragma once

#include <cstddef>
#include <string>

namespace smddp::device {

// dst and src must not overlap.
void host_copy(void* dst, const void* src, size_t bytes);

// What host_copy uses for unlike-aligned copies: "avx2", "sse2" or "libc" (SMDDP_HOST_COPY, whose
// default auto picks the best loop the CPU has; libc off x86-64). For logs and benchmarks.
const char* host_copy_kind();

// Whether host_copy runs these bytes through its loop (where the CPU has one) or memcpy.
bool host_copy_takes_loop(const void* dst, const void* src, size_t bytes);

// host_copy as SMDDP_HOST_COPY=`kind` would make it, whatever the setting is (tests, A/B
// benchmarks). InvalidArgument for a kind that is not auto/libc/avx2/sse2 or that this CPU lacks.
void host_copy_as(const std::string& kind, void* dst, const void* src, size_t bytes);

}  // namespace smddp::device
