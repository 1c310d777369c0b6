// Eight-float vectors in GCC's vector extension, shared by the CPU kernels. Kernel bodies are
// always_inline and compiled twice, into a target("avx2,fma") function and a baseline one, and
// the pick is made once at run time from the CPU's features, so one build runs on any x86-64.
// (GCC's target_clones("arch=...") dispatches on the CPU model, not its features, and chose the
// baseline on AMD machines: five times slower.)
#pragma once
#include <cstring>

namespace prelude_cpu {

typedef float v8f __attribute__((vector_size(32)));

__attribute__((always_inline)) static inline v8f load8(const float* p) {
    v8f v;
    std::memcpy(&v, p, sizeof(v));
    return v;
}

__attribute__((always_inline)) static inline void store8(float* p, v8f v) { std::memcpy(p, &v, sizeof(v)); }

__attribute__((always_inline)) static inline float hsum(v8f v) {
    return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

static inline bool has_avx2_fma() {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return false;
#endif
}

}  // namespace prelude_cpu
