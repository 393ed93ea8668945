/* Paged decode attention on the CPU, fp32: what the torch path does with a gather, a bmm, a
 * softmax and a second bmm, done in one pass over each request's blocks.
 *
 * The torch path copies every request's K and V window into a head-major buffer before it
 * multiplies (three trips through memory per byte of KV). Here each (request, kv head) task
 * walks its block table and reads each key and value row once, straight from the paged cache:
 * pass 1 scores the G = Hq / Hkv query heads of the group against each key, then a softmax
 * per head, then pass 2 accumulates the weighted values. Natural-log LSE, as everywhere in
 * eclectus.kernels. Built and loaded by kernels/native.py.
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

/* Four keys at once: four independent accumulator chains keep the FMA units busy (one chain
 * waits on its own latency), and each query element is loaded once for the four. */
static inline void dot4(const float *restrict q, const float *restrict k, int64_t stride, int n,
                        float *restrict out) {
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    const float *k1 = k + stride, *k2 = k + 2 * stride, *k3 = k + 3 * stride;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
    for (int i = 0; i < n; ++i) {
        a0 += q[i] * k[i];
        a1 += q[i] * k1[i];
        a2 += q[i] * k2[i];
        a3 += q[i] * k3[i];
    }
    out[0] = a0, out[1] = a1, out[2] = a2, out[3] = a3;
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

/* One request: its Hq query heads (G per kv head) against tokens [start, end). A block is
 * visited once per pass with all its kv heads, so its bytes come from memory once whatever the
 * layout ([block, slot, head, dim] or [block, head, slot, dim]). */
static void attend_request(const float *restrict q, const float *k_cache, const float *v_cache,
                           int64_t s_block, int64_t s_slot, int64_t s_head, const int32_t *table,
                           int start, int end, int block_size, int Hq, int Hkv, int D,
                           float scale, float *restrict scores, float *restrict o,
                           float *restrict lse) {
    const int L = end - start, G = Hq / Hkv;
    memset(o, 0, sizeof(float) * (size_t)Hq * D);
    if (L <= 0) {
        for (int h = 0; h < Hq; ++h) lse[h] = -INFINITY;
        return;
    }
    /* pass 1: scores[qh][t - start] = scale * q_qh . k_t */
    for (int first = start; first < end;) {
        const int within = first % block_size;
        const int n = (block_size - within < end - first) ? block_size - within : end - first;
        const float *block = k_cache + (int64_t)table[first / block_size] * s_block;
        for (int h = 0; h < Hkv; ++h) {
            const float *k = block + h * s_head + (int64_t)within * s_slot;
            for (int g = 0; g < G; ++g) {
                const float *qh = q + (int64_t)(h * G + g) * D;
                float *s = scores + (int64_t)(h * G + g) * L + (first - start);
                int i = 0;
                for (; i + 4 <= n; i += 4) dot4(qh, k + i * s_slot, s_slot, D, s + i);
                for (; i < n; ++i) s[i] = dot(qh, k + i * s_slot, D);
            }
        }
        first += n;
    }
    /* softmax per query head; the weights overwrite the scores */
    for (int h = 0; h < Hq; ++h) {
        float *s = scores + (int64_t)h * L;
        float m = -INFINITY;
#pragma omp simd reduction(max : m)
        for (int i = 0; i < L; ++i) m = s[i] > m ? s[i] : m;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int i = 0; i < L; ++i) {
            s[i] = exp_nonpositive((s[i] - m) * scale);
            sum += s[i];
        }
        const float inv = 1.0f / sum;
#pragma omp simd
        for (int i = 0; i < L; ++i) s[i] *= inv;
        lse[h] = m * scale + logf(sum);
    }
    /* pass 2: o_qh = sum_t w[qh][t] v_t */
    for (int first = start; first < end;) {
        const int within = first % block_size;
        const int n = (block_size - within < end - first) ? block_size - within : end - first;
        const float *block = v_cache + (int64_t)table[first / block_size] * s_block;
        for (int h = 0; h < Hkv; ++h) {
            const float *v = block + h * s_head + (int64_t)within * s_slot;
            for (int i = 0; i < n; ++i, v += s_slot)
                for (int g = 0; g < G; ++g) {
                    const int qh = h * G + g;
                    axpy(o + (int64_t)qh * D, scores[(int64_t)qh * L + (first - start) + i], v, D);
                }
        }
        first += n;
    }
}

/* Returns 0, or -1 when scratch memory could not be allocated. */
int paged_decode_f32(const float *q, const float *k_cache, const float *v_cache, int64_t s_block,
                     int64_t s_slot, int64_t s_head, const int32_t *block_tables,
                     int64_t bt_stride, const int32_t *seq_lens, const int32_t *kv_starts,
                     float *o, float *lse, int B, int Hq, int Hkv, int D, int block_size,
                     float scale, int num_threads) {
    int failed = 0;
#pragma omp parallel for num_threads(num_threads) schedule(dynamic, 1) reduction(| : failed)
    for (int b = 0; b < B; ++b) {
        const int start = kv_starts ? kv_starts[b] : 0, end = seq_lens[b];
        const size_t len = end > start ? (size_t)(end - start) : 1;
        float *scores = malloc(sizeof(float) * (size_t)Hq * len);
        if (scores == NULL) {
            failed = 1;
            continue;
        }
        attend_request(q + (int64_t)b * Hq * D, k_cache, v_cache, s_block, s_slot, s_head,
                       block_tables + b * bt_stride, start, end, block_size, Hq, Hkv, D, scale,
                       scores, o + (int64_t)b * Hq * D, lse + (int64_t)b * Hq);
        free(scores);
    }
    return failed ? -1 : 0;
}

/* ---- The cascade's shared-prefix pass ------------------------------------------------------
 * Every member of a group attends to the group's shared tokens [start, end), read through one
 * member's table row. One task per (group, kv head) stacks the R = members x G query rows of
 * that kv head and walks the shared blocks ONCE: each key/value tile, read from memory once,
 * feeds all R rows (a matrix-matrix product), with an online softmax per row. Rows are the
 * innermost (vector) dimension: q^T [D][Rp], scores [tile][Rp], o^T [D][Rp], so every inner
 * loop is a broadcast-FMA over ROW_CHUNK rows with no horizontal reduction. Rp = R rounded up
 * to ROW_CHUNK; the padding rows are zero queries whose results are dropped.
 */
#define ROW_CHUNK 16 /* rows per vector: one AVX-512 register of fp32 (two AVX2 ones) */
#define TILE_MAX 64  /* keys per online-softmax step (at most one block's worth) */

/* GCC/Clang vector extensions: the compiler keeps these in registers and lowers them to the
 * target's widest vectors (auto-vectorising the loops instead gave 256-bit code that spilled
 * its accumulators). vrow loads and stores unaligned rows of ROW_CHUNK floats. */
typedef float vrow __attribute__((vector_size(ROW_CHUNK * sizeof(float)), aligned(4)));
static inline vrow load_row(const float *p) { return *(const vrow *)p; }
static inline void store_row(float *p, vrow x) { *(vrow *)p = x; }

/* scores[t][r] = q_r . k_t for the n keys at k (row stride s_slot), r in [0, Rp). Two row
 * vectors x four keys per sweep over d: eight accumulators, each load of q feeds four FMAs
 * and each key element two. */
static void tile_scores(const float *restrict qt, int Rp, const float *k, int64_t s_slot, int n,
                        int D, float *restrict scores) {
    int r0 = 0;
    for (; r0 + 2 * ROW_CHUNK <= Rp; r0 += 2 * ROW_CHUNK) {
        int t = 0;
        for (; t + 4 <= n; t += 4) {
            const float *k0 = k + t * s_slot, *k1 = k0 + s_slot, *k2 = k1 + s_slot,
                        *k3 = k2 + s_slot;
            vrow a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
            for (int d = 0; d < D; ++d) {
                const vrow qa = load_row(qt + (int64_t)d * Rp + r0);
                const vrow qb = load_row(qt + (int64_t)d * Rp + r0 + ROW_CHUNK);
                const float x0 = k0[d], x1 = k1[d], x2 = k2[d], x3 = k3[d];
                a0 += x0 * qa, a1 += x1 * qa, a2 += x2 * qa, a3 += x3 * qa;
                b0 += x0 * qb, b1 += x1 * qb, b2 += x2 * qb, b3 += x3 * qb;
            }
            float *s = scores + (int64_t)t * Rp + r0;
            store_row(s, a0), store_row(s + ROW_CHUNK, b0);
            store_row(s + Rp, a1), store_row(s + Rp + ROW_CHUNK, b1);
            store_row(s + 2 * Rp, a2), store_row(s + 2 * Rp + ROW_CHUNK, b2);
            store_row(s + 3 * Rp, a3), store_row(s + 3 * Rp + ROW_CHUNK, b3);
        }
        for (; t < n; ++t) {
            const float *kt = k + t * s_slot;
            vrow a = {0}, b = {0};
            for (int d = 0; d < D; ++d) {
                a += kt[d] * load_row(qt + (int64_t)d * Rp + r0);
                b += kt[d] * load_row(qt + (int64_t)d * Rp + r0 + ROW_CHUNK);
            }
            store_row(scores + (int64_t)t * Rp + r0, a);
            store_row(scores + (int64_t)t * Rp + r0 + ROW_CHUNK, b);
        }
    }
    for (; r0 < Rp; r0 += ROW_CHUNK) { /* an odd last vector of rows */
        int t = 0;
        for (; t + 4 <= n; t += 4) {
            const float *k0 = k + t * s_slot, *k1 = k0 + s_slot, *k2 = k1 + s_slot,
                        *k3 = k2 + s_slot;
            vrow a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            for (int d = 0; d < D; ++d) {
                const vrow qd = load_row(qt + (int64_t)d * Rp + r0);
                a0 += k0[d] * qd, a1 += k1[d] * qd, a2 += k2[d] * qd, a3 += k3[d] * qd;
            }
            store_row(scores + (int64_t)t * Rp + r0, a0);
            store_row(scores + (int64_t)(t + 1) * Rp + r0, a1);
            store_row(scores + (int64_t)(t + 2) * Rp + r0, a2);
            store_row(scores + (int64_t)(t + 3) * Rp + r0, a3);
        }
        for (; t < n; ++t) {
            const float *kt = k + t * s_slot;
            vrow a = {0};
            for (int d = 0; d < D; ++d) a += kt[d] * load_row(qt + (int64_t)d * Rp + r0);
            store_row(scores + (int64_t)t * Rp + r0, a);
        }
    }
}

/* Online softmax step over n keys: turns scores into weights against the new running max,
 * rescales the running sums by e^(m_old - m_new) (returned in corr). */
static void tile_softmax(float *restrict scores, int Rp, int n, float *restrict m,
                         float *restrict l, float *restrict corr) {
    for (int r0 = 0; r0 < Rp; r0 += ROW_CHUNK) {
        float mx[ROW_CHUNK];
        memcpy(mx, m + r0, sizeof mx);
        for (int t = 0; t < n; ++t) {
            const float *s = scores + (int64_t)t * Rp + r0;
#pragma omp simd
            for (int i = 0; i < ROW_CHUNK; ++i) mx[i] = s[i] > mx[i] ? s[i] : mx[i];
        }
        float sum[ROW_CHUNK];
#pragma omp simd
        for (int i = 0; i < ROW_CHUNK; ++i) {
            corr[r0 + i] = exp_nonpositive(m[r0 + i] - mx[i]); /* m = -inf at first: ~0 */
            sum[i] = l[r0 + i] * corr[r0 + i];
        }
        for (int t = 0; t < n; ++t) {
            float *s = scores + (int64_t)t * Rp + r0;
#pragma omp simd
            for (int i = 0; i < ROW_CHUNK; ++i) {
                s[i] = exp_nonpositive(s[i] - mx[i]);
                sum[i] += s[i];
            }
        }
        memcpy(m + r0, mx, sizeof mx);
        memcpy(l + r0, sum, sizeof sum);
    }
}

/* o^T[d][r] = corr[r] * o^T[d][r] + sum_t w[t][r] * v_t[d]: four d at a time, so one load of
 * the weights feeds four FMAs. */
static void tile_values(float *restrict ot, int Rp, const float *v, int64_t s_slot, int n, int D,
                        const float *restrict weights, const float *restrict corr) {
    int r0 = 0;
    for (; r0 + 2 * ROW_CHUNK <= Rp; r0 += 2 * ROW_CHUNK) { /* two row vectors x four d */
        const vrow ca = load_row(corr + r0), cb = load_row(corr + r0 + ROW_CHUNK);
        int d = 0;
        for (; d + 4 <= D; d += 4) {
            float *o0 = ot + (int64_t)d * Rp + r0, *o1 = o0 + Rp, *o2 = o1 + Rp, *o3 = o2 + Rp;
            vrow a0 = load_row(o0) * ca, a1 = load_row(o1) * ca, a2 = load_row(o2) * ca,
                 a3 = load_row(o3) * ca;
            vrow b0 = load_row(o0 + ROW_CHUNK) * cb, b1 = load_row(o1 + ROW_CHUNK) * cb,
                 b2 = load_row(o2 + ROW_CHUNK) * cb, b3 = load_row(o3 + ROW_CHUNK) * cb;
            for (int t = 0; t < n; ++t) {
                const float *vt = v + t * s_slot + d;
                const float *w = weights + (int64_t)t * Rp + r0;
                const vrow wa = load_row(w), wb = load_row(w + ROW_CHUNK);
                const float x0 = vt[0], x1 = vt[1], x2 = vt[2], x3 = vt[3];
                a0 += x0 * wa, a1 += x1 * wa, a2 += x2 * wa, a3 += x3 * wa;
                b0 += x0 * wb, b1 += x1 * wb, b2 += x2 * wb, b3 += x3 * wb;
            }
            store_row(o0, a0), store_row(o1, a1), store_row(o2, a2), store_row(o3, a3);
            store_row(o0 + ROW_CHUNK, b0), store_row(o1 + ROW_CHUNK, b1);
            store_row(o2 + ROW_CHUNK, b2), store_row(o3 + ROW_CHUNK, b3);
        }
        for (; d < D; ++d) {
            float *od = ot + (int64_t)d * Rp + r0;
            vrow a = load_row(od) * ca, b = load_row(od + ROW_CHUNK) * cb;
            for (int t = 0; t < n; ++t) {
                const float x = v[t * s_slot + d], *w = weights + (int64_t)t * Rp + r0;
                a += x * load_row(w), b += x * load_row(w + ROW_CHUNK);
            }
            store_row(od, a), store_row(od + ROW_CHUNK, b);
        }
    }
    for (; r0 < Rp; r0 += ROW_CHUNK) { /* an odd last vector of rows */
        const vrow c = load_row(corr + r0);
        int d = 0;
        for (; d + 4 <= D; d += 4) {
            float *o0 = ot + (int64_t)d * Rp + r0, *o1 = o0 + Rp, *o2 = o1 + Rp, *o3 = o2 + Rp;
            vrow a0 = load_row(o0) * c, a1 = load_row(o1) * c, a2 = load_row(o2) * c,
                 a3 = load_row(o3) * c;
            for (int t = 0; t < n; ++t) {
                const float *vt = v + t * s_slot + d;
                const vrow w = load_row(weights + (int64_t)t * Rp + r0);
                a0 += vt[0] * w, a1 += vt[1] * w, a2 += vt[2] * w, a3 += vt[3] * w;
            }
            store_row(o0, a0), store_row(o1, a1), store_row(o2, a2), store_row(o3, a3);
        }
        for (; d < D; ++d) {
            float *od = ot + (int64_t)d * Rp + r0;
            vrow a = load_row(od) * c;
            for (int t = 0; t < n; ++t)
                a += v[t * s_slot + d] * load_row(weights + (int64_t)t * Rp + r0);
            store_row(od, a);
        }
    }
}

/* One (group, kv head): rows r = j * G + g are member j's query head h * G + g. Writes the
 * members' membership rows of o [M, Hq, D] and lse [M, Hq]. scratch holds 2 * D * Rp +
 * TILE_MAX * Rp + 3 * Rp floats. */
static void attend_group(const float *q, const float *k_cache, const float *v_cache,
                         int64_t s_block, int64_t s_slot, int64_t s_head, const int32_t *table,
                         const int32_t *members, int size, int start, int end, int h,
                         int block_size, int Hq, int Hkv, int D, float scale, float *scratch,
                         float *o, float *lse) {
    const int G = Hq / Hkv, R = size * G;
    const int Rp = (R + ROW_CHUNK - 1) / ROW_CHUNK * ROW_CHUNK;
    float *qt = scratch, *ot = qt + (int64_t)D * Rp, *scores = ot + (int64_t)D * Rp;
    float *m = scores + (int64_t)TILE_MAX * Rp, *l = m + Rp, *corr = l + Rp;
    memset(qt, 0, sizeof(float) * (size_t)D * Rp);
    memset(ot, 0, sizeof(float) * (size_t)D * Rp);
    for (int r = 0; r < Rp; ++r) m[r] = -INFINITY, l[r] = 0.0f;
    for (int j = 0; j < size; ++j)
        for (int g = 0; g < G; ++g) {
            const float *qr = q + ((int64_t)members[j] * Hq + h * G + g) * D;
            for (int d = 0; d < D; ++d) qt[(int64_t)d * Rp + j * G + g] = qr[d] * scale;
        }
    for (int first = start; first < end;) {
        const int within = first % block_size;
        int n = (block_size - within < end - first) ? block_size - within : end - first;
        n = n < TILE_MAX ? n : TILE_MAX;
        const int64_t at = (int64_t)table[first / block_size] * s_block + h * s_head +
                           (int64_t)within * s_slot;
        tile_scores(qt, Rp, k_cache + at, s_slot, n, D, scores);
        tile_softmax(scores, Rp, n, m, l, corr);
        tile_values(ot, Rp, v_cache + at, s_slot, n, D, scores, corr);
        first += n;
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
 * sweeping the group's keys on its own, so one task's transposed queries, output and scores
 * (3 * D * 2 * MEMBER_TILE floats at G = 2, 96 KiB at D = 64) stay in L2 however large the
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
        float *scratch = malloc(sizeof(float) * (size_t)Rp * (2 * D + TILE_MAX + 3));
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

/* The cascade's merge: request b's own state (o, lse: its suffix pass, [B, Hq, D] and
 * [B, Hq]) is merged IN PLACE with its membership rows req_rows[req_offsets[b] ..
 * req_offsets[b + 1]) of (o_mem, lse_mem): the exact union of attentions over disjoint key
 * sets, weights e^(lse_x - max); empty states (lse = -inf) weigh nothing, all empty gives
 * (0, -inf). */
void cascade_merge_f32(float *o, float *lse, const float *o_mem, const float *lse_mem,
                       const int32_t *req_offsets, const int32_t *req_rows, int B, int Hq,
                       int D) {
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < Hq; ++h) {
            float *out = o + ((int64_t)b * Hq + h) * D;
            float m = lse[(int64_t)b * Hq + h];
            for (int j = req_offsets[b]; j < req_offsets[b + 1]; ++j) {
                const float x = lse_mem[(int64_t)req_rows[j] * Hq + h];
                m = x > m ? x : m;
            }
            if (m == -INFINITY) continue; /* every part empty: the suffix's (0, -inf) stands */
            const float w0 = exp_nonpositive(lse[(int64_t)b * Hq + h] - m);
            float total = w0;
#pragma omp simd
            for (int d = 0; d < D; ++d) out[d] *= w0;
            for (int j = req_offsets[b]; j < req_offsets[b + 1]; ++j) {
                const float w = exp_nonpositive(lse_mem[(int64_t)req_rows[j] * Hq + h] - m);
                const float *part = o_mem + ((int64_t)req_rows[j] * Hq + h) * D;
                total += w;
                axpy(out, w, part, D);
            }
            const float inv = 1.0f / total;
#pragma omp simd
            for (int d = 0; d < D; ++d) out[d] *= inv;
            lse[(int64_t)b * Hq + h] = m + logf(total);
        }
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
