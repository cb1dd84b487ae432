/*
 * kernels.c - the model's numeric kernels: one register-blocked matmul in
 * GCC vector extensions (an AVX2+FMA and a 128-bit variant), and plain
 * loops that gcc vectorizes for the rest.  Reductions whose result
 * feeds a normalisation (LayerNorm moments, softmax sums, the loss, bias
 * and LayerNorm parameter gradients) are summed in double.
 */
#include "kernels.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KERN_X86 1
/* The hot kernels are built for x86-64-v3 (AVX2 + FMA) and for the
 * baseline; the loader picks one (ifunc).  The matmul, whose tile shape
 * depends on the register width, picks its variant itself (gemm).  The
 * variants may differ in the last bits (FMA rounds once), which is
 * harmless: a run never mixes them on one machine, and gradients are
 * reduced before anyone uses them. */
#define KERN_HOT __attribute__((target_clones("arch=x86-64-v3", "default")))
#define KERN_V3 __attribute__((target("arch=x86-64-v3")))
#else
#define KERN_X86 0
#define KERN_HOT
#endif

/* gcc 12's -O2 "very cheap" vectorizer refuses loops of unknown trip count.
 * no-trapping-math lets gcc evaluate both arms of the select in tanh_gelu
 * (a division sits in one), which vectorization needs; no value changes,
 * only FP exception flags could. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3", "no-trapping-math")
#endif

#define LN_EPS 1e-5
#define GELU_S 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

/* GCC vector extensions; the "u" types are for unaligned access.  v8 only
 * where the target has 256-bit registers: elsewhere gcc would emulate it
 * through memory, at a tenth of the speed. */
typedef float v4 __attribute__((vector_size(16)));
typedef float v4u __attribute__((vector_size(16), aligned(4)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4)));

/* ---- matmul ------------------------------------------------------------- */

/*
 * GEMM_DEFINE(name, V, VU, VW, MR, attr) defines
 *   name(c, ldc, a, sam, sak, b, ldb, M, K, Nc, bias, accumulate):
 * c (M, Nc) = a (M, K) · b (K, Nc) [+ bias (Nc)], or c += a · b.
 * a is addressed a[m*sam + k*sak], so the same code reads A plain (x · W)
 * or transposed (dY^T · X) without a copy; b is row-major with row stride
 * ldb, c with ldc.  The register tile is MR rows by NR = 16 columns, held
 * as MR x NR/VW vectors V of VW floats.  Every element is summed from zero
 * in k order and then stored or added once, whichever path (full tile or
 * edge) computes it, so the result does not depend on the tiling.
 */
#define NR 16
#define GEMM_DEFINE(name, V, VU, VW, MR, MADD, attr)                                                 \
    static inline __attribute__((always_inline)) void name##_tile(                             \
        float *c, size_t ldc, const float *a, size_t sam, size_t sak, const float *b,          \
        size_t ldb, size_t K, const float *bias, int accumulate, const int mr)                 \
    {                                                                                          \
        enum { NV = NR / VW };                                                                 \
        V acc[MR][NV];                                                                         \
        for (int r = 0; r < mr; r++)                                                           \
            for (int v = 0; v < NV; v++)                                                       \
                acc[r][v] = (V){ 0 };                                                          \
        for (size_t k = 0; k < K; k++) {                                                       \
            V bk[NV];                                                                          \
            for (int v = 0; v < NV; v++)                                                       \
                bk[v] = *(const VU *)(b + k * ldb + v * VW);                                   \
            for (int r = 0; r < mr; r++) {                                                     \
                float ar = a[r * sam + k * sak];                                               \
                for (int v = 0; v < NV; v++)                                                   \
                    acc[r][v] += ar * bk[v];                                                   \
            }                                                                                  \
        }                                                                                      \
        for (int r = 0; r < mr; r++)                                                           \
            for (int v = 0; v < NV; v++) {                                                     \
                VU *cv = (VU *)(c + r * ldc + v * VW);                                         \
                if (accumulate)                                                                \
                    *cv += acc[r][v];                                                          \
                else if (bias)                                                                 \
                    *cv = acc[r][v] + *(const VU *)(bias + v * VW);                            \
                else                                                                           \
                    *cv = acc[r][v];                                                           \
            }                                                                                  \
    }                                                                                          \
                                                                                               \
    attr static void name(float *c, size_t ldc, const float *a, size_t sam, size_t sak,        \
                          const float *b, size_t ldb, size_t M, size_t K, size_t Nc,           \
                          const float *bias, int accumulate)                                   \
    {                                                                                          \
        size_t nfull = Nc - Nc % NR, m = 0;                                                    \
        for (; m + MR <= M; m += MR)                                                           \
            for (size_t n = 0; n < nfull; n += NR)                                             \
                name##_tile(c + m * ldc + n, ldc, a + m * sam, sam, sak, b + n, ldb, K,        \
                            bias ? bias + n : NULL, accumulate, MR);                           \
        for (; m < M; m++)                                                                     \
            for (size_t n = 0; n < nfull; n += NR)                                             \
                name##_tile(c + m * ldc + n, ldc, a + m * sam, sam, sak, b + n, ldb, K,        \
                            bias ? bias + n : NULL, accumulate, 1);                            \
        for (m = 0; m < M; m++) /* columns past the last full tile */                          \
            for (size_t n = nfull; n < Nc; n++) {                                              \
                float s = 0.0f;                                                                \
                for (size_t k = 0; k < K; k++)                                                 \
                    s = MADD(a[m * sam + k * sak], b[k * ldb + n], s);                         \
                if (accumulate)                                                                \
                    c[m * ldc + n] += s;                                                       \
                else                                                                           \
                    c[m * ldc + n] = bias ? s + bias[n] : s;                                   \
            }                                                                                  \
    }

/* The edge columns' multiply-add must round as the tiles' vector one does
 * (fused where the target fuses it), or a tensor-parallel slice whose
 * width is not a multiple of 16 would compute other bits than the whole. */
#define MADD_PLAIN(x, y, s) ((s) + (x) * (y))
#define MADD_FUSED(x, y, s) __builtin_fmaf((x), (y), (s))
#if defined(__FP_FAST_FMAF)
#define MADD_BASE MADD_FUSED
#else
#define MADD_BASE MADD_PLAIN
#endif

/* 128-bit vectors (SSE, NEON, or plain scalars): 3 x 4 accumulators. */
GEMM_DEFINE(gemm_v4, v4, v4u, 4, 3, MADD_BASE, )
#if KERN_X86
/* AVX2 + FMA: 6 x 2 accumulators of 8 floats, 12 of the 16 registers. */
GEMM_DEFINE(gemm_v8, v8, v8u, 8, 6, MADD_FUSED, KERN_V3)
#endif

void kern_gemm(float *c, size_t ldc, const float *a, size_t sam, size_t sak, const float *b,
               size_t ldb, size_t M, size_t K, size_t Nc, const float *bias, int accumulate)
{
#if KERN_X86
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        gemm_v8(c, ldc, a, sam, sak, b, ldb, M, K, Nc, bias, accumulate);
        return;
    }
#endif
    gemm_v4(c, ldc, a, sam, sak, b, ldb, M, K, Nc, bias, accumulate);
}

void kern_transpose(float *wt, const float *w, int O, int I)
{
    enum { TB = 16 }; /* tiles keep both sides of the transpose in cache lines */
    for (int o0 = 0; o0 < O; o0 += TB)
        for (int i0 = 0; i0 < I; i0 += TB)
            for (int i = i0; i < i0 + TB && i < I; i++)
                for (int o = o0; o < o0 + TB && o < O; o++)
                    wt[(size_t)i * O + o] = w[(size_t)o * I + i];
}

void kern_matmul_forward(float *out, const float *inp, const float *w, const float *bias,
                         float *wt, size_t N, int I, int O)
{
    /* Transposing costs O*I against the matmul's N*O*I, and turns every
     * inner loop into a contiguous axpy over output columns. */
    kern_transpose(wt, w, O, I);
    kern_gemm(out, (size_t)O, inp, (size_t)I, 1, wt, (size_t)O, N, (size_t)I, (size_t)O, bias, 0);
}

void kern_matmul_backward(float *dinp, float *dw, float *db, const float *dout,
                          const float *inp, const float *w, double *dscratch, size_t N, int I,
                          int O)
{
    if (dinp) /* (N, I) = dout (N, O) · w (O, I) */
        kern_gemm(dinp, (size_t)I, dout, (size_t)O, 1, w, (size_t)I, N, (size_t)O, (size_t)I, NULL,
             0);
    /* (O, I) += dout^T (O, N) · inp (N, I): A read transposed in place. */
    kern_gemm(dw, (size_t)I, dout, 1, (size_t)O, inp, (size_t)I, (size_t)O, N, (size_t)I, NULL, 1);
    if (db) {
        for (int o = 0; o < O; o++)
            dscratch[o] = 0.0;
        for (size_t n = 0; n < N; n++)
            for (int o = 0; o < O; o++)
                dscratch[o] += dout[n * O + o];
        for (int o = 0; o < O; o++)
            db[o] += (float)dscratch[o];
    }
}

/* ---- LayerNorm ---------------------------------------------------------- */

void kern_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *w, const float *b, size_t N, int C)
{
    for (size_t n = 0; n < N; n++) {
        const float *x = inp + n * C;
        double s = 0.0;
        for (int i = 0; i < C; i++)
            s += x[i];
        double mu = s / C;
        double v = 0.0; /* two-pass: no cancellation when |mean| >> std */
        for (int i = 0; i < C; i++) {
            double d = x[i] - mu;
            v += d * d;
        }
        double rs = 1.0 / sqrt(v / C + LN_EPS);
        float muf = (float)mu, rsf = (float)rs;
        float *y = out + n * C;
        for (int i = 0; i < C; i++)
            y[i] = (x[i] - muf) * rsf * w[i] + b[i];
        mean[n] = muf;
        rstd[n] = rsf;
    }
}

void kern_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                             const float *inp, const float *w, const float *mean,
                             const float *rstd, double *dscratch, size_t N, int C)
{
    double *dwacc = dscratch, *dbacc = dscratch + C;
    for (int i = 0; i < C; i++)
        dwacc[i] = dbacc[i] = 0.0;
    for (size_t n = 0; n < N; n++) {
        const float *x = inp + n * C, *dy = dout + n * C;
        float mu = mean[n], rs = rstd[n];
        /* xhat = (x - mu) rs, g = dy w; dx = rs (g - mean(g) - xhat mean(g xhat)) */
        double sg = 0.0, sgx = 0.0;
        for (int i = 0; i < C; i++) {
            float xhat = (x[i] - mu) * rs;
            float g = dy[i] * w[i];
            sg += g;
            sgx += (double)g * xhat;
            dwacc[i] += (double)dy[i] * xhat;
            dbacc[i] += dy[i];
        }
        float mg = (float)(sg / C), mgx = (float)(sgx / C);
        float *dx = dinp + n * C;
        for (int i = 0; i < C; i++) {
            float xhat = (x[i] - mu) * rs;
            dx[i] += rs * (dy[i] * w[i] - mg - xhat * mgx);
        }
    }
    for (int i = 0; i < C; i++) {
        dw[i] += (float)dwacc[i];
        db[i] += (float)dbacc[i];
    }
}

/* ---- attention ---------------------------------------------------------- */

/* a · b over n floats: eight interleaved partial sums (two 128-bit vectors)
 * over the leading multiple of 8, folded in a fixed order, then the tail.
 * Float is enough here: head sizes are tens of terms. */
static inline __attribute__((always_inline)) float dot(const float *a, const float *b, int n)
{
    int i = 0;
    float s = 0.0f;
    if (n >= 8) {
        v4 lo = *(const v4u *)a * *(const v4u *)b;
        v4 hi = *(const v4u *)(a + 4) * *(const v4u *)(b + 4);
        for (i = 8; i + 8 <= n; i += 8) {
            lo += *(const v4u *)(a + i) * *(const v4u *)(b + i);
            hi += *(const v4u *)(a + i + 4) * *(const v4u *)(b + i + 4);
        }
        v4 t = lo + hi;
        s = (t[0] + t[2]) + (t[1] + t[3]);
    }
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* y (n) += s * x (n) */
static inline __attribute__((always_inline)) void axpy(float *y, float s, const float *x, int n)
{
    for (int i = 0; i < n; i++)
        y[i] += s * x[i];
}

KERN_HOT void kern_attention_forward(float *out, float *att, const float *qkv, int B, int T,
                                     int C, int NH)
{
    int hs = C / NH;
    size_t C3 = 3 * (size_t)C;
    float scale = (float)(1.0 / sqrt((double)hs));
    for (int b = 0; b < B; b++) {
        const float *base = qkv + (size_t)b * T * C3;
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                const float *q = base + t * C3 + h * hs;
                float *p = att + (((size_t)b * NH + h) * T + t) * T;
                float smax = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    p[t2] = dot(q, base + t2 * C3 + C + h * hs, hs) * scale;
                    smax = p[t2] > smax ? p[t2] : smax;
                }
                double sum = 0.0;
                for (int t2 = 0; t2 <= t; t2++) {
                    p[t2] = expf(p[t2] - smax);
                    sum += p[t2];
                }
                float inv = (float)(1.0 / sum);
                for (int t2 = 0; t2 <= t; t2++)
                    p[t2] *= inv;
                float *y = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++)
                    y[i] = 0.0f;
                for (int t2 = 0; t2 <= t; t2++)
                    axpy(y, p[t2], base + t2 * C3 + 2 * C + h * hs, hs);
            }
        }
    }
}

KERN_HOT void kern_attention_backward(float *dqkv, const float *dout, const float *qkv,
                                      const float *att, double *dscratch, int B, int T, int C,
                                      int NH)
{
    int hs = C / NH;
    size_t C3 = 3 * (size_t)C;
    float scale = (float)(1.0 / sqrt((double)hs));
    memset(dqkv, 0, sizeof(float) * (size_t)B * T * C3);
    for (int b = 0; b < B; b++) {
        const float *base = qkv + (size_t)b * T * C3;
        float *dbase = dqkv + (size_t)b * T * C3;
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                const float *p = att + (((size_t)b * NH + h) * T + t) * T;
                const float *dy = dout + ((size_t)b * T + t) * C + h * hs;
                const float *q = base + t * C3 + h * hs;
                float *dq = dbase + t * C3 + h * hs;
                double *dp = dscratch;
                /* y = sum p v: dp = dy·v, dv += p dy */
                double sdp = 0.0;
                for (int t2 = 0; t2 <= t; t2++) {
                    dp[t2] = dot(dy, base + t2 * C3 + 2 * C + h * hs, hs);
                    sdp += p[t2] * dp[t2];
                    axpy(dbase + t2 * C3 + 2 * C + h * hs, p[t2], dy, hs);
                }
                /* softmax: ds = p (dp - sum p dp); score = scale q·k */
                for (int t2 = 0; t2 <= t; t2++) {
                    float ds = (float)(p[t2] * (dp[t2] - sdp)) * scale;
                    axpy(dq, ds, base + t2 * C3 + C + h * hs, hs);
                    axpy(dbase + t2 * C3 + C + h * hs, ds, q, hs);
                }
            }
        }
    }
}

/* ---- pointwise ---------------------------------------------------------- */

/*
 * tanh for GELU, in plain float arithmetic that gcc vectorizes (libm's
 * tanhf is a call per element and was a third of the step).  |u| < 0.5:
 * Taylor series to u^15 (truncation < 1e-8); beyond: 1 - 2/(e^{2|u|}+1),
 * with e^x = 2^n e^r, |r| <= ln2/2, Taylor to r^7.  Max relative error
 * 1.8e-7 over [-20, 20] (libm tanhf: 1.6e-7); |u| >= 9 gives +-1.
 */
static inline __attribute__((always_inline)) float tanh_gelu(float u)
{
    float a = fabsf(u), a2 = a * a;
    float ps = a * (1.0f + a2 * (-0x1.555556p-2f +
                                 a2 * (0x1.111112p-3f +
                                       a2 * (-0x1.ba1ba2p-5f +
                                             a2 * (0x1.664f48p-6f +
                                                   a2 * (-0x1.226e36p-7f +
                                                         a2 * (0x1.d6d3d0p-9f -
                                                               a2 * 0x1.7da364p-10f)))))));
    float x = 2.0f * a;
    x = x < 18.0f ? x : 18.0f;
    /* n = round(x / ln2) by the 1.5 * 2^23 trick: kf holds n in its low
     * mantissa bits, so no float-to-int conversion is needed (gcc will
     * not if-convert one, and the select below then blocks vectorizing). */
    float kf = x * 0x1.715476p+0f + 0x1.8p23f;
    float n = kf - 0x1.8p23f;
    float r = (x - n * 0x1.62e400p-1f) - n * 0x1.7f7d1cp-20f; /* ln2 in two parts */
    float e = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 +
                                  r * (1.0f / 120 + r * (1.0f / 720 + r * (1.0f / 5040)))))));
    union {
        uint32_t i;
        float f;
    } scale = { .f = kf };
    scale.i = (scale.i + 127) << 23; /* 2^n, 0 <= n <= 26: the high bits of kf shift out */
    float pl = 1.0f - 2.0f / (e * scale.f + 1.0f);
    return copysignf(a < 0.5f ? ps : pl, u);
}

KERN_HOT void kern_gelu_forward(float *out, float *deriv, const float *inp, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float th = tanh_gelu(GELU_S * (x + GELU_A * x * x * x));
        out[i] = 0.5f * x * (1.0f + th);
        deriv[i] = 0.5f * (1.0f + th) +
                   0.5f * x * (1.0f - th * th) * GELU_S * (1.0f + 3.0f * GELU_A * x * x);
    }
}

KERN_HOT void kern_gelu_backward(float *d, const float *deriv, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] *= deriv[i];
}

KERN_HOT void kern_add(float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

/* ---- loss --------------------------------------------------------------- */

void kern_rowmax(float *mx, const float *x, size_t N, int V)
{
    for (size_t n = 0; n < N; n++) {
        const float *l = x + n * V;
        float m = l[0];
        for (int v = 1; v < V; v++)
            m = l[v] > m ? l[v] : m;
        mx[n] = m;
    }
}

void kern_sumexp_tree(double *s, const float *x, const float *mx, double *scratch, size_t N,
                      int V)
{
    for (size_t n = 0; n < N; n++) {
        const float *l = x + n * V;
        for (int v = 0; v < V; v++)
            scratch[v] = expf(l[v] - mx[n]);
        for (int d = 1; d < V; d *= 2)
            for (int i = 0; i + d < V; i += 2 * d)
                scratch[i] += scratch[i + d];
        s[n] = scratch[0];
    }
}

void kern_crossentropy_backward(float *dlogits, const float *logits, const float *lse,
                                const uint8_t *targets, size_t N, int V, int v0, float scale)
{
    for (size_t n = 0; n < N; n++) {
        const float *l = logits + n * V;
        float *d = dlogits + n * V;
        float ls = lse[n];
        for (int v = 0; v < V; v++)
            d[v] = expf(l[v] - ls) * scale;
        int t = targets[n] - v0;
        if (t >= 0 && t < V)
            d[t] -= scale;
    }
}

/* ---- embeddings --------------------------------------------------------- */

void kern_encoder_forward(float *out, const uint8_t *tokens, const float *wte,
                          const float *wpe, int B, int T, int C)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            size_t n = (size_t)b * T + t;
            kern_add(out + n * C, wte + (size_t)tokens[n] * C, wpe + (size_t)t * C, (size_t)C);
        }
}

void kern_encoder_backward(float *dwte, float *dwpe, const float *dout, const uint8_t *tokens,
                           int v0, int V, double *dscratch, int B, int T, int C)
{
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < C; i++)
            dscratch[i] = 0.0;
        for (int b = 0; b < B; b++) {
            size_t n = (size_t)b * T + t;
            const float *dy = dout + n * C;
            int v = tokens[n] - v0;
            float *dw = v >= 0 && v < V ? dwte + (size_t)v * C : NULL;
            for (int i = 0; dw && i < C; i++)
                dw[i] += dy[i];
            for (int i = 0; i < C; i++)
                dscratch[i] += dy[i];
        }
        for (int i = 0; i < C; i++)
            dwpe[(size_t)t * C + i] += (float)dscratch[i];
    }
}
