/* The engine-embedding path in plain C: load dusk's stock bundle through libdusk_capi.so,
 * quantize a paged K cache to 4 bits, score query heads against every token with the
 * quantized SpGEMV (MHA on dp2a, GQA 4 on the tensor cores), and check both kernels
 * against references computed here in C.
 *
 * Build (see examples/c/README.md):
 *   cargo build --release -p dusk-capi
 *   gcc -O2 -std=c11 -Ikernels_gen/bundle examples/c/spgemv.c -Ltarget/release -ldusk_capi \
 *       -ldl -lm -Wl,-rpath,'$ORIGIN' -o spgemv-c
 * Run: ./spgemv-c kernels_gen/bundle      (exit 0: checked; 77: no GPU; 1: wrong)
 *
 * The CUDA driver is opened with dlopen (common.h), so neither cuda.h nor a CUDA toolkit
 * is needed to build this file.
 *
 * Layouts: K is the engine's paged cache, [pages, PAGE, KV_HEADS, D] f16. The INT4 copy
 * quantize_k writes (and spgemv_quant reads) is dusk's own and head-major: codes
 * [pages, KV_HEADS, PAGE, D / 2] and f16 scale and zero [pages, KV_HEADS, PAGE], so one KV
 * head's page is one contiguous 1 KiB block. Token slot s of page p for head h is row
 * (p * PAGE + s) * KV_HEADS + h of K and row (p * KV_HEADS + h) * PAGE + s of the copy.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

enum { D = 128, PAGE = 16, BATCH = 2, KV_HEADS = 4, WORDS = D * 4 / 32 };
static const int LENS[BATCH] = {1000, 517};

/* The row of token slot s of physical page p for KV head h: in K (the engine's layout) and
 * in the quantized copy (head-major). */
static size_t k_row(size_t p, size_t s, size_t h) { return (p * PAGE + s) * KV_HEADS + h; }
static size_t q_row(size_t p, size_t s, size_t h) { return (p * KV_HEADS + h) * PAGE + s; }

/* Scores every token of every sequence for `q_heads` query heads; returns the relative
 * error against the C reference on the dequantized codes the GPU wrote. */
static double score(CUstream stream, int q_heads, CUdeviceptr dk_packed, CUdeviceptr dk_scale,
                    CUdeviceptr dk_zero, const uint8_t *packed, const uint16_t *scale,
                    const uint16_t *zero, const int32_t *page_ids, const int32_t *kv_indptr) {
  int group = q_heads / KV_HEADS, rows = BATCH * KV_HEADS, max_len = 0;
  /* Candidates: every token of each (sequence, KV head). */
  int32_t cand_indptr[BATCH * KV_HEADS + 1];
  int nnz = 0;
  cand_indptr[0] = 0;
  for (int r = 0; r < rows; r++) {
    nnz += LENS[r / KV_HEADS];
    cand_indptr[r + 1] = nnz;
    if (LENS[r / KV_HEADS] > max_len) max_len = LENS[r / KV_HEADS];
  }
  int32_t *cand = malloc(sizeof(int32_t) * nnz);
  for (int r = 0; r < rows; r++)
    for (int j = 0; j < LENS[r / KV_HEADS]; j++) cand[cand_indptr[r] + j] = j;
  size_t q_len = (size_t)BATCH * q_heads * D;
  uint16_t *q = malloc(2 * q_len);
  for (size_t i = 0; i < q_len; i++) q[i] = f2h(frand(-2.0f, 2.0f));

  CUdeviceptr dq = upload(q, 2 * q_len), dindptr = upload(kv_indptr, 4 * (BATCH + 1));
  CUdeviceptr dpages = upload(page_ids, 4 * (size_t)kv_indptr[BATCH]);
  CUdeviceptr dcand_indptr = upload(cand_indptr, sizeof cand_indptr), dcand = upload(cand, 4 * (size_t)nnz);
  CUdeviceptr dscores;
  size_t n_scores = (size_t)nnz * group;
  CU(cuMemAlloc(&dscores, 4 * n_scores));
  CU(cuMemsetD8(dscores, 0xFF, 4 * n_scores)); /* NaN: unwritten scores fail the check */
  if (group == 1) {
    /* MHA: the query to fixed point, then dp2a. */
    CUdeviceptr qpack, qscale, qsum;
    size_t q_rows = (size_t)BATCH * q_heads;
    CU(cuMemAlloc(&qpack, 4 * q_rows * 4 * WORDS));
    CU(cuMemAlloc(&qscale, 4 * q_rows));
    CU(cuMemAlloc(&qsum, 4 * q_rows));
    DUSK(dusk_spgemv_prepare_q_d128_b4(stream, dq, qpack, qscale, qsum, q_rows));
    DUSK(dusk_spgemv_quant_dp2a_d128_g1_b4_t64_w2_o14(
        stream, qpack, qscale, qsum, dk_packed, dk_scale, dk_zero, dindptr, dpages,
        dcand_indptr, dcand, dscores, KV_HEADS, rows, max_len));
    CU(cuStreamSynchronize(stream));
    cuMemFree(qpack); cuMemFree(qscale); cuMemFree(qsum);
  } else {
    /* GQA 4: the tensor cores read the f16 query directly. */
    DUSK(dusk_spgemv_quant_mma_d128_g4_b4_t64_w4_o0_x16_l2(
        stream, dq, dk_packed, dk_scale, dk_zero, dindptr, dpages, dcand_indptr, dcand,
        dscores, KV_HEADS, rows, max_len));
    CU(cuStreamSynchronize(stream));
  }
  float *got = malloc(4 * n_scores);
  CU(cuMemcpyDtoH(got, dscores, 4 * n_scores));
  double num = 0, den = 0;
  for (int r = 0; r < rows; r++) {
    int b = r / KV_HEADS, h = r % KV_HEADS, n = LENS[b], start = cand_indptr[r];
    for (int j = 0; j < n; j++) {
      int pos = cand[start + j];
      int page = page_ids[kv_indptr[b] + pos / PAGE];
      size_t krow = q_row(page, pos % PAGE, h);
      double sc = h2f(scale[krow]), z = h2f(zero[krow]);
      for (int g = 0; g < group; g++) {
        const uint16_t *qr = q + ((size_t)b * q_heads + h * group + g) * D;
        double want = 0;
        for (int d = 0; d < D; d++) {
          int code = (packed[krow * (D / 2) + d / 2] >> (4 * (d % 2))) & 15;
          want += h2f(qr[d]) * (code * sc + z);
        }
        double have = got[(size_t)start * group + (size_t)g * n + j];
        if (isnan(have)) have = 1e30;
        num += (have - want) * (have - want);
        den += want * want;
      }
    }
  }
  cuMemFree(dq); cuMemFree(dindptr); cuMemFree(dpages); cuMemFree(dcand_indptr);
  cuMemFree(dcand); cuMemFree(dscores);
  free(got); free(q); free(cand);
  return sqrt(num / den);
}

int main(int argc, char **argv) {
  const char *bundle = argc > 1 ? argv[1] : "kernels_gen/bundle";
  CUdevice dev;
  CUstream stream;
  int opened = open_gpu(bundle, &stream, &dev);
  if (opened != 0) return opened;

  /* A paged K cache [pages, 16, KV_HEADS, D] over shuffled pages. */
  int32_t kv_indptr[BATCH + 1] = {0};
  for (int b = 0; b < BATCH; b++) kv_indptr[b + 1] = kv_indptr[b] + (LENS[b] + PAGE - 1) / PAGE;
  int pages = kv_indptr[BATCH];
  int32_t *page_ids = malloc(4 * (size_t)pages);
  for (int i = 0; i < pages; i++) page_ids[i] = i;
  for (int i = pages - 1; i > 0; i--) {
    int j = (int)(frand(0, 1) * (i + 1)) % (i + 1), t = page_ids[i];
    page_ids[i] = page_ids[j]; page_ids[j] = t;
  }
  size_t krows = (size_t)pages * PAGE * KV_HEADS;
  uint16_t *k = malloc(2 * krows * D);
  for (size_t i = 0; i < krows * D; i++) k[i] = f2h(frand(-2.0f, 2.0f));

  /* quantize_k: 4-bit codes, f16 scale and zero per row, into the head-major copy. */
  CUdeviceptr dk = upload(k, 2 * krows * D), dpacked, dscale, dzero;
  CU(cuMemAlloc(&dpacked, krows * D / 2));
  CU(cuMemAlloc(&dscale, 2 * krows));
  CU(cuMemAlloc(&dzero, 2 * krows));
  DUSK(dusk_quantize_k4_d128(stream, dk, dpacked, dscale, dzero, (int32_t)krows, KV_HEADS,
                             PAGE));
  CU(cuStreamSynchronize(stream));
  uint8_t *packed = malloc(krows * D / 2);
  uint16_t *scale = malloc(2 * krows), *zero = malloc(2 * krows);
  CU(cuMemcpyDtoH(packed, dpacked, krows * D / 2));
  CU(cuMemcpyDtoH(scale, dscale, 2 * krows));
  CU(cuMemcpyDtoH(zero, dzero, 2 * krows));
  /* Reference check of the quantization: for each row of K (k_row), its row of the copy
   * (q_row) has zero the row minimum, scale its range / 15 (both as f16), and every value
   * within half a step of its code's value. */
  double worst = 0;
  for (size_t p = 0; p < (size_t)pages; p++)
    for (size_t sl = 0; sl < PAGE; sl++)
      for (size_t h = 0; h < KV_HEADS; h++) {
        size_t kr = k_row(p, sl, h), r = q_row(p, sl, h);
        float lo = INFINITY, hi = -INFINITY;
        for (int d = 0; d < D; d++) {
          float x = h2f(k[kr * D + d]);
          lo = x < lo ? x : lo; hi = x > hi ? x : hi;
        }
        if (scale[r] != f2h((hi - lo) / 15.0f) || zero[r] != f2h(lo)) {
          fprintf(stderr,
                  "quantize_k: page %zu slot %zu head %zu has scale %g zero %g, want %g %g\n",
                  p, sl, h, h2f(scale[r]), h2f(zero[r]), (hi - lo) / 15.0f, lo);
          return 1;
        }
        float s = h2f(scale[r]), z = h2f(zero[r]);
        for (int d = 0; d < D; d++) {
          int code = (packed[r * (D / 2) + d / 2] >> (4 * (d % 2))) & 15;
          double err = fabs(code * s + z - h2f(k[kr * D + d])) / s;
          worst = err > worst ? err : worst;
        }
      }
  printf("quantize_k4_d128: %zu rows, worst reconstruction error %.3f steps\n", krows, worst);
  if (worst > 0.51) return 1; /* 0.5, plus f16 rounding of the scale */

  int status = 0;
  int heads[2] = {KV_HEADS, 4 * KV_HEADS};
  for (int i = 0; i < 2; i++) {
    double err = score(stream, heads[i], dpacked, dscale, dzero, packed, scale, zero, page_ids,
                       kv_indptr);
    printf("spgemv_quant %s (q heads %d / kv heads %d): relative error %.2e vs the C reference\n",
           i == 0 ? "dp2a" : "mma", heads[i], KV_HEADS, err);
    if (!(err < 1e-3)) status = 1;
  }
  dusk_shutdown();
  printf(status ? "FAILED\n" : "OK\n");
  return status;
}
