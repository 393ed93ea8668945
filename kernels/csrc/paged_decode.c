/* Paged decode attention on the CPU, fp32: what the torch path does with a gather, a bmm, a
 * softmax and a second bmm, done in one pass over each request's blocks.
 *
 * The torch path copies every request's K and V window into a head-major buffer before it
 * multiplies (three trips through memory per byte of KV). Here each request's task walks its
 * block table and reads each key and value row once, straight from the paged cache: pass 1
 * scores the G = Hq / Hkv query heads of each kv head against each key, then a softmax per
 * head (joined with the request's cascade prefix states, if any), then pass 2 accumulates the
 * weighted values. Natural-log LSE, as everywhere in eclectus.kernels. Built and loaded by
 * kernels/native.py.
 *
 * Caches may have any strides for (block, slot, head); the head_dim stride must be 1.
 * q, o: [B, Hq, D] contiguous. lse: [B, Hq]. block_tables: int32 with row stride bt_stride.
 * kv_starts may be NULL (every window starts at token 0). An empty window gives o = 0,
 * lse = -inf.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline float dot(const float *restrict a, const float *restrict b, int n) {
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int i = 0; i < n; ++i) acc += a[i] * b[i];
    return acc;
}

/* e^x for x <= 0, to ~2e-7 relative: 2^n * e^r with |r| <= ln2 / 2 and a degree-6 Taylor
 * polynomial. Written so the softmax loop vectorizes; libm's expf is called one value at a
 * time (its vector form needs -ffast-math, which would also break the -inf handling). */
static inline float exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x; /* e^-87 ~ 1.6e-38: still a normal float */
    const float n = floorf(x * 1.44269504f + 0.5f);
    const float r = (x - n * 0.693145752f) - n * 1.42860677e-6f;
    const float p =
        1.0f + r * (1.0f + r * (0.5f + r * (1.6666667e-1f +
                   r * (4.1666668e-2f + r * (8.3333338e-3f + r * 1.3888889e-3f)))));
    const int32_t bits = ((int32_t)n + 127) << 23;
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return p * two_n;
}

static inline void axpy(float *restrict y, float a, const float *restrict x, int n) {
#pragma omp simd
    for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

/* ---- Each request's own window (plain decode, and the cascade's suffix pass + merge) --------
 * One task per request walks its block table twice: keys, then values, each block with all its
 * kv heads at once (one contiguous run of the pool per block and pass, where head by head the
 * runs are half as long: on the 2-core VM, whose decode windows come from memory, that
 * measured ~0.2-0.3 ms of ~2.6 ms per step at prefix-1x2048; software prefetch of the next block
 * did not pay). Scores come KEY_CHUNK keys at a time: each key's dot product is a vector of
 * partial sums, and one transpose-reduce (hsum16) turns sixteen of them into one vector of
 * sixteen scores, where a horizontal sum per key costs ~8 shuffles and adds. The values pass
 * keeps two heads x 64 floats of output in registers across a block's rows.
 *
 * The cascade's merge is folded in: a request's prefix states (o_j, lse_j: its rows of the
 * prefix pass) are known before its values pass, so the softmax normalises against the union
 * of its own keys and its prefixes, and the values accumulate onto sum_j c_j o_j: o is
 * written once and no merge pass runs.
 */
typedef float v16 __attribute__((vector_size(16 * sizeof(float)), aligned(4)));
#define KEY_CHUNK 16       /* keys scored together: one per lane of a v16 */
#define STACK_SCRATCH 4096 /* floats of per-request scratch kept on the stack (16 KiB) */

#if defined(__clang__)
#define SHUFFLE(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
typedef int32_t v16i __attribute__((vector_size(16 * sizeof(int32_t))));
#define SHUFFLE(a, b, ...) __builtin_shuffle(a, b, (v16i){__VA_ARGS__})
#endif
#define ALWAYS_INLINE static inline __attribute__((always_inline))

static inline v16 load16(const float *p) { return *(const v16 *)p; }
static inline void store16(float *p, v16 x) { *(v16 *)p = x; }

/* Lane i of the result is the sum of x[i]'s lanes: four levels of pairwise shuffles and adds,
 * each halving the partial sums per vector (15 steps for 16 vectors). */
ALWAYS_INLINE v16 hsum16(const v16 x[16]) {
    v16 a[8], b[4], c[2];
    for (int i = 0; i < 8; ++i) /* a[i]: x[2i]'s 8 partial sums, then x[2i + 1]'s */
        a[i] = SHUFFLE(x[2 * i], x[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21,
                       22, 23) +
               SHUFFLE(x[2 * i], x[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28,
                       29, 30, 31);
    for (int i = 0; i < 4; ++i) /* b[i]: 4 partials each of x[4i .. 4i + 3] */
        b[i] = SHUFFLE(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25,
                       26, 27) +
               SHUFFLE(a[2 * i], a[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28,
                       29, 30, 31);
    for (int i = 0; i < 2; ++i) /* c[i]: 2 partials each of x[8i .. 8i + 7] */
        c[i] = SHUFFLE(b[2 * i], b[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25,
                       28, 29) +
               SHUFFLE(b[2 * i], b[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26,
                       27, 30, 31);
    return SHUFFLE(c[0], c[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
           SHUFFLE(c[0], c[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

/* s[g * s_stride + t] = q_g . k_t for the G query rows at q (row stride D) and the n <=
 * KEY_CHUNK keys at k (row stride s_slot). All KEY_CHUNK floats of each score row are written
 * (lanes past n repeat key n - 1). Inlined per head size, so a 64-wide dot unrolls with the
 * query in registers. */
ALWAYS_INLINE void score_chunk(const float *restrict q, int G, int D, const float *k,
                               int64_t s_slot, int n, float *restrict s, int64_t s_stride) {
    const int D16 = D / 16 * 16;
    for (int g = 0; g < G; ++g) {
        const float *qg = q + (int64_t)g * D;
        v16 acc[KEY_CHUNK];
#pragma GCC unroll 16
        for (int t = 0; t < KEY_CHUNK; ++t) {
            const float *kt = k + (int64_t)(t < n ? t : n - 1) * s_slot;
            v16 a = {0};
            for (int d = 0; d < D16; d += 16) a += load16(qg + d) * load16(kt + d);
            acc[t] = a;
        }
        float *sg = s + g * s_stride;
        store16(sg, hsum16(acc));
        if (D16 < D) /* a head size off the vector width: the last columns one by one */
            for (int t = 0; t < n; ++t) sg[t] += dot(qg + D16, k + t * s_slot + D16, D - D16);
    }
}

/* out[g][c0 + d] += sum_t w[g * w_stride + t] v_t[c0 + d] for NG query heads, NC * 16
 * columns from c0 and the n value rows at v (row stride s_slot): the NG x NC accumulators stay
 * in registers across the rows. Inlined per (NG, NC). */
ALWAYS_INLINE void values_tile(const float *v, int64_t s_slot, int n, const float *restrict w,
                               int64_t w_stride, float *restrict out, int D, int c0,
                               const int NG, const int NC) {
    v16 acc[2][4];
    for (int g = 0; g < NG; ++g)
        for (int c = 0; c < NC; ++c) acc[g][c] = load16(out + g * D + c0 + 16 * c);
    v += c0;
    for (int t = 0; t < n; ++t, v += s_slot) {
        v16 x[4];
        for (int c = 0; c < NC; ++c) x[c] = load16(v + 16 * c);
        for (int g = 0; g < NG; ++g) {
            const float p = w[g * w_stride + t];
            for (int c = 0; c < NC; ++c) acc[g][c] += p * x[c];
        }
    }
    for (int g = 0; g < NG; ++g)
        for (int c = 0; c < NC; ++c) store16(out + g * D + c0 + 16 * c, acc[g][c]);
}

/* values_tile over one kv head's G query heads and all D columns for the n value rows at v:
 * tiles of two heads x 64 columns, then the columns past the last multiple of 16 one by one. */
static void head_values(const float *v, int64_t s_slot, int n, const float *w, int64_t w_stride,
                        float *out, int G, int D) {
#define TILE(ng, nc) \
    values_tile(v, s_slot, n, w + g * w_stride, w_stride, out + g * D, D, c0, ng, nc)
    const int D16 = D / 16 * 16;
    for (int g = 0; g < G; g += 2)
        for (int c0 = 0; c0 < D16; c0 += 64) {
            const int nc = (D16 - c0) / 16 < 4 ? (D16 - c0) / 16 : 4;
            if (G - g >= 2)
                nc == 4 ? TILE(2, 4) : nc == 3 ? TILE(2, 3) : nc == 2 ? TILE(2, 2) : TILE(2, 1);
            else
                nc == 4 ? TILE(1, 4) : nc == 3 ? TILE(1, 3) : nc == 2 ? TILE(1, 2) : TILE(1, 1);
        }
#undef TILE
    if (D16 < D)
        for (int t = 0; t < n; ++t)
            for (int g = 0; g < G; ++g)
                axpy(out + g * D + D16, w[g * w_stride + t], v + t * s_slot + D16, D - D16);
}

/* The values pass over the window [start, end): block by block, all kv heads of a block
 * together (like the scores), accumulating onto o. */
static void window_values(const float *v_cache, int64_t s_block, int64_t s_slot, int64_t s_head,
                          const int32_t *table, int start, int end, int block_size, int Hq,
                          int Hkv, int D, const float *w, int64_t w_stride, float *o) {
    const int G = Hq / Hkv;
    for (int first = start; first < end;) {
        const int within = first % block_size;
        const int n = (block_size - within < end - first) ? block_size - within : end - first;
        const float *block =
            v_cache + (int64_t)table[first / block_size] * s_block + within * s_slot;
        for (int h = 0; h < Hkv; ++h)
            head_values(block + h * s_head, s_slot, n,
                        w + (int64_t)h * G * w_stride + (first - start), w_stride,
                        o + (int64_t)h * G * D, G, D);
        first += n;
    }
}

/* Scores of the window [start, end) into s ([Hq][s_stride], by query head), for queries q
 * already scaled: block by block, all kv heads of a block together. */
static void window_scores(const float *q, const float *k_cache, int64_t s_block, int64_t s_slot,
                          int64_t s_head, const int32_t *table, int start, int end,
                          int block_size, int Hq, int Hkv, int D, float *s, int64_t s_stride) {
    const int G = Hq / Hkv;
    for (int first = start; first < end;) {
        const int within = first % block_size;
        int n = (block_size - within < end - first) ? block_size - within : end - first;
        n = n < KEY_CHUNK ? n : KEY_CHUNK;
        const int64_t at = (int64_t)table[first / block_size] * s_block + within * s_slot;
        for (int h = 0; h < Hkv; ++h) {
            const float *qh = q + (int64_t)h * G * D, *k = k_cache + at + h * s_head;
            float *sh = s + (int64_t)h * G * s_stride + (first - start);
            if (D == 64)
                score_chunk(qh, G, 64, k, s_slot, n, sh, s_stride);
            else
                score_chunk(qh, G, D, k, s_slot, n, sh, s_stride);
        }
        first += n;
    }
}

/* The softmax of query head row s (L scores) joined with the request's prefix states
 * lse_j = lse_mem[rows[j] * Hq]: turns s into the weights of its own keys in the union and
 * writes the prefixes' part sum_j c_j o_j (o_j = o_mem + rows[j] * Hq * D) into out, so the
 * values pass accumulates onto it. Returns the union's LSE; -inf when it is empty (then out = 0
 * and no weights are needed). */
static float join_softmax(float *restrict s, int L, const float *o_mem, const float *lse_mem,
                          const int32_t *rows, int num_rows, int Hq, int D,
                          float *restrict out) {
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int i = 0; i < L; ++i) m = s[i] > m ? s[i] : m;
    float top = m;
    for (int j = 0; j < num_rows; ++j) {
        const float x = lse_mem[(int64_t)rows[j] * Hq];
        top = x > top ? x : top;
    }
    memset(out, 0, sizeof(float) * (size_t)D);
    if (top == -INFINITY) return -INFINITY; /* no keys anywhere */
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < L; ++i) {
        s[i] = exp_nonpositive(s[i] - m);
        sum += s[i];
    }
    const float own = L > 0 ? exp_nonpositive(m - top) : 0.0f;
    float total = own * sum;
    for (int j = 0; j < num_rows; ++j)
        total += exp_nonpositive(lse_mem[(int64_t)rows[j] * Hq] - top);
    const float inv = 1.0f / total, f = own * inv;
#pragma omp simd
    for (int i = 0; i < L; ++i) s[i] *= f;
    for (int j = 0; j < num_rows; ++j)
        axpy(out, exp_nonpositive(lse_mem[(int64_t)rows[j] * Hq] - top) * inv,
             o_mem + (int64_t)rows[j] * Hq * D, D);
    return top + logf(total);
}

/* One request: its Hq query heads (G per kv head) against its tokens [start, end), joined with
 * its num_rows prefix states (none for a plain decode). scratch holds Hq * (D + L + KEY_CHUNK)
 * floats. */
static void attend_request(const float *restrict q, const float *k_cache, const float *v_cache,
                           int64_t s_block, int64_t s_slot, int64_t s_head, const int32_t *table,
                           int start, int end, int block_size, int Hq, int Hkv, int D,
                           float scale, const float *o_mem, const float *lse_mem,
                           const int32_t *rows, int num_rows, float *restrict scratch,
                           float *restrict o, float *restrict lse) {
    const int L = end > start ? end - start : 0;
    const int64_t s_stride = L + KEY_CHUNK;
    float *qs = scratch, *s = scratch + (int64_t)Hq * D;
    for (int i = 0; i < Hq * D; ++i) qs[i] = q[i] * scale;
    window_scores(qs, k_cache, s_block, s_slot, s_head, table, start, end, block_size, Hq, Hkv, D,
                  s, s_stride);
    int any = 0;
    for (int h = 0; h < Hq; ++h) {
        lse[h] = join_softmax(s + h * s_stride, L, o_mem ? o_mem + (int64_t)h * D : NULL,
                              lse_mem ? lse_mem + h : NULL, rows, num_rows, Hq, D,
                              o + (int64_t)h * D);
        any |= lse[h] != -INFINITY;
    }
    if (L == 0 || !any) return;
    window_values(v_cache, s_block, s_slot, s_head, table, start, end, block_size, Hq, Hkv, D, s,
                  s_stride, o);
}

/* Request b attends to its tokens [kv_starts[b] (0 when kv_starts is NULL), seq_lens[b]).
 * With mem_offsets non-NULL it is the cascade's suffix pass and merge in one: request b's
 * prefix states are rows mem_rows[mem_offsets[b] .. mem_offsets[b + 1]) of (o_mem [M, Hq, D],
 * lse_mem [M, Hq]), and (o, lse) are the exact attention over the union of its prefixes and
 * its window. Returns 0, or -1 when scratch memory could not be allocated. */
int paged_decode_f32(const float *q, const float *k_cache, const float *v_cache, int64_t s_block,
                     int64_t s_slot, int64_t s_head, const int32_t *block_tables,
                     int64_t bt_stride, const int32_t *seq_lens, const int32_t *kv_starts,
                     const float *o_mem, const float *lse_mem, const int32_t *mem_offsets,
                     const int32_t *mem_rows, float *o, float *lse, int B, int Hq, int Hkv, int D,
                     int block_size, float scale, int num_threads) {
    int failed = 0;
#pragma omp parallel for num_threads(num_threads) schedule(dynamic, 1) reduction(| : failed)
    for (int b = 0; b < B; ++b) {
        const int start = kv_starts ? kv_starts[b] : 0, end = seq_lens[b];
        const int64_t L = end > start ? end - start : 0;
        const size_t need = (size_t)Hq * (size_t)(D + L + KEY_CHUNK);
        float stack[STACK_SCRATCH];
        float *scratch = need <= STACK_SCRATCH ? stack : malloc(sizeof(float) * need);
        if (scratch == NULL) {
            failed = 1;
            continue;
        }
        const int first = mem_offsets ? mem_offsets[b] : 0;
        const int num_rows = mem_offsets ? mem_offsets[b + 1] - first : 0;
        attend_request(q + (int64_t)b * Hq * D, k_cache, v_cache, s_block, s_slot, s_head,
                       block_tables + b * bt_stride, start, end, block_size, Hq, Hkv, D, scale,
                       o_mem, lse_mem, mem_offsets ? mem_rows + first : NULL, num_rows, scratch,
                       o + (int64_t)b * Hq * D, lse + (int64_t)b * Hq);
        if (scratch != stack) free(scratch);
    }
    return failed ? -1 : 0;
}

/* ---- The cascade's shared-prefix pass ------------------------------------------------------
 * Every member of a group attends to the group's shared tokens [start, end), read through one
 * member's table row. One task per (group, kv head) stacks the R = members x G query rows of
 * that kv head and walks the shared keys ONCE, in tiles of up to TILE_MAX keys (across block
 * boundaries): each key/value tile, read from memory once, feeds all R rows (a matrix-matrix
 * product), with an online softmax per row. Rows are the innermost (vector) dimension: q^T
 * [D][Rp], o^T [D][Rp], so every inner loop is a broadcast-FMA over ROW_CHUNK rows with no
 * horizontal reduction. Rp = R rounded up to ROW_CHUNK; the padding rows are zero queries
 * whose results are dropped. Within a tile the rows go in blocks of up to ROW_VECS vectors,
 * and each block runs scores -> softmax -> values back to back while its scores are in L1.
 */
/* Register blocks: ROW_VECS vectors of ROW_CHUNK rows; NV row vectors x STEP(NV) keys (scores)
 * or head dims (values) per sweep, so each FMA waits on nothing (4-cycle latency, 2 FMA ports)
 * and a load feeds 4-8 FMAs. AVX-512 (32 registers): 16 accumulators; NV x 6 (24) measured no
 * faster. Elsewhere (AVX2: 16 registers of 8 floats) 8 accumulators: the AVX-512 shapes there
 * (vectors of 16 rows, two registers each) spilled and ran 25x slower (51 ms against 1.7-2.0
 * at 64 x 2,048, built for haswell, run on the AVX-512 VM). */
#if defined(__AVX512F__)
#define ROW_CHUNK 16 /* rows per vector: one AVX-512 register of fp32 */
#define ROW_VECS 4   /* row vectors per register block: 64 rows */
#define STEP(NV) ((NV) > 2 ? 4 : 8)
#else
#define ROW_CHUNK 8 /* one AVX2 register (two NEON ones; SSE alone spills still) */
#define ROW_VECS 2
#define STEP(NV) 4
#endif
#define BLOCK_ROWS (ROW_VECS * ROW_CHUNK)
/* Keys per online-softmax step, across block boundaries. On the 2-core AVX-512 VM, 16 to 64
 * ran within the noise (+-5%) at 64 x 2,048, 2 x 32 x 1,536 and 16 x 1,024. At 32 (D = 64),
 * a block of rows' q^T and o^T (16 KiB each) and the tile's scores, K and V (8 KiB each)
 * come to 56 KiB, about the 48 KiB L1 plus what the prefetchers hide. */
#define TILE_MAX 32

/* GCC/Clang vector extensions: the compiler keeps these in registers and lowers them to the
 * target's widest vectors (auto-vectorising the loops instead gave 256-bit code that spilled
 * its accumulators). vrow loads and stores unaligned rows of ROW_CHUNK floats. */
typedef float vrow __attribute__((vector_size(ROW_CHUNK * sizeof(float)), aligned(4)));
typedef int32_t vint __attribute__((vector_size(ROW_CHUNK * sizeof(int32_t)), aligned(4)));
static inline vrow load_row(const float *p) { return *(const vrow *)p; }
static inline void store_row(float *p, vrow x) { *(vrow *)p = x; }
static inline vrow vmax(vrow a, vrow b) {
    const vint gt = a > b;
    return (vrow)(((vint)a & gt) | ((vint)b & ~gt));
}

/* exp_nonpositive on a vector, the same steps lane by lane. With AVX-512, floor and the
 * scaling by 2^n are one instruction each (vrndscaleps, vscalefps) where the portable form
 * takes six and three. */
#if defined(__AVX512F__) && ROW_CHUNK == 16
#include <immintrin.h>
static inline vrow exp_nonpositive_v(vrow x) {
    const __m512 v = _mm512_max_ps((__m512)x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(
        _mm512_fmadd_ps(v, _mm512_set1_ps(1.44269504f), _mm512_set1_ps(0.5f)),
        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const vrow r = ((vrow)v - (vrow)n * 0.693145752f) - (vrow)n * 1.42860677e-6f;
    const vrow p =
        1.0f + r * (1.0f + r * (0.5f + r * (1.6666667e-1f +
                   r * (4.1666668e-2f + r * (8.3333338e-3f + r * 1.3888889e-3f)))));
    return (vrow)_mm512_scalef_ps((__m512)p, n);
}
#else
static inline vrow exp_nonpositive_v(vrow x) {
    x = vmax(x, (vrow){0} - 87.0f);
    const vrow t = x * 1.44269504f + 0.5f;
    vint ni = __builtin_convertvector(t, vint); /* truncates: floor, less one below zero */
    ni += (vint)(__builtin_convertvector(ni, vrow) > t);
    const vrow n = __builtin_convertvector(ni, vrow);
    const vrow r = (x - n * 0.693145752f) - n * 1.42860677e-6f;
    const vrow p =
        1.0f + r * (1.0f + r * (0.5f + r * (1.6666667e-1f +
                   r * (4.1666668e-2f + r * (8.3333338e-3f + r * 1.3888889e-3f)))));
    return p * (vrow)((ni + 127) << 23);
}
#endif

/* s[t][v * ROW_CHUNK + i] = q_(v * ROW_CHUNK + i) . k_t (q^T from qt, row stride Rp) for the
 * n keys keys[t], NV row vectors; mx gets the per-row max over the n keys. NV x STEP(NV)
 * accumulators per sweep over d: each row load feeds STEP(NV) FMAs, each key element NV. */
ALWAYS_INLINE void block_scores(const float *restrict qt, int Rp, const float *const *keys,
                                       int n, int D, float *restrict s, vrow *mx, const int NV) {
    for (int v = 0; v < NV; ++v) mx[v] = (vrow){0} - INFINITY;
    const int KS = STEP(NV);
    int t = 0;
    for (; t + KS <= n; t += KS) {
        vrow acc[ROW_VECS][8];
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v)
#pragma GCC unroll 8
            for (int j = 0; j < KS; ++j) acc[v][j] = (vrow){0};
        for (int d = 0; d < D; ++d) {
            vrow qd[ROW_VECS];
#pragma GCC unroll 8
            for (int v = 0; v < NV; ++v) qd[v] = load_row(qt + (int64_t)d * Rp + v * ROW_CHUNK);
#pragma GCC unroll 8
            for (int j = 0; j < KS; ++j) {
                const float x = keys[t + j][d];
#pragma GCC unroll 8
                for (int v = 0; v < NV; ++v) acc[v][j] += x * qd[v];
            }
        }
#pragma GCC unroll 8
        for (int j = 0; j < KS; ++j)
#pragma GCC unroll 8
            for (int v = 0; v < NV; ++v) {
                store_row(s + (t + j) * BLOCK_ROWS + v * ROW_CHUNK, acc[v][j]);
                mx[v] = vmax(mx[v], acc[v][j]);
            }
    }
    for (; t < n; ++t) {
        vrow acc[ROW_VECS];
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) acc[v] = (vrow){0};
        for (int d = 0; d < D; ++d) {
            const float x = keys[t][d];
#pragma GCC unroll 8
            for (int v = 0; v < NV; ++v)
                acc[v] += x * load_row(qt + (int64_t)d * Rp + v * ROW_CHUNK);
        }
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) {
            store_row(s + t * BLOCK_ROWS + v * ROW_CHUNK, acc[v]);
            mx[v] = vmax(mx[v], acc[v]);
        }
    }
}

/* The online-softmax step of NV row vectors over n keys: the scores s become weights against
 * the new running max m, the running sums l are rescaled by corr = e^(m_old - m_new). */
ALWAYS_INLINE void block_softmax(float *restrict s, int n, const vrow *mx,
                                        float *restrict m, float *restrict l, vrow *corr,
                                        const int NV) {
    vrow mn[ROW_VECS], sum[ROW_VECS];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
        const vrow old = load_row(m + v * ROW_CHUNK);
        mn[v] = vmax(old, mx[v]);
        corr[v] = exp_nonpositive_v(old - mn[v]); /* m = -inf at first: ~0 */
        sum[v] = load_row(l + v * ROW_CHUNK) * corr[v];
        store_row(m + v * ROW_CHUNK, mn[v]);
    }
    for (int t = 0; t < n; ++t)
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) {
            float *w = s + t * BLOCK_ROWS + v * ROW_CHUNK;
            const vrow e = exp_nonpositive_v(load_row(w) - mn[v]);
            store_row(w, e);
            sum[v] += e;
        }
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) store_row(l + v * ROW_CHUNK, sum[v]);
}

/* o^T[d][r] = corr[r] * o^T[d][r] + sum_t w[t][r] * v_t[d] for NV row vectors: NV x
 * STEP(NV) accumulators per sweep over the keys. */
ALWAYS_INLINE void block_values(float *restrict ot, int Rp, const float *const *vals,
                                       int n, int D, const float *restrict w, const vrow *corr,
                                       const int NV) {
    const int DS = STEP(NV);
    int d = 0;
    for (; d + DS <= D; d += DS) {
        vrow acc[ROW_VECS][8];
#pragma GCC unroll 8
        for (int j = 0; j < DS; ++j)
#pragma GCC unroll 8
            for (int v = 0; v < NV; ++v)
                acc[v][j] = load_row(ot + (int64_t)(d + j) * Rp + v * ROW_CHUNK) * corr[v];
        for (int t = 0; t < n; ++t) {
            vrow wt[ROW_VECS];
#pragma GCC unroll 8
            for (int v = 0; v < NV; ++v) wt[v] = load_row(w + t * BLOCK_ROWS + v * ROW_CHUNK);
            const float *vt = vals[t] + d;
#pragma GCC unroll 8
            for (int j = 0; j < DS; ++j) {
                const float x = vt[j];
#pragma GCC unroll 8
                for (int v = 0; v < NV; ++v) acc[v][j] += x * wt[v];
            }
        }
#pragma GCC unroll 8
        for (int j = 0; j < DS; ++j)
#pragma GCC unroll 8
            for (int v = 0; v < NV; ++v)
                store_row(ot + (int64_t)(d + j) * Rp + v * ROW_CHUNK, acc[v][j]);
    }
    for (; d < D; ++d) {
        vrow acc[ROW_VECS];
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) acc[v] = load_row(ot + (int64_t)d * Rp + v * ROW_CHUNK) * corr[v];
        for (int t = 0; t < n; ++t) {
            const float x = vals[t][d];
#pragma GCC unroll 8
            for (int v = 0; v < NV; ++v) acc[v] += x * load_row(w + t * BLOCK_ROWS + v * ROW_CHUNK);
        }
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) store_row(ot + (int64_t)d * Rp + v * ROW_CHUNK, acc[v]);
    }
}

/* One block of NV row vectors (rows [r0, r0 + NV * ROW_CHUNK)) through one key tile. */
ALWAYS_INLINE void block_tile(const float *qt, float *ot, int Rp, int r0,
                                     const float *const *keys, const float *const *vals, int n,
                                     int D, float *scores, float *m, float *l, const int NV) {
    vrow mx[ROW_VECS], corr[ROW_VECS];
    block_scores(qt + r0, Rp, keys, n, D, scores, mx, NV);
    block_softmax(scores, n, mx, m + r0, l + r0, corr, NV);
    block_values(ot + r0, Rp, vals, n, D, scores, corr, NV);
}

static void rows_tile(const float *qt, float *ot, int Rp, const float *const *keys,
                      const float *const *vals, int n, int D, float *scores, float *m, float *l) {
    int r0 = 0;
    for (; r0 + BLOCK_ROWS <= Rp; r0 += BLOCK_ROWS)
        block_tile(qt, ot, Rp, r0, keys, vals, n, D, scores, m, l, ROW_VECS);
    switch ((Rp - r0) / ROW_CHUNK) { /* the last, narrower block: fewer than ROW_VECS */
#if ROW_VECS > 3
    case 3: block_tile(qt, ot, Rp, r0, keys, vals, n, D, scores, m, l, 3); break;
#endif
#if ROW_VECS > 2
    case 2: block_tile(qt, ot, Rp, r0, keys, vals, n, D, scores, m, l, 2); break;
#endif
    case 1: block_tile(qt, ot, Rp, r0, keys, vals, n, D, scores, m, l, 1); break;
    default: break;
    }
}

/* One (group, kv head): rows r = j * G + g are member j's query head h * G + g. Writes the
 * members' membership rows of o [M, Hq, D] and lse [M, Hq]. scratch holds 2 * D * Rp +
 * TILE_MAX * BLOCK_ROWS + 2 * Rp floats. */
static void attend_group(const float *q, const float *k_cache, const float *v_cache,
                         int64_t s_block, int64_t s_slot, int64_t s_head, const int32_t *table,
                         const int32_t *members, int size, int start, int end, int h,
                         int block_size, int Hq, int Hkv, int D, float scale, float *scratch,
                         float *o, float *lse) {
    const int G = Hq / Hkv, R = size * G;
    const int Rp = (R + ROW_CHUNK - 1) / ROW_CHUNK * ROW_CHUNK;
    float *qt = scratch, *ot = qt + (int64_t)D * Rp, *scores = ot + (int64_t)D * Rp;
    float *m = scores + (int64_t)TILE_MAX * BLOCK_ROWS, *l = m + Rp;
    memset(qt, 0, sizeof(float) * (size_t)D * Rp);
    memset(ot, 0, sizeof(float) * (size_t)D * Rp);
    for (int r = 0; r < Rp; ++r) m[r] = -INFINITY, l[r] = 0.0f;
    for (int j = 0; j < size; ++j)
        for (int g = 0; g < G; ++g) {
            const float *qr = q + ((int64_t)members[j] * Hq + h * G + g) * D;
            for (int d = 0; d < D; ++d) qt[(int64_t)d * Rp + j * G + g] = qr[d] * scale;
        }
    /* the tile's key and value rows, gathered a block run at a time (one division each) */
    const float *keys[TILE_MAX], *vals[TILE_MAX];
    int n = 0;
    for (int first = start; first < end;) {
        const int within = first % block_size;
        const int64_t at = (int64_t)table[first / block_size] * s_block + h * s_head;
        int run = block_size - within < end - first ? block_size - within : end - first;
        run = run < TILE_MAX - n ? run : TILE_MAX - n;
        for (int i = 0; i < run; ++i, ++n) {
            keys[n] = k_cache + at + (int64_t)(within + i) * s_slot;
            vals[n] = v_cache + at + (int64_t)(within + i) * s_slot;
        }
        first += run;
        if (n == TILE_MAX || first == end) {
            rows_tile(qt, ot, Rp, keys, vals, n, D, scores, m, l);
            n = 0;
        }
    }
    for (int j = 0; j < size; ++j)
        for (int g = 0; g < G; ++g) {
            const int r = j * G + g, qh = h * G + g;
            const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
            float *out = o + ((int64_t)j * Hq + qh) * D;
            for (int d = 0; d < D; ++d) out[d] = ot[(int64_t)d * Rp + r] * inv;
            lse[(int64_t)j * Hq + qh] = l[r] > 0.0f ? m[r] + logf(l[r]) : -INFINITY;
        }
}

/* Members per prefix-pass task: a group's rows are cut into tiles of this many members, each
 * sweeping the group's keys on its own, so one task's transposed queries and output
 * (2 * D * 2 * MEMBER_TILE floats at G = 2, 64 KiB at D = 64) stay in L2 however large the
 * group. A group of thousands of rows (a prefill chunk's tokens attending as decode rows) in
 * one sweep streamed megabytes per key tile through memory; the shared keys, re-read once
 * per tile, are a fraction of that and stay in cache. */
#define MEMBER_TILE 64

/* The prefix pass of a cascade: group gi's members are member_ids[offsets[gi] .. offsets[gi+1])
 * (batch indices into q), its tokens [starts[gi], ends[gi]) are read through block_tables row
 * table_rows[gi]. Writes o [M, Hq, D] and lse [M, Hq] in membership-row order (natural log;
 * an empty range gives o = 0, lse = -inf). Returns 0, or -1 when scratch allocation failed. */
int cascade_prefix_f32(const float *q, const float *k_cache, const float *v_cache,
                       int64_t s_block, int64_t s_slot, int64_t s_head,
                       const int32_t *block_tables, int64_t bt_stride, const int32_t *member_ids,
                       const int32_t *offsets, const int32_t *table_rows, const int32_t *starts,
                       const int32_t *ends, float *o, float *lse, int num_groups, int Hq,
                       int Hkv, int D, int block_size, float scale, int num_threads) {
    int failed = 0, max_tiles = 1;
    for (int gi = 0; gi < num_groups; ++gi) {
        const int tiles = (offsets[gi + 1] - offsets[gi] + MEMBER_TILE - 1) / MEMBER_TILE;
        max_tiles = tiles > max_tiles ? tiles : max_tiles;
    }
#pragma omp parallel for num_threads(num_threads) schedule(dynamic, 1) reduction(| : failed)
    for (int64_t task = 0; task < (int64_t)num_groups * Hkv * max_tiles; ++task) {
        const int gi = (int)(task / ((int64_t)Hkv * max_tiles));
        const int h = (int)(task / max_tiles % Hkv), first = (int)(task % max_tiles) * MEMBER_TILE;
        const int group_size = offsets[gi + 1] - offsets[gi];
        if (first >= group_size) continue; /* a smaller group: fewer tiles */
        const int size = group_size - first < MEMBER_TILE ? group_size - first : MEMBER_TILE;
        const int Rp = (size * (Hq / Hkv) + ROW_CHUNK - 1) / ROW_CHUNK * ROW_CHUNK;
        float *scratch =
            malloc(sizeof(float) * ((size_t)Rp * (2 * D + 2) + TILE_MAX * BLOCK_ROWS));
        if (scratch == NULL) {
            failed = 1;
            continue;
        }
        const int64_t row = (int64_t)offsets[gi] + first; /* first membership row of the tile */
        attend_group(q, k_cache, v_cache, s_block, s_slot, s_head,
                     block_tables + (int64_t)table_rows[gi] * bt_stride, member_ids + row, size,
                     starts[gi], ends[gi], h, block_size, Hq, Hkv, D, scale, scratch,
                     o + row * Hq * D, lse + row * Hq);
        free(scratch);
    }
    return failed ? -1 : 0;
}

/* Store T new tokens' K and V rows into the paged caches: token t goes to slot slots[t]
 * (block slots[t] / block_size, offset slots[t] % block_size), every kv head. k and v rows may
 * have any token and head strides (they are views into the fused qkv projection); the
 * head_dim stride must be 1 everywhere. Returns 0, or -1 (nothing written) when a slot lies
 * outside the cache's num_blocks * block_size slots. */
int store_kv_f32(const float *k, const float *v, int64_t s_tok_k, int64_t s_head_k,
                 int64_t s_tok_v, int64_t s_head_v, float *k_cache, float *v_cache,
                 int64_t s_block, int64_t s_slot, int64_t s_head, const int64_t *slots, int T,
                 int Hkv, int D, int block_size, int64_t num_blocks) {
    for (int t = 0; t < T; ++t)
        if (slots[t] < 0 || slots[t] >= num_blocks * block_size) return -1;
    const size_t row = sizeof(float) * (size_t)D;
    for (int t = 0; t < T; ++t) {
        const int64_t base = (slots[t] / block_size) * s_block + (slots[t] % block_size) * s_slot;
        for (int h = 0; h < Hkv; ++h) {
            memcpy(k_cache + base + h * s_head, k + t * s_tok_k + h * s_head_k, row);
            memcpy(v_cache + base + h * s_head, v + t * s_tok_v + h * s_head_v, row);
        }
    }
    return 0;
}
