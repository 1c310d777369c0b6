// Forced inlining, for the hot loops' helpers and lambdas. Also where inlining looks a given:
// GCC takes a function whose only effect is __builtin_prefetch for pure, and deletes a call to
// it that was not inlined early.
#pragma once

#define FT_INLINE inline __attribute__((always_inline))
#define FT_INLINE_LAMBDA __attribute__((always_inline))
