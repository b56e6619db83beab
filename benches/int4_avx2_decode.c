// Inner loops of the AVX2 INT4 matvec (src/int4/avx2.rs, strips.rs) with other decodings of
// the same packed bytes, timed in one process on one thread from L2: what bounds the
// float32 batch-1 kernel on a core without AVX-512 (docs/benchmarks.md, "What bounds the
// batch-1 INT4 matvec"). Layout as QuantizedWeight's: byte [p][c] holds the signed nibbles
// of rows 2p (low) and 2p + 1 (high) of column c; one f32 scale per group of 32 rows and
// column; strips of 64 columns, 8 accumulators, one FMA with the scales per group.
//
//   gcc -O3 -march=native -o /tmp/int4_avx2_decode benches/int4_avx2_decode.c
//   /tmp/int4_avx2_decode [IN OUT]      (default 256 1024: 160 KiB, in L2)
//
// Prints, per variant, the fastest of 200 alternating calls in thread CPU time (robust to
// other jobs on the machine), ns per 32 weights, its ratio to the kernel's decode ("now"),
// and whether its outputs equal the kernel's bit for bit ("offset" cannot: see its note).
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_s(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

#define V 8
#define TOP _mm256_set1_epi32((int) 0xF0000000u)
// One kernel: BEFORE runs once per pair row (loads), BODY per vector v (0..7) sets lo and
// hi, the f32 values of the low and high nibbles of columns 8v..8v+7 times 2^28 (lo) and
// HI_SCALE (hi); xs holds x times 2^-28, and x1 is rescaled once per pair row (exact).
#define KERNEL(NAME, HI_SCALE, BEFORE, BODY)                                                             \
    __attribute__((target("avx2,fma"), noinline)) static void NAME(                            \
        const uint8_t *data, const float *sc, const float *xs, int n, int k, float *y) {        \
        memset(y, 0, sizeof(float) * n);                                                        \
        for (int g = 0; g < k / 32; g++)                                                        \
            for (int o = 0; o + 8 * V <= n; o += 8 * V) {                                       \
                __m256 acc[V];                                                                  \
                for (int v = 0; v < V; v++) acc[v] = _mm256_setzero_ps();                       \
                for (int p = g * 16; p < g * 16 + 16; p++) {                                    \
                    const uint8_t *row = data + (size_t) p * n + o;                             \
                    __m256 x0 = _mm256_set1_ps(xs[2 * p]);                                      \
                    __m256 x1 = _mm256_set1_ps(xs[2 * p + 1] * (0x1p28f / (HI_SCALE)));         \
                    BEFORE                                                                      \
                    for (int v = 0; v < V; v++) {                                               \
                        __m256 lo, hi;                                                          \
                        BODY                                                                    \
                        acc[v] = _mm256_fmadd_ps(lo, x0, acc[v]);                               \
                        acc[v] = _mm256_fmadd_ps(hi, x1, acc[v]);                               \
                    }                                                                           \
                }                                                                               \
                for (int v = 0; v < V; v++) {                                                   \
                    float *yp = y + o + 8 * v;                                                  \
                    __m256 s = _mm256_loadu_ps(sc + (size_t) g * n + o + 8 * v);                \
                    _mm256_storeu_ps(yp, _mm256_fmadd_ps(acc[v], s, _mm256_loadu_ps(yp)));      \
                }                                                                               \
            }                                                                                   \
    }
#define CVT(i) _mm256_cvtepi32_ps(i)

// The kernel's: sign-extending load of 8 bytes; (b << 28) = lo * 2^28, (b & ~15) = hi * 16.
KERNEL(now, 16.0f, ,
    __m256i w = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *) (row + 8 * v)));
    lo = CVT(_mm256_slli_epi32(w, 28)); hi = CVT(_mm256_and_si256(w, _mm256_set1_epi32(~15)));)
// A 32-byte load per 32 columns; each nibble shifted to the top of its dword and masked
// (exact, signed); the columns come out in a stride-4 order (timing only: order ignored).
#define LOAD2 __m256i d0 = _mm256_loadu_si256((const __m256i *) row), d1 = _mm256_loadu_si256((const __m256i *) (row + 32));
KERNEL(top_shift, 0x1p28f, LOAD2,
    __m256i d = v < 4 ? d0 : d1;
    __m256i a; __m256i b;
    switch (v & 3) {
    case 0: a = _mm256_slli_epi32(d, 28); b = _mm256_and_si256(_mm256_slli_epi32(d, 24), TOP); break;
    case 1: a = _mm256_and_si256(_mm256_slli_epi32(d, 20), TOP); b = _mm256_and_si256(_mm256_slli_epi32(d, 16), TOP); break;
    case 2: a = _mm256_and_si256(_mm256_slli_epi32(d, 12), TOP); b = _mm256_and_si256(_mm256_slli_epi32(d, 8), TOP); break;
    default: a = _mm256_and_si256(_mm256_slli_epi32(d, 4), TOP); b = _mm256_and_si256(d, TOP); break;
    }
    lo = CVT(a); hi = CVT(b);)
// vpbroadcastq of 8 bytes and vpshufb of each byte to the top of a dword: lo = t << 4, hi = t & top.
KERNEL(bcast_shuffle, 0x1p28f, ,
    __m256i t = _mm256_shuffle_epi8(_mm256_set1_epi64x(*(const long long *) (row + 8 * v)),
        _mm256_setr_epi8(-1, -1, -1, 0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3, -1, -1, -1, 4, -1, -1, -1, 5, -1, -1, -1, 6, -1, -1, -1, 7));
    lo = CVT(_mm256_slli_epi32(t, 4)); hi = CVT(_mm256_and_si256(t, TOP));)
// One 16-byte load per 16 columns, vpmovsxbd from the register (the high half unpacked first).
#define LOAD4 __m128i q[4]; for (int i = 0; i < 4; i++) q[i] = _mm_loadu_si128((const __m128i *) (row + 16 * i));
KERNEL(sx_register, 16.0f, LOAD4,
    __m128i b = v & 1 ? _mm_unpackhi_epi64(q[v >> 1], q[v >> 1]) : q[v >> 1];
    __m256i w = _mm256_cvtepi8_epi32(b);
    lo = CVT(_mm256_slli_epi32(w, 28)); hi = CVT(_mm256_and_si256(w, _mm256_set1_epi32(~15)));)
// Zero-interleaving unpacks (bytes to words to dwords) put each byte at the top of a dword.
#define UNPACK LOAD2 __m256i z = _mm256_setzero_si256(), e[4] = {_mm256_unpacklo_epi8(z, d0), _mm256_unpackhi_epi8(z, d0), _mm256_unpacklo_epi8(z, d1), _mm256_unpackhi_epi8(z, d1)};
KERNEL(unpack_top, 0x1p28f, UNPACK,
    __m256i t = v & 1 ? _mm256_unpackhi_epi16(z, e[v >> 1]) : _mm256_unpacklo_epi16(z, e[v >> 1]);
    lo = CVT(_mm256_slli_epi32(t, 4)); hi = CVT(_mm256_and_si256(t, TOP));)
// Overlapping unaligned loads 3, 2, 1, 0 bytes before the strip: each dword's top byte is a
// column (no shuffle); lo needs a shift and a mask, hi a mask.
KERNEL(overlap, 0x1p28f, ,
    __m256i t = _mm256_loadu_si256((const __m256i *) (row - 3 + (v & 3) + 32 * (v >> 2)));
    lo = CVT(_mm256_and_si256(_mm256_slli_epi32(t, 4), TOP)); hi = CVT(_mm256_and_si256(t, TOP));)
// Not exact: xor 0x88 makes every nibble q + 8 (0..15), one AND each; the +8 is taken off per
// group as 8 sum(x). The sums then hold terms up to 15 |x|, so their rounding scales with
// sum |x|, not with sum |x w| as the documented bound needs (timing only).
#define XOR2 __m256i k88 = _mm256_set1_epi8((char) 0x88); __m256i d0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *) row), k88), d1 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *) (row + 32)), k88);
KERNEL(offset, 0x1p28f, XOR2,
    __m256i d = v < 4 ? d0 : d1; int m = v & 3;
    lo = CVT(_mm256_and_si256(d, _mm256_set1_epi32(0xF << (8 * m))));
    hi = CVT(_mm256_and_si256(d, _mm256_set1_epi32(0xF0 << (8 * m)))););

typedef void (*kernel_fn)(const uint8_t *, const float *, const float *, int, int, float *);

int main(int argc, char **argv) {
    int k = argc > 2 ? atoi(argv[1]) : 256, n = argc > 2 ? atoi(argv[2]) : 1024;
    if (k % 32 || n % 64) { fprintf(stderr, "IN must be a multiple of 32, OUT of 64\n"); return 2; }
    size_t bytes = (size_t) k / 2 * n;
    uint8_t *buf = malloc(bytes + 64), *data = buf + 32;  // 32 bytes before: `overlap` reads 3 back
    float *sc = malloc(sizeof(float) * (size_t) k / 32 * n), *xs = malloc(sizeof(float) * k);
    srand(1);
    for (size_t i = 0; i < bytes + 64; i++) buf[i] = (uint8_t) rand();
    for (size_t i = 0; i < (size_t) k / 32 * n; i++) sc[i] = 1.0f + (float) (i % 7) / 8;
    for (int i = 0; i < k; i++) xs[i] = ((float) rand() / RAND_MAX - 0.5f) * 0x1p-28f;
    kernel_fn fns[] = {now, top_shift, bcast_shuffle, sx_register, unpack_top, overlap, offset};
    const char *names[] = {"now", "top_shift", "bcast_shuffle", "sx_register", "unpack_top", "overlap", "offset"};
    int count = sizeof fns / sizeof *fns;
    double best[16];
    float *ys[16];
    for (int i = 0; i < count; i++) best[i] = 1e9, ys[i] = malloc(sizeof(float) * n);
    for (int r = 0; r < 200; r++)
        for (int i = 0; i < count; i++) {
            double t = cpu_s();
            fns[i](data, sc, xs, n, k, ys[i]);
            t = cpu_s() - t;
            if (t < best[i]) best[i] = t;
        }
    for (int i = 0; i < count; i++) {
        double ns = best[i] / ((double) k * n / 32) * 1e9;
        int same = memcmp(ys[i], ys[0], sizeof(float) * n) == 0;
        printf("%-14s %.3f ns/32 weights  %.2fx now's time  %s\n", names[i], ns, best[i] / best[0],
               i == 0 ? "" : same ? "same bits" : "other order or bits");
    }
    return 0;
}
