// Eight-float vectors in GCC's vector extension, shared by the CPU kernels. Kernel bodies are
// always_inline and compiled twice, into a target("avx2,fma") function and a baseline one, and
// the pick is made once at run time from the CPU's features, so one build runs on any x86-64.
// (GCC's target_clones("arch=...") dispatches on the CPU model, not its features, and chose the
// baseline on AMD machines: five times slower.)
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace prelude_cpu {

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef float v16f __attribute__((vector_size(64)));  // AVX-512 kernels only

// Floats a vector of type F holds: eight, or sixteen in an AVX-512 kernel.
template <typename F>
constexpr long kWidth = (long)(sizeof(F) / sizeof(float));

template <typename F>
__attribute__((always_inline)) static inline F load_lanes(const float* p) {
    F v;
    std::memcpy(&v, p, sizeof(v));
    return v;
}

template <typename F>
__attribute__((always_inline)) static inline void store_lanes(float* p, F v) { std::memcpy(p, &v, sizeof(v)); }

// x in every lane, as one broadcast. GCC 12 lowers the same broadcast differently by context,
// and where it builds the vector lane by lane (a chain of inserts) the kernel loses most of its
// speed: the product panels need this form (a broadcast straight from memory; written once in
// a template over the width, it became the chain), `v8f{} + x` added the scalar to zero first,
// and an eight-x initializer was the chain. tests/bench/test_hot_paths.py's step guards time
// the kernels that show it.
__attribute__((always_inline)) static inline v8f splat(float x) {
    const v8f v = {x};
    return __builtin_shufflevector(v, v, 0, 0, 0, 0, 0, 0, 0, 0);
}

// The same for a kernel written over either width (the attention). There this template form is
// the broadcast, and splat's (called from the attention's template) was the chain.
template <typename F>
__attribute__((always_inline)) static inline F splat_lanes(float x) {
    const F v = {x};
    if constexpr (kWidth<F> == 8) return __builtin_shufflevector(v, v, 0, 0, 0, 0, 0, 0, 0, 0);
    else return __builtin_shufflevector(v, v, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
}

__attribute__((always_inline)) static inline v8f load8(const float* p) { return load_lanes<v8f>(p); }
__attribute__((always_inline)) static inline void store8(float* p, v8f v) { store_lanes(p, v); }

__attribute__((always_inline)) static inline float hsum(v8f v) {
    return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

// Whether any lane of an eight-lane comparison's mask is set (as four 64-bit words: one test).
__attribute__((always_inline)) static inline bool any_lane(v8i mask) {
    typedef long long v4q __attribute__((vector_size(32)));
    const v4q words = (v4q)mask;
    return words[0] | words[1] | words[2] | words[3];
}

// The largest of n floats (a NaN is passed over; -inf for none): a logits row's maximum.
__attribute__((always_inline)) static inline float max_of(const float* x, long n) {
    v8f top8 = splat(-INFINITY);
    long j = 0;
    for (; j + 8 <= n; j += 8) {
        const v8f v = load8(x + j);
        top8 = v > top8 ? v : top8;
    }
    float top = -INFINITY;
    for (long k = 0; k < 8; ++k) top = top8[k] > top ? top8[k] : top;
    for (; j < n; ++j) top = x[j] > top ? x[j] : top;
    return top;
}

// e^x for each lane of a float vector (eight, or sixteen in an AVX-512 kernel), within 2 ulp of expf over [-87, 88] (softmax arguments are <= 0): x =
// n ln2 + r with |r| <= ln2/2, e^r from its degree-6 Taylor-like minimax polynomial, 2^n built
// in the exponent bits. A scalar expf per score was a third of a decode step's attention.
template <typename V>
__attribute__((always_inline)) static inline V exp_lanes(V x) {
    using I = decltype(x < x);  // the int32 vector of the same lanes
    const V lo = V{} - 87.0f, hi = V{} + 88.0f;
    x = x < lo ? lo : x;
    x = x > hi ? hi : x;
    // Rounding to the nearest integer by adding 1.5 * 2^23: the sum's low mantissa bits hold n.
    const V shifter = V{} + 12582912.0f;
    V t = x * 1.44269504088896341f + shifter;
    V n = t - shifter;
    V r = x - n * 0.693359375f;     // ln2 in two parts, so r keeps its precision
    r = r - n * -2.12194440e-4f;
    V p = V{} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    I bits;
    std::memcpy(&bits, &t, sizeof(bits));
    I shifter_bits;
    std::memcpy(&shifter_bits, &shifter, sizeof(shifter_bits));
    I scale_bits = ((bits - shifter_bits) + 127) << 23;
    V scale;
    std::memcpy(&scale, &scale_bits, sizeof(scale));
    return p * scale;
}

__attribute__((always_inline)) static inline v8f exp8(v8f x) { return exp_lanes(x); }

// x * (1 + erf(x / sqrt 2)) / 2 for each lane (BERT's exact GELU): erf by Abramowitz and
// Stegun 7.1.26 (absolute error 1.5e-7, below fp32's spacing near 1).
template <typename V>
__attribute__((always_inline)) static inline V gelu_lanes(V v) {
    const V z = v * 0.70710678118654752f;
    const V a = z < 0.0f ? V{} - z : z;
    const V t = 1.0f / (1.0f + 0.3275911f * a);
    V p = V{} + 1.061405429f;
    p = p * t - 1.453152027f;
    p = p * t + 1.421413741f;
    p = p * t - 0.284496736f;
    p = p * t + 0.254829592f;
    const V erf_a = 1.0f - p * t * exp_lanes(V{} - a * a);
    const V erf_z = z < 0.0f ? V{} - erf_a : erf_a;
    return 0.5f * v * (1.0f + erf_z);
}

__attribute__((always_inline)) static inline v8f gelu8(v8f v) { return gelu_lanes(v); }

// The widest instruction set the kernels may pick, whatever the CPU has beyond it:
// PRELUDE_CPU_MAX_ISA=avx2 runs them as on a CPU without AVX-512 (so without its BF16, VNNI and
// AMX too), =baseline as on one without AVX2 either; unset, all the CPU has. So one machine runs
// the variants that another picks (tests/test_cpu_isa.py). Read once per process.
enum class Isa { baseline, avx2, avx512 };

static inline Isa max_isa() {
    static const Isa isa = [] {
        const char* set = std::getenv("PRELUDE_CPU_MAX_ISA");
        const std::string name = set == nullptr ? "" : set;
        return name == "baseline" ? Isa::baseline : name == "avx2" ? Isa::avx2 : Isa::avx512;
    }();
    return isa;
}

static inline bool has_avx2_fma() {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return max_isa() != Isa::baseline && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return false;
#endif
}

static inline bool has_avx512f() {
#if defined(__x86_64__) && defined(__GNUC__)
    static const bool has = [] {
        __builtin_cpu_init();
        return max_isa() == Isa::avx512 && __builtin_cpu_supports("avx512f");
    }();
    return has;
#else
    return false;
#endif
}

// From an always_inline body (NAME_body, or BODY), defines NAME_baseline and NAME_avx2 (x86-64
// only), and run_NAME, which calls the variant this CPU runs (picked once, on its first call).
#if defined(__x86_64__) && defined(__GNUC__)
#define PRELUDE_CPU_VARIANTS_OF(NAME, BODY, PARAMS, ARGS)                                     \
    typedef void (*NAME##_fn) PARAMS;                                                          \
    static void NAME##_baseline PARAMS { BODY ARGS; }                                          \
    __attribute__((target("avx2,fma"))) static void NAME##_avx2 PARAMS { BODY ARGS; }          \
    static void run_##NAME PARAMS {                                                            \
        static const NAME##_fn picked = has_avx2_fma() ? NAME##_avx2 : NAME##_baseline;        \
        picked ARGS;                                                                           \
    }
#else
#define PRELUDE_CPU_VARIANTS_OF(NAME, BODY, PARAMS, ARGS)                                     \
    static void NAME##_baseline PARAMS { BODY ARGS; }                                          \
    static void run_##NAME PARAMS { NAME##_baseline ARGS; }
#endif
#define PRELUDE_CPU_VARIANTS(NAME, PARAMS, ARGS) PRELUDE_CPU_VARIANTS_OF(NAME, NAME##_body, PARAMS, ARGS)

}  // namespace prelude_cpu
