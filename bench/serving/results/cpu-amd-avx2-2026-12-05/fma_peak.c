// This machine's fp32 multiply-add peak on two threads: twelve independent chains of 256-bit
// FMAs per thread, best of five runs. Build and run:
//   gcc -O3 -funroll-loops -mavx2 -mfma -fopenmp fma_peak.c -o fma_peak && ./fma_peak
// (-O2 without unrolling kept the chains in memory: 85 GFLOP/s.)
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
#include <omp.h>
int main(){
  double best=0;
  for(int rep=0;rep<5;rep++){
  double t0=omp_get_wtime(); long iters=200000000; float out=0;
  #pragma omp parallel num_threads(2) reduction(+:out)
  {
    __m256 a[12]; __m256 b=_mm256_set1_ps(1.0000001f), c=_mm256_set1_ps(1e-7f);
    for(int i=0;i<12;i++) a[i]=_mm256_set1_ps((float)i);
    for(long n=0;n<iters/2;n++){
      for(int i=0;i<12;i++) a[i]=_mm256_fmadd_ps(a[i],b,c);
    }
    __m256 s=a[0]; for(int i=1;i<12;i++) s=_mm256_add_ps(s,a[i]);
    float t[8]; _mm256_storeu_ps(t,s); out+=t[0];
  }
  double dt=omp_get_wtime()-t0; double gf=iters*12.0*8*2/dt/1e9; if(gf>best)best=gf;
  if(out==1234.5f) printf("x");
  }
  printf("fp32 FMA peak, 2 threads: %.1f GFLOP/s\n",best);
}
