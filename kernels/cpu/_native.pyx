# distutils: language = c++
"""Native CPU kernels. No torch headers: tensors cross as data pointers, and the Python callers
(prelude/model/cpu_linear.py, prelude/executor/attention/torch_ref.py) check dtype, layout
and shapes first. Both run without the GIL."""
from libc.stdint cimport uint32_t

cdef extern from "weights.hpp" namespace "prelude_cpu" nogil:
    cdef struct Weight:
        const void* data
        const float* scales
        long format
        long layout
    void convert_rows(const float* w, long outputs, long inputs, long format, void* dst, float* scales, int threads)

cdef extern from "packed_gemm.hpp" namespace "prelude_cpu" nogil:
    long packed_elements(long outputs, long inputs)
    long panel_outputs(long outputs)
    void pack_weight(const float* w, long outputs, long inputs, long format, void* packed, float* scales,
                     int threads)

cdef extern from "linear.hpp" namespace "prelude_cpu" nogil:
    void linear_rows(const float* x, long n, const Weight& w, long inputs, float* out, long outputs, int threads,
                     const float* bias, long activation)

cdef extern from "vnni_gemm.hpp" namespace "prelude_cpu" nogil:
    bint has_avx512_vnni()


def int8_products() -> bool:
    """Whether a packed int8 weight's products run in int8 arithmetic on this CPU (AVX-512 VNNI),
    the rows quantized per row (kernels/cpu/vnni_gemm.hpp); else in fp32, the weight widened."""
    return has_avx512_vnni()

cdef extern from "bf16_gemm.hpp" namespace "prelude_cpu" nogil:
    bint has_avx512_bf16()
    cdef cppclass bf16:
        pass
    void bf16x3_gemm(const float* x, long n, const bf16* hi, const bf16* lo, long inputs,
                     float* out, long outputs, int threads, const float* bias, long activation)


def bf16_products() -> bool:
    """Whether a packed bf16 weight's products run in bf16 arithmetic on this CPU (AVX-512 BF16),
    the rows rounded to bf16 (kernels/cpu/bf16_gemm.hpp); else in fp32, the weight widened."""
    return has_avx512_bf16()

cdef extern from "amx_gemm.hpp" namespace "prelude_cpu" nogil:
    bint has_amx()


cdef extern from "simd.hpp" namespace "prelude_cpu" nogil:
    bint has_avx512f()


def wide_vectors() -> bool:
    """Whether the kernels that have sixteen-lane (AVX-512) variants run them on this CPU."""
    return has_avx512f()


def amx_products() -> bool:
    """Whether the bf16 and int8 products of whole 16-row tiles run on AMX's tiles on this CPU
    (and this process may use them; PRELUDE_CPU_AMX=0 turns them off), kernels/cpu/amx_gemm.hpp."""
    return has_amx()

cdef extern from "paged_attention.hpp" namespace "prelude_cpu" nogil:
    cdef struct PagedDecode:
        const float* q
        const float* k_cache
        const float* v_cache
        const long* block_tables
        const long* context_lens
        float* out
        long rows, heads, kv_heads, dim, block_size, table_width
        float scale
    void paged_decode_attention(const PagedDecode& a, int threads)


def packed_size(long outputs, long inputs) -> int:
    """Elements of pack_linear's copy of an [outputs, inputs] weight."""
    return packed_elements(outputs, inputs)


def scales_size(long outputs) -> int:
    """Floats of pack_linear's int8 scales of a weight of `outputs` rows: a scale per output
    (padded to whole panels), then as many int32 weight sums (kernels/cpu/packed_gemm.hpp)."""
    return 2 * panel_outputs(outputs)


def pack_linear(size_t w_ptr, long outputs, long inputs, long format, size_t packed_ptr, size_t scales_ptr,
                int threads) -> None:
    """Copies w [outputs, inputs] (fp32, contiguous) into packed panels at packed_ptr (packed_size
    elements of `format`: 0 fp32, 1 bf16, 2 int8, which also writes scales_size floats of
    per-output scales at scales_ptr)."""
    with nogil:
        pack_weight(<const float*>w_ptr, outputs, inputs, format, <void*>packed_ptr, <float*>scales_ptr, threads)


def convert_weight(size_t w_ptr, long outputs, long inputs, long format, size_t dst_ptr, size_t scales_ptr,
                   int threads) -> None:
    """Copies w [outputs, inputs] (fp32, contiguous) into the same layout in `format` at dst_ptr
    (int8: and its per-row scales, `outputs` floats, at scales_ptr)."""
    with nogil:
        convert_rows(<const float*>w_ptr, outputs, inputs, format, <void*>dst_ptr, <float*>scales_ptr, threads)


def matmul(size_t x_ptr, long n, size_t w_ptr, size_t scales_ptr, long format, long layout, long inputs,
           size_t out_ptr, long outputs, int threads, size_t bias_ptr=0, long activation=0) -> None:
    """out[n, outputs] = act(x[n, inputs] @ w.T + bias) (kernels/cpu/linear.hpp), x and out fp32; w
    in `format` (0 fp32, 1 bf16, 2 int8 with its scales) by rows (layout 0) or packed (1,
    pack_linear's); bias fp32 (0: none), activation 0 none or 1 GELU (the erf form). Contiguous,
    inputs % 8 == 0."""
    cdef Weight w
    w.data, w.scales, w.format, w.layout = <const void*>w_ptr, <const float*>scales_ptr, format, layout
    with nogil:
        linear_rows(<const float*>x_ptr, n, w, inputs, <float*>out_ptr, outputs, threads, <const float*>bias_ptr,
                    activation)


def matmul_bf16x3(size_t x_ptr, long n, size_t hi_ptr, size_t lo_ptr, long inputs, size_t out_ptr, long outputs,
                  int threads, size_t bias_ptr=0, long activation=0) -> None:
    """As matmul, for an fp32 weight kept as the bf16 panels (pack_linear's, format 1) of its
    rounding (hi) and of the rest (lo): three bf16 products on AMX (amx_products() must be True),
    inputs % 32 == 0."""
    with nogil:
        bf16x3_gemm(<const float*>x_ptr, n, <const bf16*>hi_ptr, <const bf16*>lo_ptr, inputs, <float*>out_ptr,
                    outputs, threads, <const float*>bias_ptr, activation)


def paged_decode(size_t q_ptr, size_t k_ptr, size_t v_ptr, size_t tables_ptr, size_t lens_ptr, size_t out_ptr,
                 long rows, long heads, long kv_heads, long dim, long block_size, long table_width,
                 float scale, int threads) -> None:
    """out[r, h] = softmax(q[r, h] . K[r]^T * scale) V[r] over the first lens[r] keys of row r's
    blocks (tables [rows, table_width], int64); q/out [rows, heads, dim] and the caches
    [blocks, block_size, kv_heads, dim] fp32 contiguous, dim % 8 == 0."""
    cdef PagedDecode a
    a.q = <const float*>q_ptr
    a.k_cache = <const float*>k_ptr
    a.v_cache = <const float*>v_ptr
    a.block_tables = <const long*>tables_ptr
    a.context_lens = <const long*>lens_ptr
    a.out = <float*>out_ptr
    a.rows, a.heads, a.kv_heads, a.dim = rows, heads, kv_heads, dim
    a.block_size, a.table_width, a.scale = block_size, table_width, scale
    with nogil:
        paged_decode_attention(a, threads)


cdef extern from "prefill_attention.hpp" namespace "prelude_cpu" nogil:
    cdef struct PrefillAttention:
        const float* q
        const float* k
        const float* v
        float* out
        long n, m, heads, kv_heads, dim, q_stride, k_stride, v_stride
        float scale
        const float* k_cache
        const float* v_cache
        const long* block_table
        long context, block_size, cache_block_stride, cache_token_stride
        bint bidirectional
    void prefill_attention(const PrefillAttention& a, int threads)


cdef extern from "encoder_attention.hpp" namespace "prelude_cpu" nogil:
    void encoder_rows_attention(const PrefillAttention& step, const long* spans, long rows, int threads)


def causal_prefill(size_t q_ptr, size_t k_ptr, size_t v_ptr, size_t out_ptr, long n, long fresh, long heads,
                   long kv_heads, long dim, long q_stride, long k_stride, long v_stride, size_t k_cache_ptr,
                   size_t v_cache_ptr, size_t table_ptr, long context, long block_size, long block_stride,
                   long token_stride, float scale, int threads) -> None:
    """out[i, h] = softmax(q[i, h] . K^T * scale) V over keys [0, context + fresh - n + i] of K/V's
    head h // (heads / kv_heads): the first `context` keys in the KV cache's blocks (table int64:
    token j in block table[j // block_size]; blocks block_stride floats apart, tokens
    token_stride), then the `fresh` rows of k/v, whose last n are q's tokens. q [n, heads, dim],
    k/v [fresh, kv_heads, dim], each with its token stride (heads contiguous within a token, in
    the cache too), out [n, heads, dim] contiguous; fp32, dim % 8 == 0."""
    cdef PrefillAttention a
    a.q, a.k, a.v, a.out = <const float*>q_ptr, <const float*>k_ptr, <const float*>v_ptr, <float*>out_ptr
    a.n, a.m, a.heads, a.kv_heads, a.dim = n, context + fresh, heads, kv_heads, dim
    a.q_stride, a.k_stride, a.v_stride, a.scale = q_stride, k_stride, v_stride, scale
    a.k_cache, a.v_cache, a.block_table = <const float*>k_cache_ptr, <const float*>v_cache_ptr, <const long*>table_ptr
    a.context, a.block_size, a.cache_block_stride, a.cache_token_stride = context, block_size, block_stride, token_stride
    with nogil:
        prefill_attention(a, threads)


def bidirectional_rows(size_t q_ptr, size_t k_ptr, size_t v_ptr, size_t out_ptr, size_t spans_ptr, long rows,
                       long heads, long dim, long q_stride, long k_stride, long v_stride, float scale,
                       int threads) -> None:
    """An encoder step's attention, every row at once: row r is tokens [spans[2r], spans[2r + 1])
    (spans int64), out[i, h] = softmax(q[i, h] . K^T * scale) V over every key of i's row in head
    h. q, k, v [tokens, heads, dim] of the step, each with its token stride; out [tokens,
    heads, dim] contiguous; fp32, dim % 8 == 0 (rows on AMX's tiles: bf16x3, within a few 2^-16)."""
    cdef PrefillAttention a
    a.q, a.k, a.v, a.out = <const float*>q_ptr, <const float*>k_ptr, <const float*>v_ptr, <float*>out_ptr
    a.n, a.m, a.heads, a.kv_heads, a.dim = 0, 0, heads, heads, dim
    a.q_stride, a.k_stride, a.v_stride, a.scale = q_stride, k_stride, v_stride, scale
    a.k_cache, a.v_cache, a.block_table = <const float*>NULL, <const float*>NULL, <const long*>NULL
    a.context, a.block_size, a.cache_block_stride, a.cache_token_stride = 0, 1, 0, 0
    a.bidirectional = True
    with nogil:
        encoder_rows_attention(a, <const long*>spans_ptr, rows, threads)


cdef extern from "elementwise.hpp" namespace "prelude_cpu" nogil:
    cdef struct Strided3:
        const float* ptr
        long rows, heads, dim, row_stride, head_stride
    void run_rms_norm(Strided3 x, const float* weight, float eps, const float* residual, float* residual_out,
                      float* out)
    void run_rotate(Strided3 x, const float* cos, const float* sin, long cs_stride, float* out)
    void run_silu_and_mul(const float* x, long rows, long width, float* out)
    void run_gelu_and_mul(const float* x, long rows, long width, float* out)
    void team_rms_norm(Strided3 x, const float* weight, float eps, const float* residual, float* residual_out,
                       float* out, int threads)
    void team_rotate(Strided3 x, const float* cos, const float* sin, long cs_stride, float* out, int threads)
    void team_gated(bint gelu, const float* x, long rows, long width, float* out, int threads)
    void team_layer_norm(const float* x, const float* residual, long rows, long dim, const float* weight,
                         const float* bias, float eps, float* out, int threads)
    void run_gelu(const float* x, float* out, long n)

cdef extern from "team.hpp" namespace "prelude_cpu" nogil:
    int threads_worth(long floats, int threads)
    void hold_team(bint held)


def team_held(held: bool) -> None:
    """Holds the kernels' thread team (True) until released (False): between native calls its
    workers wait for the next one instead of sleeping. Held across a run of native calls with
    Python between them; holds nest."""
    hold_team(held)


cdef Strided3 _strided3(size_t ptr, long rows, long heads, long dim, long row_stride, long head_stride):
    cdef Strided3 s
    s.ptr = <const float*>ptr
    s.rows, s.heads, s.dim, s.row_stride, s.head_stride = rows, heads, dim, row_stride, head_stride
    return s


# The elementwise kernels keep the GIL on few rows (a decode step's: a microsecond or two, less
# than handing the GIL to the event loop and getting it back) and let it go on a prompt's many,
# which they split across the thread team.
def rms_norm(size_t x_ptr, long rows, long heads, long dim, long row_stride, long head_stride, size_t weight_ptr,
             float eps, size_t residual_ptr, size_t residual_out_ptr, size_t out_ptr, int threads) -> None:
    """out = weight * v / sqrt(mean(v^2) + eps) per [dim] vector, v = x (+ residual, written to
    residual_out; 0 pointers when absent). x strided over rows and heads, the rest contiguous."""
    cdef Strided3 x = _strided3(x_ptr, rows, heads, dim, row_stride, head_stride)
    threads = threads_worth(rows * heads * dim, threads)
    if threads == 1:
        run_rms_norm(x, <const float*>weight_ptr, eps, <const float*>residual_ptr, <float*>residual_out_ptr,
                     <float*>out_ptr)
        return
    with nogil:
        team_rms_norm(x, <const float*>weight_ptr, eps, <const float*>residual_ptr, <float*>residual_out_ptr,
                      <float*>out_ptr, threads)


def rotate(size_t x_ptr, long rows, long heads, long dim, long row_stride, long head_stride, size_t cos_ptr,
           size_t sin_ptr, long cs_stride, size_t out_ptr, int threads) -> None:
    """Neox rotary embedding of x (strided over rows and heads) into contiguous out."""
    cdef Strided3 x = _strided3(x_ptr, rows, heads, dim, row_stride, head_stride)
    threads = threads_worth(rows * heads * dim, threads)
    if threads == 1:
        run_rotate(x, <const float*>cos_ptr, <const float*>sin_ptr, cs_stride, <float*>out_ptr)
        return
    with nogil:
        team_rotate(x, <const float*>cos_ptr, <const float*>sin_ptr, cs_stride, <float*>out_ptr, threads)


def silu_and_mul(size_t x_ptr, long rows, long width, size_t out_ptr, int threads) -> None:
    """out[rows, width] = silu(x[:, :width]) * x[:, width:], both contiguous."""
    _gated(False, x_ptr, rows, width, out_ptr, threads)


def gelu_and_mul(size_t x_ptr, long rows, long width, size_t out_ptr, int threads) -> None:
    """out[rows, width] = gelu(x[:, :width]) * x[:, width:] (the erf GELU), both contiguous."""
    _gated(True, x_ptr, rows, width, out_ptr, threads)


cdef void _gated(bint gelu, size_t x_ptr, long rows, long width, size_t out_ptr, int threads):
    threads = threads_worth(2 * rows * width, threads)
    if threads == 1:
        if gelu:
            run_gelu_and_mul(<const float*>x_ptr, rows, width, <float*>out_ptr)
        else:
            run_silu_and_mul(<const float*>x_ptr, rows, width, <float*>out_ptr)
        return
    with nogil:
        team_gated(gelu, <const float*>x_ptr, rows, width, <float*>out_ptr, threads)


# An encoder's LayerNorm runs on the team (where its rows are worth it), without the GIL; its GELU
# on the calling thread, GIL held: kernels/cpu/ops.py hands it only a few rows (BERT's runs in
# its dense layer's epilogue, larger ones stay on torch's threads).
def layer_norm(size_t x_ptr, size_t residual_ptr, long rows, long dim, size_t weight_ptr, size_t bias_ptr,
               float eps, size_t out_ptr, int threads) -> None:
    """out = LayerNorm(x (+ residual)) * weight (+ bias) per row; 0 pointers when absent; all
    contiguous [rows, dim]; rows split across `threads` of the team where it pays."""
    with nogil:
        team_layer_norm(<const float*>x_ptr, <const float*>residual_ptr, rows, dim, <const float*>weight_ptr,
                        <const float*>bias_ptr, eps, <float*>out_ptr, threads_worth(rows * dim, threads))


def gelu(size_t x_ptr, size_t out_ptr, long n) -> None:
    """out = GELU(x) (the erf form; out may be x), n floats, n % 8 == 0."""
    run_gelu(<const float*>x_ptr, <float*>out_ptr, n)


cdef extern from "step_layers.hpp" namespace "prelude_cpu" nogil:
    cdef struct LayerWeights:
        pass
    cdef struct ModelShape:
        long hidden, heads, kv_heads, dim, intermediate, block_size
        float eps
    cdef struct StepRows:
        long rows, tokens, decode_from
        const long* query_starts
        const long* context_lens
        const long* block_tables
        long table_width
        const float* rope
        const long* positions
        const long* slots
        const long* keep
        long kept
        const long* item_starts
        const long* item_lengths
    cdef cppclass StepProgress:
        StepProgress() except +
    void step_layers(const ModelShape& m, const LayerWeights* layers, long num_layers, const float* final_norm,
                     const StepRows& r, float* x, int threads)
    bint advance_step(const ModelShape& m, const LayerWeights* layers, long num_layers, const float* final_norm,
                      const StepRows& r, float* x, StepProgress& s, long segment_macs, const int* stop,
                      int threads) except +


cdef ModelShape _model_shape(long hidden, long heads, long kv_heads, long dim, long intermediate, long block_size,
                             float eps):
    cdef ModelShape m
    m.hidden, m.heads, m.kv_heads, m.dim = hidden, heads, kv_heads, dim
    m.intermediate, m.block_size, m.eps = intermediate, block_size, eps
    return m


cdef StepRows _step_rows(long rows, long tokens, long decode_from, size_t starts_ptr, size_t lens_ptr,
                         size_t tables_ptr, long table_width, size_t rope_ptr, size_t positions_ptr,
                         size_t slots_ptr, size_t keep_ptr, long kept, size_t item_starts_ptr,
                         size_t item_lengths_ptr):
    cdef StepRows r
    r.rows, r.tokens, r.decode_from = rows, tokens, decode_from
    r.query_starts, r.context_lens = <const long*>starts_ptr, <const long*>lens_ptr
    r.block_tables, r.table_width, r.rope = <const long*>tables_ptr, table_width, <const float*>rope_ptr
    r.positions, r.slots = <const long*>positions_ptr, <const long*>slots_ptr
    r.keep, r.kept = <const long*>keep_ptr, kept
    r.item_starts, r.item_lengths = <const long*>item_starts_ptr, <const long*>item_lengths_ptr
    return r


def forward_step(size_t layers_ptr, long num_layers, size_t final_norm_ptr, long hidden, long heads, long kv_heads,
                 long dim, long intermediate, long block_size, float eps, long rows, long tokens, long decode_from,
                 size_t starts_ptr, size_t lens_ptr, size_t tables_ptr, long table_width, size_t rope_ptr,
                 size_t positions_ptr, size_t slots_ptr, size_t keep_ptr, long kept, size_t item_starts_ptr,
                 size_t item_lengths_ptr, size_t x_ptr, int threads) -> None:
    """Runs every decoder layer and the final norm over x [tokens, hidden] (the step's
    embeddings) in place, and writes the stored tokens' K/V at their slots. Rows: query starts
    [rows + 1], cached lengths [rows], block tables [rows, table_width]; rows from decode_from on
    hold one stored token each. Per token: positions and slots (-1: not stored). keep: `kept`
    increasing token indices whose states are wanted (0: all), written to x's first rows.
    Multi-item rows: row i's items have lengths item_lengths[item_starts[i]:item_starts[i + 1]]
    (both 0: no row has items). `layers_ptr`: num_layers rows of LayerWeights' 23 fields
    (kernels/cpu/step_layers.hpp).
    int64 and fp32, contiguous."""
    cdef ModelShape m = _model_shape(hidden, heads, kv_heads, dim, intermediate, block_size, eps)
    cdef StepRows r = _step_rows(rows, tokens, decode_from, starts_ptr, lens_ptr, tables_ptr, table_width, rope_ptr,
                                 positions_ptr, slots_ptr, keep_ptr, kept, item_starts_ptr, item_lengths_ptr)
    with nogil:
        step_layers(m, <const LayerWeights*>layers_ptr, num_layers, <const float*>final_norm_ptr, r, <float*>x_ptr,
                    threads)


cdef class ResumableStep:
    """forward_step's work, run in calls that each stop once the int32 at a stop flag's address
    is nonzero between two pieces of about `segment_macs` multiply-adds, and go on from there
    the next time. The caller keeps every tensor the pointers name alive until it finished."""

    cdef ModelShape m
    cdef StepRows r
    cdef const LayerWeights* layers
    cdef long num_layers
    cdef const float* final_norm
    cdef float* x
    cdef long segment_macs
    cdef int threads
    cdef StepProgress* progress

    def __cinit__(self, size_t layers_ptr, long num_layers, size_t final_norm_ptr, long hidden, long heads,
                  long kv_heads, long dim, long intermediate, long block_size, float eps, long rows, long tokens,
                  long decode_from, size_t starts_ptr, size_t lens_ptr, size_t tables_ptr, long table_width,
                  size_t rope_ptr, size_t positions_ptr, size_t slots_ptr, size_t keep_ptr, long kept,
                  size_t item_starts_ptr, size_t item_lengths_ptr, size_t x_ptr, int threads, long segment_macs):
        self.m = _model_shape(hidden, heads, kv_heads, dim, intermediate, block_size, eps)
        self.r = _step_rows(rows, tokens, decode_from, starts_ptr, lens_ptr, tables_ptr, table_width, rope_ptr,
                            positions_ptr, slots_ptr, keep_ptr, kept, item_starts_ptr, item_lengths_ptr)
        self.layers, self.num_layers = <const LayerWeights*>layers_ptr, num_layers
        self.final_norm, self.x = <const float*>final_norm_ptr, <float*>x_ptr
        self.segment_macs, self.threads = segment_macs, threads
        self.progress = new StepProgress()

    def __dealloc__(self):
        del self.progress

    def advance(self, size_t stop_ptr) -> bool:
        """Runs on until the step finished (True) or the flag stopped it (False)."""
        cdef bint done
        with nogil:
            done = advance_step(self.m, self.layers, self.num_layers, self.final_norm, self.r, self.x,
                                self.progress[0], self.segment_macs, <const int*>stop_ptr, self.threads)
        return done


cdef extern from "sample.hpp" namespace "prelude_cpu" nogil:
    cdef struct SampleRows:
        const float* logits
        long rows, vocab, row_stride
        const float* inv_temperature
        const double* uniforms
        long* out
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
                  size_t uniforms_ptr, size_t out_ptr, int threads) -> None:
    """out[r] = the token drawn from softmax(logits[r] * inv_temperature[r]) by inverse CDF at
    uniforms[r] (float64 in [0, 1)); logits fp32 rows of `row_stride`, out int64."""
    cdef SampleRows s
    s.logits, s.rows, s.vocab, s.row_stride = <const float*>logits_ptr, rows, vocab, row_stride
    s.inv_temperature, s.uniforms, s.out = <const float*>inv_temperature_ptr, <const double*>uniforms_ptr, <long*>out_ptr
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
