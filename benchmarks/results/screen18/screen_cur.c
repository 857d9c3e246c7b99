/* screen_of alone (the tree's span_aligner.c) on screen_data.py's filter and targets, best of 3,000 calls (screen18):
 *   cc -O2 -I TREE/semblend_dynamo/_native benchmarks/results/screen18/screen_cur.c -o /tmp/sc && /tmp/sc DIR */
#include "span_aligner.c"
#include <stdio.h>
#include <time.h>

static uint8_t bits[65536];
static uint32_t targets[2][8192];
static uint64_t passed[2 * 8192 + 64];

static int load(const char *dir, const char *name, void *to, size_t bytes) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(to, 1, bytes, f) : 0;
    if (f) fclose(f);
    return got == bytes;
}

int main(int argc, char **argv) {
    if (argc < 2 || !load(argv[1], "bits.bin", bits, sizeof bits) || !load(argv[1], "miss.bin", targets[0], 32768) ||
        !load(argv[1], "hit.bin", targets[1], 32768))
        return 2;
    sa_table tb = {0};
    tb.bits = bits;
    tb.filter_shift = 45;
    for (int which = 0; which < 2; which++) {
        double best = 1e18;
        int64_t rows = 0;
        for (int rep = 0; rep < 3000; rep++) {
            struct timespec a, b;
            clock_gettime(CLOCK_MONOTONIC, &a);
            rows = screen_of(&tb, targets[which], 4, 8192, 32, passed);
            clock_gettime(CLOCK_MONOTONIC, &b);
            double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
            if (ns < best) best = ns;
        }
        printf("%s %6.2f us (%lld rows)\n", which ? "hit " : "miss", best / 1e3, (long long)rows);
    }
    return 0;
}
