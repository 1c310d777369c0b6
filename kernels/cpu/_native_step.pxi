# A decoder step's layers in one call, whole or resumable (included by _native.pyx).

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
