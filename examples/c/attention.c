/* Varlen paged decode attention from C: load dusk's stock bundle through libdusk_capi.so
 * and run GQA 4 attention (16 query heads over 4 KV heads, head_dim 128, f16) over a
 * paged K/V cache, twice: over token lists, one per (sequence, KV head) shared by the
 * group (Twilight's group varlen; the lists here include an empty row and a one-token
 * row), and dense over every token. Each is a split kernel writing partial results and a
 * merge combining them by log-sum-exp; both outputs and log-sum-exps are checked against
 * a reference computed here in C.
 *
 * Build (see examples/c/README.md):
 *   cargo build --release -p dusk-capi
 *   gcc -O2 -std=c11 -Ikernels_gen/bundle examples/c/attention.c -Ltarget/release \
 *       -ldusk_capi -ldl -lm -Wl,-rpath,'$ORIGIN' -o attention-c
 * Run: ./attention-c kernels_gen/bundle    (exit 0: checked; 77: no GPU; 1: wrong)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

enum {
  D = 128,
  PAGE = 16,
  BATCH = 2,
  KV_HEADS = 4,
  GROUP = 4,
  Q_HEADS = KV_HEADS * GROUP,
  ROWS = BATCH * KV_HEADS, /* token lists: one per (sequence, KV head) */
  Q_ROWS = BATCH * Q_HEADS,
  CHUNK = 128,             /* dense: tokens per chunk of the split */
  MIN_SEGMENT = 64,        /* lists: the shortest segment of the balanced split */
  ROW_TOKENS = 24          /* lists: what a row start counts as, in entries */
};
static const double LOG2_E = 1.4426950408889634; /* softmax runs in base 2 */
static const int SEQ[BATCH] = {1000, 517};
/* Tokens each list keeps (at most its sequence's length). */
static const int KEEP[ROWS] = {700, 0, 1, 77, 517, 5, 250, 12};

static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* The cache and the query, on the host and the device. */
struct Inputs {
  int32_t kv_indptr[BATCH + 1], last_page_len[BATCH], *page_ids;
  uint16_t *q, *k, *v;
  CUdeviceptr dq, dk, dv, dindptr, dpages, dlast;
};

/* Attention of query row `qr` over positions `pos[0..n)` of its sequence: the output in
 * `out`, the natural-log log-sum-exp returned (-inf and zeros for an empty row). */
static double reference(const struct Inputs *in, int qr, const int32_t *pos, int n,
                        double *out) {
  int b = qr / Q_HEADS, h = (qr % Q_HEADS) / GROUP;
  double *s = malloc(sizeof(double) * (n ? n : 1)), m = -INFINITY, z = 0;
  size_t *rows = malloc(sizeof(size_t) * (n ? n : 1));
  for (int d = 0; d < D; d++) out[d] = 0;
  for (int j = 0; j < n; j++) {
    int page = in->page_ids[in->kv_indptr[b] + pos[j] / PAGE];
    rows[j] = ((size_t)page * PAGE + pos[j] % PAGE) * KV_HEADS + h;
    double dot = 0;
    for (int d = 0; d < D; d++) dot += h2f(in->q[(size_t)qr * D + d]) * h2f(in->k[rows[j] * D + d]);
    s[j] = dot / sqrt((double)D);
    m = s[j] > m ? s[j] : m;
  }
  for (int j = 0; j < n; j++) {
    double p = exp(s[j] - m);
    z += p;
    for (int d = 0; d < D; d++) out[d] += p * h2f(in->v[rows[j] * D + d]);
  }
  for (int d = 0; d < D && n; d++) out[d] /= z;
  free(s);
  free(rows);
  return n ? m + log(z) : -INFINITY;
}

/* Compares the device's `out` and `lse` with the reference for lists `indptr`/`indices`
 * (`NULL`: every token); prints the errors and returns 0 when they are small. */
static int check(const char *what, const struct Inputs *in, CUdeviceptr dout, CUdeviceptr dlse,
                 const int32_t *indptr, const int32_t *indices) {
  uint16_t *out = malloc(2 * (size_t)Q_ROWS * D);
  float lse[Q_ROWS];
  CU(cuMemcpyDtoH(out, dout, 2 * (size_t)Q_ROWS * D));
  CU(cuMemcpyDtoH(lse, dlse, sizeof lse));
  int32_t *all = malloc(sizeof(int32_t) * 4096);
  for (int i = 0; i < 4096; i++) all[i] = i;
  double num = 0, den = 0, lse_err = 0, want[D];
  int bad = 0;
  for (int qr = 0; qr < Q_ROWS; qr++) {
    int b = qr / Q_HEADS, row = b * KV_HEADS + (qr % Q_HEADS) / GROUP;
    const int32_t *pos = indices ? indices + indptr[row] : all;
    int n = indices ? indptr[row + 1] - indptr[row] : SEQ[b];
    double l = reference(in, qr, pos, n, want);
    for (int d = 0; d < D; d++) {
      double have = h2f(out[(size_t)qr * D + d]);
      if (isnan(have)) have = 1e30; /* unwritten (poisoned) output */
      num += (have - want[d]) * (have - want[d]);
      den += want[d] * want[d];
    }
    if (n == 0) {
      bad |= !(isinf(lse[qr]) && lse[qr] < 0);
    } else {
      double e = fabs(lse[qr] - l);
      if (!(e <= lse_err)) lse_err = isnan(e) ? INFINITY : e; /* NaN: unwritten */
    }
  }
  double err = sqrt(num / den);
  printf("%s: relative error %.2e, worst lse error %.1e vs the C reference%s\n", what, err,
         lse_err, bad ? "; an empty row's lse is not -inf" : "");
  free(out);
  free(all);
  return !(err < 2e-3 && lse_err < 1e-3) || bad;
}

static CUdeviceptr poisoned(size_t bytes) {
  CUdeviceptr d;
  CU(cuMemAlloc(&d, bytes));
  CU(cuMemsetD8(d, 0xFF, bytes));
  return d;
}

/* Token lists over `programs` split programs: partials for (programs + ROWS) pieces.
 * `counters` (ROWS + Q_ROWS i32, zeroed once before the first launch) is the split's and
 * the merge's state for merging each row as soon as its pieces are in: it carries from
 * launch to launch, so an engine keeps one for every step (any number of programs). */
static int run_lists(CUstream stream, const struct Inputs *in, int programs,
                     CUdeviceptr counters) {
  int32_t indptr[ROWS + 1] = {0}, *indices = malloc(sizeof(int32_t) * 4096 * ROWS);
  int32_t *perm = malloc(sizeof(int32_t) * 4096);
  for (int r = 0; r < ROWS; r++) {
    int n = SEQ[r / KV_HEADS], keep = KEEP[r] < n ? KEEP[r] : n;
    for (int i = 0; i < n; i++) perm[i] = i;
    for (int i = 0; i < keep; i++) { /* a partial shuffle: `keep` distinct positions */
      int j = i + (int)(frand(0, 1) * (n - i)) % (n - i), t = perm[i];
      perm[i] = perm[j]; perm[j] = t;
    }
    qsort(perm, keep, sizeof(int32_t), cmp_i32);
    memcpy(indices + indptr[r], perm, sizeof(int32_t) * keep);
    indptr[r + 1] = indptr[r] + keep;
  }
  int nnz = indptr[ROWS];
  CUdeviceptr dsel_indptr = upload(indptr, sizeof indptr);
  CUdeviceptr dsel = upload(indices, sizeof(int32_t) * (nnz ? nnz : 1));
  size_t pieces = (size_t)(programs + ROWS) * GROUP;
  CUdeviceptr part_o = poisoned(2 * pieces * D), part_lse = poisoned(4 * pieces);
  CUdeviceptr dout = poisoned(2 * (size_t)Q_ROWS * D), dlse = poisoned(4 * Q_ROWS);
  float scale_log2 = (float)(LOG2_E / sqrt((double)D));
  DUSK(dusk_attn_split_lists_d128_g4_f16(stream, in->dq, in->dk, in->dv, in->dindptr,
                                         in->dpages, in->dlast, dsel_indptr, dsel, part_o,
                                         part_lse, counters, Q_HEADS, KV_HEADS, ROWS,
                                         MIN_SEGMENT, ROW_TOKENS, nnz ? nnz : 1, scale_log2,
                                         programs));
  DUSK(dusk_attn_merge_lists_d128_f16(stream, part_o, part_lse, dout, dlse, dsel_indptr,
                                      counters, GROUP, ROWS, programs, nnz ? nnz : 1,
                                      MIN_SEGMENT, ROW_TOKENS, Q_ROWS));
  CU(cuStreamSynchronize(stream));
  char what[96];
  snprintf(what, sizeof what, "group varlen lists (%d tokens, %d split programs)", nnz, programs);
  int status = check(what, in, dout, dlse, indptr, indices);
  cuMemFree(dsel_indptr); cuMemFree(dsel); cuMemFree(part_o); cuMemFree(part_lse);
  cuMemFree(dout); cuMemFree(dlse);
  free(indices); free(perm);
  return status;
}

/* Every token: a grid of (ROWS, chunks) split programs of CHUNK tokens each. */
static int run_dense(CUstream stream, const struct Inputs *in) {
  int longest = SEQ[0] > SEQ[1] ? SEQ[0] : SEQ[1], chunks = (longest + CHUNK - 1) / CHUNK;
  size_t slots = (size_t)Q_ROWS * chunks;
  CUdeviceptr part_o = poisoned(2 * slots * D), part_lse = poisoned(4 * slots);
  CUdeviceptr dout = poisoned(2 * (size_t)Q_ROWS * D), dlse = poisoned(4 * Q_ROWS);
  float scale_log2 = (float)(LOG2_E / sqrt((double)D));
  DUSK(dusk_attn_split_dense_d128_g4_f16(stream, in->dq, in->dk, in->dv, in->dindptr,
                                         in->dpages, in->dlast, part_o, part_lse, Q_HEADS,
                                         KV_HEADS, CHUNK, chunks, scale_log2, ROWS, chunks));
  DUSK(dusk_attn_merge_dense_d128_f16(stream, part_o, part_lse, dout, dlse, chunks, Q_ROWS));
  CU(cuStreamSynchronize(stream));
  int status = check("dense", in, dout, dlse, NULL, NULL);
  cuMemFree(part_o); cuMemFree(part_lse); cuMemFree(dout); cuMemFree(dlse);
  return status;
}

int main(int argc, char **argv) {
  const char *bundle = argc > 1 ? argv[1] : "kernels_gen/bundle";
  CUdevice dev;
  CUstream stream;
  int opened = open_gpu(bundle, &stream, &dev);
  if (opened != 0) return opened;

  /* K and V caches [pages, 16, KV_HEADS, D] over shuffled pages; a random query. */
  struct Inputs in;
  in.kv_indptr[0] = 0;
  for (int b = 0; b < BATCH; b++) {
    int pages = (SEQ[b] + PAGE - 1) / PAGE;
    in.kv_indptr[b + 1] = in.kv_indptr[b] + pages;
    in.last_page_len[b] = SEQ[b] - (pages - 1) * PAGE;
  }
  int pages = in.kv_indptr[BATCH];
  in.page_ids = malloc(4 * (size_t)pages);
  for (int i = 0; i < pages; i++) in.page_ids[i] = i;
  for (int i = pages - 1; i > 0; i--) {
    int j = (int)(frand(0, 1) * (i + 1)) % (i + 1), t = in.page_ids[i];
    in.page_ids[i] = in.page_ids[j]; in.page_ids[j] = t;
  }
  size_t cache = (size_t)pages * PAGE * KV_HEADS * D;
  in.k = malloc(2 * cache);
  in.v = malloc(2 * cache);
  in.q = malloc(2 * (size_t)Q_ROWS * D);
  for (size_t i = 0; i < cache; i++) in.k[i] = f2h(frand(-2.0f, 2.0f));
  for (size_t i = 0; i < cache; i++) in.v[i] = f2h(frand(-2.0f, 2.0f));
  for (size_t i = 0; i < (size_t)Q_ROWS * D; i++) in.q[i] = f2h(frand(-2.0f, 2.0f));
  in.dq = upload(in.q, 2 * (size_t)Q_ROWS * D);
  in.dk = upload(in.k, 2 * cache);
  in.dv = upload(in.v, 2 * cache);
  in.dindptr = upload(in.kv_indptr, sizeof in.kv_indptr);
  in.dpages = upload(in.page_ids, 4 * (size_t)pages);
  in.dlast = upload(in.last_page_len, sizeof in.last_page_len);

  /* The balanced split takes any number of programs; as many as fit on the GPU at once is
   * fastest (the plans use SMs x programs an SM holds). A few long segments, too. */
  int sms = 0;
  CU(cuDeviceGetAttribute(&sms, 16 /* CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT */, dev));
  CUdeviceptr counters;
  CU(cuMemAlloc(&counters, 4 * (size_t)(ROWS + Q_ROWS)));
  CU(cuMemsetD8(counters, 0, 4 * (size_t)(ROWS + Q_ROWS)));
  int status = run_lists(stream, &in, 8 * sms, counters);
  status |= run_lists(stream, &in, 3, counters);
  cuMemFree(counters);
  status |= run_dense(stream, &in);
  dusk_shutdown();
  printf(status ? "FAILED\n" : "OK\n");
  return status;
}
