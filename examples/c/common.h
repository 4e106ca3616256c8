/* What the C examples share: the few CUDA driver calls they make (opened with dlopen, so
 * neither cuda.h nor a CUDA toolkit is needed), error checks, half <-> float, a small
 * random generator, uploads, and opening the first GPU. Header-only: each example is one
 * translation unit.
 */
#ifndef DUSK_EXAMPLE_COMMON_H
#define DUSK_EXAMPLE_COMMON_H
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dusk.h"

/* The few driver calls this program makes (CUDA driver API, stable ABI). */
typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
static CUresult (*cuInit)(unsigned);
static CUresult (*cuDeviceGet)(CUdevice *, int);
static CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
static CUresult (*cuCtxSetCurrent)(CUcontext);
static CUresult (*cuStreamCreate)(CUstream *, unsigned);
static CUresult (*cuStreamSynchronize)(CUstream);
static CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
static CUresult (*cuMemFree)(CUdeviceptr);
static CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
static CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
static CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t);
static CUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);

#define CU(call)                                                          \
  do {                                                                    \
    CUresult r_ = (call);                                                 \
    if (r_ != 0) {                                                        \
      fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #call, r_); \
      exit(1);                                                            \
    }                                                                     \
  } while (0)
#define DUSK(call)                                                        \
  do {                                                                    \
    if ((call) != 0) {                                                    \
      fprintf(stderr, "%s failed: %s\n", #call, dusk_last_error());       \
      exit(1);                                                            \
    }                                                                     \
  } while (0)

static inline int load_driver(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) lib = dlopen("libcuda.so", RTLD_NOW);
  if (!lib) return 0;
#define SYM(var, name) *(void **)&var = dlsym(lib, name); if (!var) return 0
  SYM(cuInit, "cuInit");
  SYM(cuDeviceGet, "cuDeviceGet");
  SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  SYM(cuCtxSetCurrent, "cuCtxSetCurrent");
  SYM(cuStreamCreate, "cuStreamCreate");
  SYM(cuStreamSynchronize, "cuStreamSynchronize");
  SYM(cuMemAlloc, "cuMemAlloc_v2");
  SYM(cuMemFree, "cuMemFree_v2");
  SYM(cuMemcpyHtoD, "cuMemcpyHtoD_v2");
  SYM(cuMemcpyDtoH, "cuMemcpyDtoH_v2");
  SYM(cuMemsetD8, "cuMemsetD8_v2");
  SYM(cuDeviceGetAttribute, "cuDeviceGetAttribute");
#undef SYM
  return 1;
}

/* IEEE half <-> float, enough for the normal values used here. */
static inline float h2f(uint16_t h) {
  uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023, bits;
  if (e == 0) { float f = ldexpf((float)m, -24); return s ? -f : f; }
  if (e == 31) bits = s | 0x7f800000u | (m << 13);
  else bits = s | ((e + 112) << 23) | (m << 13);
  float f; memcpy(&f, &bits, 4); return f;
}
static inline uint16_t f2h(float f) { /* round to nearest even; |f| below half's range or 0 */
  uint32_t x; memcpy(&x, &f, 4);
  uint32_t s = (x >> 16) & 0x8000, e = (x >> 23) & 255, m = x & 0x7fffff;
  if (e < 102) return (uint16_t)s; /* under half the smallest subnormal: zero */
  /* Normal halves keep 10 mantissa bits; subnormals (e < 113) keep fewer, the implicit
   * bit shifted in. Rounding may carry into the exponent, which is the right result. */
  uint32_t shift = e < 113 ? 126 - e : 13, mant = e < 113 ? m | 0x800000 : m;
  uint32_t h = s | (e < 113 ? 0 : (e - 112) << 10) | (mant >> shift);
  uint32_t rest = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rest > half || (rest == half && (h & 1))) h++;
  return (uint16_t)h;
}

static uint32_t rng = 12345u;
static inline float frand(float lo, float hi) {
  rng = rng * 1664525u + 1013904223u;
  return lo + (hi - lo) * (float)(rng >> 8) / 16777216.0f;
}

static inline CUdeviceptr upload(const void *host, size_t bytes) {
  CUdeviceptr d;
  CU(cuMemAlloc(&d, bytes ? bytes : 1));
  if (bytes) CU(cuMemcpyHtoD(d, host, bytes));
  return d;
}

/* Opens the CUDA driver, makes the first GPU's primary context current, creates a stream
 * and loads the bundle in `bundle_dir`. Returns 0, or 77 when there is no driver or GPU
 * (the examples then have nothing to run). */
static inline int open_gpu(const char *bundle_dir, CUstream *stream, CUdevice *dev) {
  CUcontext ctx;
  if (!load_driver()) {
    printf("no CUDA driver (libcuda.so.1): nothing to run\n");
    return 77;
  }
  if (cuInit(0) != 0 || cuDeviceGet(dev, 0) != 0) {
    printf("no usable GPU: nothing to run\n");
    return 77;
  }
  CU(cuDevicePrimaryCtxRetain(&ctx, *dev));
  CU(cuCtxSetCurrent(ctx));
  CU(cuStreamCreate(stream, 0));
  DUSK(dusk_init(bundle_dir));
  return 0;
}

#endif /* DUSK_EXAMPLE_COMMON_H */
