/* Dependent-load latency (ns a load) over a random cyclic permutation: one load a 64-byte line, the lines spread
 * over SIZE bytes; STRIDE 64 touches every line of the region, 4096 one line a page (a TLB miss each beyond the TLB). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

int main(int argc, char **argv) {
  size_t size = strtoull(argv[1], 0, 10), stride = strtoull(argv[2], 0, 10);
  size_t n = size / stride;
  char *mem = aligned_alloc(4096, size);
  size_t *order = malloc(n * sizeof(size_t));
  for (size_t i = 0; i < n; i++) order[i] = i;
  srand(1);
  for (size_t i = n - 1; i > 0; i--) { size_t j = ((size_t)rand() * RAND_MAX + rand()) % (i + 1); size_t t = order[i]; order[i] = order[j]; order[j] = t; }
  for (size_t i = 0; i < n; i++) *(void **)(mem + order[i] * stride) = mem + order[(i + 1) % n] * stride;
  void **p = (void **)(mem + order[0] * stride);
  size_t loads = 20000000;
  for (size_t i = 0; i < n; i++) p = (void **)*p;  /* warm */
  double t0 = now();
  for (size_t i = 0; i < loads; i++) p = (void **)*p;
  double t = now() - t0;
  printf("size %8zu KiB stride %5zu: %6.1f ns a load%s\n", size >> 10, stride, t / loads * 1e9, p ? "" : " ");
  return 0;
}
