"""Instrument main 8ad6843's span_aligner.c for stages_ab.py (dec19): ``python instrument.py TREE`` rewrites
TREE/semblend_dynamo/_native/span_aligner.c (a copy of a tree, never a checkout) with rdtsc stamps between sa_align's
stages (sa_times) and the variants stages_ab.py switches per decision (sa_set_variant); rebuild it afterwards."""

import sys
from pathlib import Path

p = Path(sys.argv[1]) / "semblend_dynamo" / "_native" / "span_aligner.c"
s = p.read_text()


def sub(old: str, new: str) -> None:
    global s
    assert old in s, old[:60]
    s = s.replace(old, new)


sub(
    '#define EXPORT __attribute__((visibility("default")))',
    '#define EXPORT __attribute__((visibility("default")))\n#include <x86intrin.h>\nstatic uint64_t sa_t[8];\n'
    "EXPORT uint64_t *sa_times(void){return sa_t;}\n#define STAMP(i) (sa_t[i] = __rdtsc())\n"
    "static int64_t sa_variant;\nEXPORT void sa_set_variant(int64_t v){sa_variant=v;}\n",
)
sub(
    "            (end) += 2;                        \\\n        }",
    "            (end) += 2;                        \\\n            if (vpf) { uint64_t b_ = ((h) * PROBE_MIX) >> cshift;"
    " __builtin_prefetch(ckeys + 8 * b_); __builtin_prefetch(cids + 8 * b_); } \\\n        }",
)
sub(
    "    const uint64_t shift = tb->filter_shift;\n    int64_t n_passed = 0;",
    "    const uint64_t shift = tb->filter_shift;\n    const int vpf = sa_variant & 1;\n"
    "    const uint64_t cshift = tb->chunks.shift; const uint64_t *ckeys = tb->chunks.keys;"
    " const int32_t *cids = tb->chunks.ids;\n"
    "    if (sa_variant & 4) { uint64_t nb = ((uint64_t)1 << (64 - shift)) >> 3;"
    " for (uint64_t o = 0; o < nb; o += 64) __builtin_prefetch(bits + o); }\n    int64_t n_passed = 0;",
)
sub(
    "if ((((uint64_t)1 << (64 - shift)) >> 3) > SCREEN_PREFETCH_BYTES) {",
    "if ((sa_variant & 2) || (((uint64_t)1 << (64 - shift)) >> 3) > SCREEN_PREFETCH_BYTES) {",
)
sub(
    """        } else {
            uint64_t h0 = window_hash(t, width, 0, anchor), h1 = window_hash(t, width, q, anchor);""",
    """        } else if (sa_variant & 16) {
#define FIRST(end, pos, h) do { uint64_t m_ = (h) * MIX, s_ = m_ >> shift; uint64_t w_; memcpy(&w_, bits + 8 * (s_ >> 6), 8); \\
            (end)[0] = (uint64_t)(pos); (end)[1] = (h); (end) += 2 * ((w_ >> (s_ & 63)) & 1); } while (0)
            uint64_t h0 = window_hash(t, width, 0, anchor), h1 = window_hash(t, width, q, anchor);
            uint64_t h2 = window_hash(t, width, 2 * q, anchor), h3 = window_hash(t, width, 3 * q, anchor);
            for (int64_t i = 0;; i++) {
                FIRST(end0, i, h0);
                FIRST(end1, q + i, h1);
                FIRST(end2, 2 * q + i, h2);
                FIRST(end3, 3 * q + i, h3);
                if (i + 1 == q) break;
                ROLL_LANES(h0, h1, h2, h3, i);
            }
            uint64_t **ends_[4] = {&end0, &end1, &end2, &end3};
            for (int k = 0; k < 4; k++) {
                uint64_t *part = passed + 2 * k * q, *w = part;
                for (uint64_t *r = part; r < *ends_[k]; r += 2) {
                    uint64_t m = r[1] * MIX, slot = m >> shift;
                    if (filter_bit(bits, (slot & ~(uint64_t)511) | ((m >> (shift - 9)) & 511))) {
                        w[0] = r[0], w[1] = r[1];
                        if (vpf) { uint64_t b_ = (r[1] * PROBE_MIX) >> cshift; __builtin_prefetch(ckeys + 8 * b_);
                                   __builtin_prefetch(cids + 8 * b_); }
                        w += 2;
                    }
                }
                *ends_[k] = w;
            }
        } else {
            uint64_t h0 = window_hash(t, width, 0, anchor), h1 = window_hash(t, width, q, anchor);""",
)
sub(
    "    int64_t n_passed = screen_of(tb, t, width, n, anchor, passed);\n",
    "    if (sa_variant & 8) screen_of(tb, t, width, n, anchor, passed);\n    STAMP(0);\n"
    "    int64_t n_passed = screen_of(tb, t, width, n, anchor, passed);\n    STAMP(1);\n",
)
sub(
    "    int64_t n_hits = 0;\n    for (int64_t k = 0; k < n_passed; k++) {\n        int64_t pos",
    "    STAMP(2);\n    int64_t n_hits = 0;\n    for (int64_t k = 0; k < n_passed; k++) {\n        int64_t pos",
)
sub(
    "    int64_t n_diags = diagonals_of(hits, n_hits, max_diagonals, diags);",
    "    STAMP(3);\n    int64_t n_diags = diagonals_of(hits, n_hits, max_diagonals, diags);\n"
    "    STAMP(4); sa_t[7] = n_hits; sa_t[6] = sa_t[5] = 0;",
)
sub("    int64_t n_runs = runs_of(", "    STAMP(5);\n    int64_t n_runs = runs_of(")
sub(
    "    if (n_runs == 0) return 0;\n    candidate *found",
    "    STAMP(6);\n    if (n_runs == 0) return 0;\n    candidate *found",
)
p.write_text(s)
