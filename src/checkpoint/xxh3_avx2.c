/* XXH3 compiled for AVX2 (src/checkpoint/CMakeLists.txt gives this file -mavx2 -O3 on x86-64). hash.cpp calls it
 * only where the CPU has AVX2, and otherwise uses its own built-in XXH3 (SSE2 on x86-64).
 * Every instruction set gives the same hash values: XXH3 is defined by its scalar algorithm, and the vector
 * code only computes the same accumulators faster. Only C and xxhash.h here, so that no inline C++ function
 * compiled with AVX2 can be picked by the linker for a caller on a CPU without it. */
#define XXH_INLINE_ALL
#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>

#if !defined(__AVX2__)
#error "xxh3_avx2.c must be compiled with -mavx2"
#endif

uint64_t h5ddp_xxh3_avx2_hash(const void* data, size_t n) {
  return XXH3_64bits(data, n);
}

void h5ddp_xxh3_avx2_update(void* state, const void* data, size_t n) {
  XXH3_64bits_update((XXH3_state_t*)state, data, n);
}
