/* Twilight's top-p pruning from C: load dusk's stock bundle through libdusk_capi.so, run
 * the fused threshold search over rows of estimated attention scores (one query head per
 * candidate row, rows streamed in tiles of 1024), which writes the kept token positions
 * as one CSR list, and check every row against a sort-based oracle computed here in C.
 *
 * Build (see examples/c/README.md):
 *   cargo build --release -p dusk-capi
 *   gcc -O2 -std=c11 -Ikernels_gen/bundle examples/c/prune.c -Ltarget/release -ldusk_capi \
 *       -ldl -lm -Wl,-rpath,'$ORIGIN' -o prune-c
 * Run: ./prune-c kernels_gen/bundle        (exit 0: checked; 77: no GPU; 1: wrong)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

enum {
  ROWS = 6,
  TILE = 2048, /* the stock search streams its rows in tiles of this many candidates */
  MAX_LEN = 8192
};
/* Candidates of each row: long, medium, one, none, ... */
static const int LENS[ROWS] = {8192, 3000, 1, 0, 5000, 700};
static const double P = 0.9;
static const double SCALE = 0.08838834764831845; /* 1 / sqrt(128) */
static const double LOG2_E = 1.4426950408889634;

static const double *sort_w;
static int by_weight_desc(const void *a, const void *b) {
  double x = sort_w[*(const int *)a], y = sort_w[*(const int *)b];
  return (x < y) - (x > y);
}

/* The oracle's kept set of one row: the shortest prefix of the weights sorted in
 * descending order whose mass reaches P, with every weight equal to the last one kept.
 * Writes `keep` (0/1 per candidate); returns 1 when the cut lies within 1e-5 of P (a
 * near-tie, where float rounding may move it by one weight level). */
static int oracle(const float *s, int n, char *keep) {
  if (n == 0) return 0;
  double m = -INFINITY, z = 0;
  double *w = malloc(sizeof(double) * n);
  int *order = malloc(sizeof(int) * n);
  for (int i = 0; i < n; i++) m = s[i] > m ? s[i] : m;
  for (int i = 0; i < n; i++) z += (w[i] = exp((s[i] - m) * SCALE));
  for (int i = 0; i < n; i++) {
    w[i] /= z;
    order[i] = i;
  }
  sort_w = w;
  qsort(order, n, sizeof(int), by_weight_desc);
  double mass = 0, before = 0, cut = 0;
  for (int i = 0; i < n; i++) {
    before = mass;
    mass += w[order[i]];
    cut = w[order[i]];
    if (mass >= P) break;
  }
  for (int i = 0; i < n; i++) keep[i] = w[i] >= cut;
  int near = fabs(before - P) <= 1e-5 || fabs(mass - P) <= 1e-5;
  free(w);
  free(order);
  return near;
}

int main(int argc, char **argv) {
  const char *bundle = argc > 1 ? argv[1] : "kernels_gen/bundle";
  CUdevice dev;
  CUstream stream;
  int opened = open_gpu(bundle, &stream, &dev);
  if (opened != 0) return opened;

  /* Candidates: every other token position of each row's context; attention-like scores
   * (spread 2, a few spikes). */
  int32_t indptr[ROWS + 1] = {0};
  for (int r = 0; r < ROWS; r++) indptr[r + 1] = indptr[r] + LENS[r];
  int nnz = indptr[ROWS];
  int32_t *positions = malloc(sizeof(int32_t) * nnz);
  float *scores = malloc(sizeof(float) * nnz);
  for (int r = 0; r < ROWS; r++)
    for (int j = 0; j < LENS[r]; j++) {
      positions[indptr[r] + j] = 2 * j;
      float x = frand(-3.5f, 3.5f);
      scores[indptr[r] + j] = frand(0, 1) < 0.01f ? x + 6.0f : x;
    }
  float p[ROWS];
  for (int r = 0; r < ROWS; r++) p[r] = (float)P;

  CUdeviceptr dscores = upload(scores, 4 * (size_t)nnz), dindptr = upload(indptr, sizeof indptr);
  CUdeviceptr dpos = upload(positions, 4 * (size_t)nnz), dp = upload(p, sizeof p);
  CUdeviceptr scratch, prefix, budget, kept_mass, flags, sel_indptr, sel_indices;
  CU(cuMemAlloc(&scratch, 4 * (size_t)ROWS * TILE));
  /* The rows' look-back words: zero once; each launch leaves them zero. */
  CU(cuMemAlloc(&prefix, 4 * (ROWS + 1)));
  CU(cuMemsetD8(prefix, 0, 4 * (ROWS + 1)));
  CU(cuMemAlloc(&budget, 4 * ROWS));
  CU(cuMemAlloc(&kept_mass, 4 * ROWS));
  CU(cuMemAlloc(&flags, 4 * ROWS));
  CU(cuMemAlloc(&sel_indptr, 4 * (ROWS + 1)));
  CU(cuMemAlloc(&sel_indices, 4 * (size_t)nnz));
  /* Poisoned: what the kernels do not write fails the check. */
  CU(cuMemsetD8(sel_indptr, 0xFF, 4 * (ROWS + 1)));
  CU(cuMemsetD8(sel_indices, 0xFF, 4 * (size_t)nnz));
  CU(cuMemsetD8(budget, 0xFF, 4 * ROWS));

  DUSK(dusk_threshold_top_p_t2048_g1_w4_h_r_l2(stream, dscores, scratch, dindptr, dpos, dp,
                                        (float)(SCALE * LOG2_E), sel_indptr, sel_indices, prefix,
                                        budget, kept_mass, flags, ROWS));
  CU(cuStreamSynchronize(stream));

  int32_t got_indptr[ROWS + 1], *got = malloc(sizeof(int32_t) * nnz);
  CU(cuMemcpyDtoH(got_indptr, sel_indptr, sizeof got_indptr));
  CU(cuMemcpyDtoH(got, sel_indices, 4 * (size_t)nnz));
  char *keep = malloc(MAX_LEN);
  int status = got_indptr[0] != 0, near_ties = 0, kept = 0;
  for (int r = 0; r < ROWS && !status; r++) {
    int n = LENS[r], near = oracle(scores + indptr[r], n, keep), want = 0, same = 1;
    for (int j = 0; j < n; j++) want += keep[j];
    int have = got_indptr[r + 1] - got_indptr[r];
    if (have < 0 || got_indptr[r + 1] > nnz) {
      status = 1;
      break;
    }
    /* The row's list must be the kept positions in ascending order. */
    int k = 0;
    for (int j = 0; j < n && same; j++)
      if (keep[j]) same = k < have && got[got_indptr[r] + k++] == positions[indptr[r] + j];
    same = same && k == have;
    kept += have;
    if (!same && near) {
      near_ties++;
    } else if (!same) {
      fprintf(stderr, "row %d (%d candidates): %d kept, the oracle keeps %d\n", r, n, have, want);
      status = 1;
    }
  }
  printf("top-p %.2f over %d rows (%d candidates): %d kept, equal to the oracle%s\n", P, ROWS,
         nnz, kept, near_ties ? " but for near-ties" : "");
  dusk_shutdown();
  printf(status ? "FAILED\n" : "OK\n");
  return status;
}
