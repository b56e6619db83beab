// Read-only loops over the packed bytes of a [K/2][N] INT4 matrix (QuantizedWeight's layout:
// byte [p][c], pair p of input rows, column c) in the batch-1 matvec's access order and task
// split, against one sequential read of the same bytes: what the order alone costs from DRAM
// (docs/benchmarks.md, "What bounds the batch-1 INT4 matvec"). Copies of the matrix (>= 96 MiB
// in all) are read in turn so that every call comes from DRAM; T threads take numbered tasks
// from a shared counter, as src/par.rs does. Prints the median and best of 60 calls in GB/s.
//
//   gcc -O2 -mavx2 -pthread -o /tmp/int4_read_order benches/int4_read_order.c
//   /tmp/int4_read_order T N K GS SPEC...
//
// SPEC is "mode,kblocks,colparts,strip,ahead,hint,pf,tile,slab": mode 0 reads each task's
// contiguous share in order (4 tasks per thread); mode 1 runs kblocks x colparts tasks (blocks
// of groups x column parts), each walking its groups in strips of `strip` bytes per row, `slab`
// pairs of rows side by side (0: the whole group), with software prefetch (pf 1) `ahead` bytes
// along each row (hint 0..3: T0, T1, T2, NTA), wrapping into the next slab's rows; pf 2 instead
// fetches, per strip, that strip's share of the next slab's packed block in file order (the
// int8-activation kernel's scheme, exact when a task spans every column). Example:
//   /tmp/int4_read_order 2 11008 4096 128 0 1,8,1,64,512,1,1,1,0 1,8,1,64,512,1,1,1,16
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static int K=4096,N=11008,GS=32,COPIES=4,T=2;
static uint8_t *bufs[8]; static size_t BYTES;
// pattern params
static int mode, kblocks=8, colparts=2, strip=64, ahead=512, hint=1, pf=1, tile=1, slab=0;
static volatile int64_t sink;
typedef struct { int copy; int ntask; volatile int next; } job_t;
static job_t job;
static pthread_barrier_t bar_start, bar_end;
static volatile int quit;
static inline void pfetch(const void*p){ if(hint==0)_mm_prefetch(p,_MM_HINT_T0); else if(hint==1)_mm_prefetch(p,_MM_HINT_T1); else if(hint==2) _mm_prefetch(p,_MM_HINT_T2); else _mm_prefetch(p,_MM_HINT_NTA);}
static __m256i task(const uint8_t*d, int t, __m256i acc){
  int ngroups=K/GS, half=GS/2;
  if(mode==0){ // sequential: task t of ntask contiguous
    size_t a=BYTES*t/job.ntask, b=BYTES*(t+1)/job.ntask; a&=~63; b = (t+1==job.ntask)?BYTES:(b&~63);
    for(size_t i=a;i<b;i+=64) acc=_mm256_or_si256(acc,_mm256_load_si256((const __m256i*)(d+i)));
    return acc;}
  int per=(ngroups+kblocks-1)/kblocks;
  int b=t/colparts, c=t%colparts;
  int width=((N+colparts-1)/colparts+127)/128*128; int c0=c*width, c1=c0+width; if(c1>N)c1=N;
  int g0=b*per,g1=g0+per; if(g1>ngroups)g1=ngroups;
  int S = slab? slab: half;
  for(int sg=g0*half/S;sg<g1*half/S;sg++){
    for(int o=c0;o+strip*tile<=c1;o+=strip*tile){
      for(int s=0;s<tile;s++){
      for(int p=sg*S;p<(sg+1)*S;p++){
        const uint8_t*row=d+(size_t)p*N+o+s*strip;
        if(pf==2){ if(p==sg*S){ // the next slab's block in file order, this strip's share
          const uint8_t*at=d+(size_t)(sg+1)*S*N+(size_t)(o+s*strip-c0)*S;
          for(int l=0;l<strip*S;l+=64) pfetch(at+l);}}
        else if(pf){ long a=o+s*strip+ahead; size_t at = a< c1 ? (size_t)p*N + a : (size_t)(p+S)*N + c0 + (a-c1);
          for(int l=0;l<strip;l+=64) pfetch(d+at+l);}
        for(int l=0;l<strip;l+=32) acc=_mm256_or_si256(acc,_mm256_loadu_si256((const __m256i*)(row+l)));
      }}
    }
  }
  return acc;
}
static void run(int copy,int me){__m256i acc=_mm256_setzero_si256();
  for(;;){int t=__sync_fetch_and_add(&job.next,1); if(t>=job.ntask)break; acc=task(bufs[copy],t,acc);}
  sink+=_mm256_extract_epi64(acc,0);}
static void* worker(void*a){ for(;;){pthread_barrier_wait(&bar_start); if(quit)return 0; run(job.copy,1); pthread_barrier_wait(&bar_end);} }
static double call(int copy){ job.copy=copy; job.next=0; job.ntask= mode==0? T*4 : kblocks*colparts; double t0=now();
  if(T>1) pthread_barrier_wait(&bar_start);
  run(copy,0);
  if(T>1) pthread_barrier_wait(&bar_end);
  return now()-t0;}
int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){
  T=atoi(argv[1]); N=atoi(argv[2]); K=atoi(argv[3]); GS=atoi(argv[4]);
  BYTES=(size_t)K/2*N; COPIES = (int)((96u<<20)/BYTES)+1; if(COPIES>8)COPIES=8;
  for(int i=0;i<COPIES;i++){bufs[i]=aligned_alloc(4096,(BYTES+4095)/4096*4096); memset(bufs[i],i+1,BYTES);}
  pthread_barrier_init(&bar_start,0,T); pthread_barrier_init(&bar_end,0,T);
  pthread_t th; if(T>1) pthread_create(&th,0,worker,0);
  for(int a=5;a<argc;a++){ // variant spec: mode,kblocks,colparts,strip,ahead,hint,pf,tile
    sscanf(argv[a],"%d,%d,%d,%d,%d,%d,%d,%d,%d",&mode,&kblocks,&colparts,&strip,&ahead,&hint,&pf,&tile,&slab);
    double ts[60]; int n=0; for(int r=0;r<3*COPIES;r++) call(r%COPIES);
    for(int r=0;r<60;r++) ts[n++]=call(r%COPIES);
    qsort(ts,n,sizeof(double),cmp);
    printf("%-28s median %6.2f GB/s  best %6.2f\n",argv[a],BYTES/ts[n/2]/1e9,BYTES/ts[0]/1e9); fflush(stdout);
  }
  return 0;}
