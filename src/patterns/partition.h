// Schedule maths shared by algorithms: how a count is split among ranks and into pipeline
// chunks. Pure functions, no I/O.
#pragma once

#include <algorithm>
#include <cstddef>

namespace smddp::patterns {

struct Range {
  size_t begin = 0;
  size_t count = 0;
  size_t end() const { return begin + count; }
};

// Block i of `parts` nearly equal blocks of `count` elements; the first count % parts blocks
// get one element more. Every element belongs to exactly one block.
inline Range block(size_t count, int parts, int i) {
  const size_t p = static_cast<size_t>(parts), k = static_cast<size_t>(i);
  const size_t base = count / p, extra = count % p;
  return {k * base + std::min(k, extra), base + (k < extra ? 1 : 0)};
}

// Number of chunks of at most `chunk` elements that cover `count` (0 for count 0).
inline size_t num_chunks(size_t count, size_t chunk) { return chunk ? (count + chunk - 1) / chunk : 0; }

// Chunk c of `count` elements cut into chunks of `chunk`.
inline Range chunk_at(size_t count, size_t chunk, size_t c) {
  const size_t b = c * chunk;
  return {b, std::min(chunk, count - b)};
}

}  // namespace smddp::patterns
