// Small, stable integer hashing (splitmix64) used to derive seeds: per-batch transform
// seeds in the loader and per-sample streams in the synthetic dataset. These functions are
// part of the reproducibility contract (a resumed run must derive the same seeds), so their
// outputs must never change.
#pragma once

#include <cstdint>

namespace largo::data {

// Advances `state` and returns the next splitmix64 output (Steele, Lea, Flood 2014).
inline uint64_t splitmix64_next(uint64_t& state) {
  state += 0x9e3779b97f4a7c15ULL;
  uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Mixes `value` into `seed`; order matters (hash_combine(a, b) != hash_combine(b, a)).
inline uint64_t hash_combine(uint64_t seed, uint64_t value) {
  uint64_t state = seed ^ (value * 0xd6e8feb86659fd93ULL);
  return splitmix64_next(state);
}

} // namespace largo::data
