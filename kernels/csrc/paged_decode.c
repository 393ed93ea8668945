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
