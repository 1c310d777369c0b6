# Work over the vocabulary: sampling, argmax, logprobs, grammar masks (included by _native.pyx).
from libc.stdint cimport uint32_t


cdef extern from "sample.hpp" namespace "prelude_cpu" nogil:
    cdef struct SampleRows:
        const float* logits
        long rows, vocab, row_stride
        const float* inv_temperature
        const double* uniforms
        long* out
        const float* min_p
        const long* top_k
        const float* top_p
    void sample_rows(const SampleRows& s, int threads)
    cdef struct GreedyRows:
        const float* logits
        long rows, vocab, row_stride
        long* out
    void greedy_rows(const GreedyRows& g, int threads)
    cdef struct MaskRows:
        float* logits
        long rows, vocab, row_stride
        const uint32_t* bitmask
        long words
        const long* logits_rows
    void mask_rows(const MaskRows& m, int threads)


def sample_tokens(size_t logits_ptr, long rows, long vocab, long row_stride, size_t inv_temperature_ptr,
                  size_t uniforms_ptr, size_t out_ptr, int threads, size_t min_p_ptr=0, size_t top_k_ptr=0,
                  size_t top_p_ptr=0) -> None:
    """out[r] = the token drawn from softmax(logits[r] * inv_temperature[r]) by inverse CDF at
    uniforms[r] (float64 in [0, 1)); logits fp32 rows of `row_stride`, out int64. The optional
    per-row cuts (0: no row makes that cut): min_p fp32, top_k int64, top_p fp32."""
    cdef SampleRows s
    s.logits, s.rows, s.vocab, s.row_stride = <const float*>logits_ptr, rows, vocab, row_stride
    s.inv_temperature, s.uniforms, s.out = <const float*>inv_temperature_ptr, <const double*>uniforms_ptr, <long*>out_ptr
    s.min_p, s.top_k, s.top_p = <const float*>min_p_ptr, <const long*>top_k_ptr, <const float*>top_p_ptr
    with nogil:
        sample_rows(s, threads)


def greedy_tokens(size_t logits_ptr, long rows, long vocab, long row_stride, size_t out_ptr, int threads) -> None:
    """out[r] = the first index of the largest of logits[r] (torch.argmax's, a NaN the largest);
    logits fp32 rows of `row_stride`, out int64."""
    cdef GreedyRows g
    g.logits, g.rows, g.vocab, g.row_stride, g.out = <const float*>logits_ptr, rows, vocab, row_stride, <long*>out_ptr
    with nogil:
        greedy_rows(g, threads)


cdef extern from "logprobs.hpp" namespace "prelude_cpu" nogil:
    cdef struct LogprobRows:
        const float* logits
        long rows, vocab, row_stride
        const long* targets
        long top
        float* logprobs
        long* ranks
        long* top_ids
        float* top_logprobs
    void logprob_rows(const LogprobRows& p, int threads)


def token_logprobs(size_t logits_ptr, long rows, long vocab, long row_stride, size_t targets_ptr, long top,
                   size_t logprobs_ptr, size_t ranks_ptr, size_t top_ids_ptr, size_t top_logprobs_ptr,
                   int threads) -> None:
    """For each fp32 logits row r (`row_stride` apart): logprobs[r] and ranks[r] of token
    targets[r], and its `top` most likely tokens (top_ids, top_logprobs: [rows, top], best
    first; -1 and -inf past the row's finite logits). int64 ids and ranks, fp32 logprobs."""
    cdef LogprobRows p
    p.logits, p.rows, p.vocab, p.row_stride = <const float*>logits_ptr, rows, vocab, row_stride
    p.targets, p.top, p.logprobs, p.ranks = <const long*>targets_ptr, top, <float*>logprobs_ptr, <long*>ranks_ptr
    p.top_ids, p.top_logprobs = <long*>top_ids_ptr, <float*>top_logprobs_ptr
    with nogil:
        logprob_rows(p, threads)


def mask_logits(size_t logits_ptr, long rows, long vocab, long row_stride, size_t bitmask_ptr, long words,
                size_t logits_rows_ptr, int threads) -> None:
    """logits[logits_rows[r], t] = -inf where bit t of bitmask row r is 0 (int32 words, bit 0
    first); logits fp32 rows of `row_stride`, logits_rows int64."""
    cdef MaskRows m
    m.logits, m.rows, m.vocab, m.row_stride = <float*>logits_ptr, rows, vocab, row_stride
    m.bitmask, m.words, m.logits_rows = <const uint32_t*>bitmask_ptr, words, <const long*>logits_rows_ptr
    with nogil:
        mask_rows(m, threads)
