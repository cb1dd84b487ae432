/*
 * kernels.h - the numeric kernels of the trainer's model (model.c): matmul,
 * LayerNorm, causal attention, GELU, softmax cross-entropy, embeddings.
 * Single-threaded, allocation-free; every scratch buffer is the caller's.
 *
 * Conventions: N = B*T rows; tensors are row-major with the shape given in
 * the comments; "+=" outputs ACCUMULATE into what the caller holds, "="
 * outputs overwrite.  Unless noted, an accumulating kernel sums its own
 * contribution from zero and adds it once at the end, so adding the same
 * contribution twice gives exactly twice the first result.
 */
#ifndef WEFT_TRAINER_KERNELS_H
#define WEFT_TRAINER_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* c (M, Nc) = a (M, K) · b (K, Nc) [+ bias (Nc)], or c += a · b
 * (accumulate); a is addressed a[m*sam + k*sak], b and c are row-major
 * with row strides ldb and ldc.  Every element is summed from zero in k
 * order, whatever the tiling, so a column slice computes the same bits. */
void kern_gemm(float *c, size_t ldc, const float *a, size_t sam, size_t sak, const float *b,
               size_t ldb, size_t M, size_t K, size_t Nc, const float *bias, int accumulate);
/* wt (I, O) = w (O, I) transposed. */
void kern_transpose(float *wt, const float *w, int O, int I);

/* out (N, O) = inp (N, I) · w^T + bias, w (O, I), bias (O) or NULL.
 * wt: scratch of I*O floats (w transposed, so the inner loop runs along
 * contiguous output columns). */
void kern_matmul_forward(float *out, const float *inp, const float *w, const float *bias,
                         float *wt, size_t N, int I, int O);

/* dinp (N, I) = dout · w          (NULL: skipped)
 * dw   (O, I) += dout^T · inp
 * db   (O)    += sum over rows of dout   (NULL: skipped)
 * dscratch: max(O, 1) doubles.  dinp must not alias dout or inp. */
void kern_matmul_backward(float *dinp, float *dw, float *db, const float *dout,
                          const float *inp, const float *w, double *dscratch, size_t N, int I,
                          int O);

/* out (N, C) = (inp - mean) * rstd * w + b, eps 1e-5; mean, rstd (N) are
 * kept for the backward pass. */
void kern_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *w, const float *b, size_t N, int C);

/* dinp (N, C) += ..., dw (C) += ..., db (C) += ...;
 * dscratch: 2*C doubles. */
void kern_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                             const float *inp, const float *w, const float *mean,
                             const float *rstd, double *dscratch, size_t N, int C);

/* qkv (B*T, 3C) holds q | k | v, each split in NH heads of C/NH.
 * out (B*T, C) = softmax(q k^T / sqrt(hs), causal) v per head;
 * att (B, NH, T, T) keeps the probabilities (entries above the diagonal
 * are left untouched). */
void kern_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                            int NH);

/* dqkv (B*T, 3C) = gradient from dout (B*T, C).  dscratch: T doubles. */
void kern_attention_backward(float *dqkv, const float *dout, const float *qkv,
                             const float *att, double *dscratch, int B, int T, int C, int NH);

/* out (n) = GELU(inp), tanh approximation, and deriv (n) = GELU'(inp) for
 * the backward pass (one tanh per element, not two); deriv may be inp. */
void kern_gelu_forward(float *out, float *deriv, const float *inp, size_t n);
/* d (n) *= deriv, the derivative kept by the forward pass. */
void kern_gelu_backward(float *d, const float *deriv, size_t n);

/* out (n) = a + b; out may be a or b. */
void kern_add(float *out, const float *a, const float *b, size_t n);

/* mx (N) = the maximum of each row of x (N, V). */
void kern_rowmax(float *mx, const float *x, size_t N, int V);
/* s (N) = sum over v of expf(x - mx) per row, as a pairwise tree in double
 * (adjacent pairs first), so a slice of a row is a subtree.
 * scratch: V doubles. */
void kern_sumexp_tree(double *s, const float *x, const float *mx, double *scratch, size_t N,
                      int V);
/* dlogits (N, V) = (softmax(logits) - onehot(target)) * scale for the
 * vocabulary slice [v0, v0 + V); lse holds the whole rows' log-sum-exp. */
void kern_crossentropy_backward(float *dlogits, const float *logits, const float *lse,
                                const uint8_t *targets, size_t N, int V, int v0, float scale);

/* out (B*T, C) = wte[token] + wpe[t]. */
void kern_encoder_forward(float *out, const uint8_t *tokens, const float *wte,
                          const float *wpe, int B, int T, int C);
/* dwte (V, C) += dout rows at their tokens, for tokens of the vocabulary
 * slice [v0, v0 + V), one row at a time (not summed first: the caller
 * passes a scratch that it adds on once); dwpe (T, C) += sum over b of
 * dout.  dscratch: C doubles. */
void kern_encoder_backward(float *dwte, float *dwpe, const float *dout, const uint8_t *tokens,
                           int v0, int V, double *dscratch, int B, int T, int C);

#endif /* WEFT_TRAINER_KERNELS_H */
