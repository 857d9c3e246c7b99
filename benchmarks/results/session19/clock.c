/* A dependent 64-bit multiply-add chain (the rolling hash's step) and a dependent add chain: ns per step, to tell a
 * slow clock from slow memory (session 19). Usage: clock [STEPS] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    long steps = argc > 1 ? atol(argv[1]) : 200000000L;
    volatile uint64_t seed = 12345;
    uint64_t h = seed, a = seed;
    double t0 = now();
    for (long i = 0; i < steps; i++) h = h * 0x9E3779B97F4A7C15ULL + (uint64_t)i;
    double t1 = now();
    for (long i = 0; i < steps; i++) {
        a += (uint64_t)i ^ (a >> 7);
    }
    double t2 = now();
    printf("mul-add chain %.3f ns a step, add chain %.3f ns a step (%lu %lu)\n", (t1 - t0) * 1e9 / steps,
           (t2 - t1) * 1e9 / steps, (unsigned long)(h & 1), (unsigned long)(a & 1));
    return 0;
}
