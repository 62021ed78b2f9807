// LARGO_SIMD_CLONES before a function with a hot loop the compiler vectorises: on x86-64
// with glibc (the loader's IFUNC support) it is compiled twice, for the baseline (SSE2, where a
// 32-bit integer product takes several instructions) and for AVX2 (eight per instruction), and the
// dynamic loader picks one for the CPU. AVX2 without FMA: float expressions are not contracted, so
// the results are the same bytes either way. Private to the data layer.
#pragma once

#include <cstddef> // defines __GLIBC__ where it applies

#if defined(__x86_64__) && defined(__GLIBC__) && (defined(__GNUC__) || defined(__clang__))
#define LARGO_SIMD_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define LARGO_SIMD_CLONES
#endif
