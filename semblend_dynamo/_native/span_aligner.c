/* SpanAligner.align's request path (semblend_dynamo/span_aligner.py) in plain C, as one call: no Python API, so one
 * shared library serves every CPython version. Loaded with ctypes by semblend_dynamo/_native/__init__.py, which
 * documents the structures; the numpy implementation in span_aligner.py is the reference this must match exactly.
 *
 * All integers are int64 unless named otherwise; arrays are C-contiguous and owned by Python, which keeps them alive
 * and unchanged for the call (the call may run without the GIL). Token arrays (a target and the donors compared with
 * it) are of one width per call, `width` bytes a token: 8 (int64, the router's) or 4 (uint32, the connector's); the
 * function that reads tokens has one body, compiled once per width.
 *
 * The library also holds the router's block maps' bulk lookup, write and merge (um_locate, um_assign, um_merge, at the
 * end). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

#ifndef SA_SOURCE_DIGEST
#define SA_SOURCE_DIGEST "unknown"
#endif

static const uint64_t BASE = 0x9E3779B97F4A7C15ULL | 1;
static const uint64_t MIX = 0xD6E8FEB86659FD93ULL;
static const uint64_t PROBE_MIX = 0xBF58476D1CE4E5B9ULL;
static const int32_t EMPTY = -1;
static const int OFFSET_BITS = 32;

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* Token i of an array of `width`-byte tokens; `width` is a constant in every caller's specialization. */
ALWAYS_INLINE uint64_t token(const void *tokens, int64_t i, int width) {
    return width == 4 ? ((const uint32_t *)tokens)[i] : (uint64_t)((const int64_t *)tokens)[i];
}

/* An _IdTable: uint64 key -> int32 id in buckets of 8 (id -1 empty, -2 removed), linear probing over buckets. */
typedef struct {
    const uint64_t *keys;
    const int32_t *ids;
    uint64_t shift;
    uint64_t mask;
} id_table;

/* One namespace's chunk table, as _ChunkTable holds it. */
typedef struct {
    const uint8_t *bits; /* filter bitset, little bit order */
    uint64_t filter_shift;
    id_table chunks;              /* chunk hash -> key id */
    const int64_t *single_serial; /* per key id: the one donor's serial, -1 when several donors share the chunk */
    const int64_t *single_offset;
    /* Per key id of a chunk several donors share: the address of its postings (serial << 32 | donor offset, oldest
     * first, as _ChunkTable.postings lists them) and how many. */
    const int64_t *shared_at;
    const int64_t *shared_count;
} sa_table;

/* The aligner's donors, for the comparisons: serial -> slot, and each slot's token address and length. */
typedef struct {
    id_table serials;
    const int64_t *address;
    const int64_t *length;
} sa_donors;

EXPORT const char *sa_source_digest(void) { return SA_SOURCE_DIGEST; }

static int64_t find_id(const id_table *tb, uint64_t key) {
    uint64_t bucket = (key * PROBE_MIX) >> tb->shift;
    for (;;) {
        const uint64_t *keys = tb->keys + 8 * bucket;
        const int32_t *ids = tb->ids + 8 * bucket;
        int open = 0;
        for (int e = 0; e < 8; e++) {
            if (ids[e] >= 0 && keys[e] == key) return ids[e];
            open |= ids[e] == EMPTY;
        }
        if (open) return -1;
        bucket = (bucket + 1) & tb->mask;
    }
}

static int allowed_serial(const int64_t *allowed, int64_t n_allowed, int64_t serial) {
    if (n_allowed < 0) return 1;
    int64_t lo = 0, hi = n_allowed;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (allowed[mid] < serial)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n_allowed && allowed[lo] == serial;
}

/* The hash of the window t[at:at+anchor]: sum of t[at+j] * BASE**j (mod 2**64), as SpanAligner._window_sums. */
ALWAYS_INLINE uint64_t window_hash(const void *t, int width, int64_t at, int64_t anchor) {
    uint64_t h = 0, power = 1;
    for (int64_t j = 0; j < anchor; j++) {
        h += token(t, at + j, width) * power;
        power *= BASE;
    }
    return h;
}

/* Bit `at` of the filter (little bit order): where bytes are little-endian, read in the 64-bit word that holds it (one
 * load and one bit test, the shift's count masked by the test itself), else in its byte. */
ALWAYS_INLINE uint64_t filter_bit(const uint8_t *bits, uint64_t at) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t word;
    memcpy(&word, bits + 8 * (at >> 6), 8); /* the filter is whole words: 2**12 bits or more */
    return (word >> (at & 63)) & 1;
#else
    return (bits[at >> 3] >> (at & 7)) & 1;
#endif
}

/* The filter's verdict on a window hash: 1 when the window may be a chunk (no false negatives). A chunk sets two bits:
 * the first at the mixed hash's top bits, the second in the same 512-bit block (one cache line) at the next 9 bits
 * (_ChunkTable.slots); the second is read only when the first is set (a branch: reading both every window was
 * slower, the screen being bound by instructions per window). `bits` and `shift` are the table's, held in locals by
 * the caller: read through `tb`, they were read again after every row written (the rows might alias them). */
ALWAYS_INLINE uint64_t filter_passes(const uint8_t *bits, uint64_t shift, uint64_t h) {
    uint64_t mixed = h * MIX;
    uint64_t slot = mixed >> shift;
    if (!filter_bit(bits, slot)) return 0;
    return filter_bit(bits, (slot & ~(uint64_t)511) | ((mixed >> (shift - 9)) & 511));
}

/* The chunk id table's bucket of a hash (its keys' line and its ids'), asked of the memory. */
ALWAYS_INLINE void bucket_prefetch(const id_table *tb, uint64_t key) {
    uint64_t bucket = (key * PROBE_MIX) >> tb->shift;
    __builtin_prefetch(tb->keys + 8 * bucket);
    __builtin_prefetch(tb->ids + 8 * bucket);
}

/* One window screened: its row (position, hash) written at `end`, which moves past it, when it passes the filter; its
 * bucket of the id table is asked for at once (hits_of reads it after the screen), so the few hundred buckets' cache
 * misses overlap the screen's work instead of following it (-12 us of a hit's search in the VM's decisions, where
 * a bucket read after the screen missed the caches nearly every time: session 19). */
#define SCREEN(end, pos, h)                    \
    do {                                       \
        if (filter_passes(bits, shift, (h))) { \
            (end)[0] = (uint64_t)(pos);        \
            (end)[1] = (h);                    \
            (end) += 2;                        \
            bucket_prefetch(chunks, (h));      \
        }                                      \
    } while (0)

#define SCREEN_LANES 4
#define SCREEN_AHEAD 16 /* windows a lane hashes (and asks the memory for) ahead of the one it tests; a power of 2 */
/* Filters of more bytes than this (about a core's L2 cache) are screened with their bytes prefetched ahead: between
 * requests most of such a filter leaves the caches. A smaller one mostly stays, and the prefetches would only add
 * instructions (+14 us a miss at 8K tokens against a 64 KB filter on an H200 host's CPU, session 15). */
#define SCREEN_PREFETCH_BYTES ((uint64_t)1 << 20)

/* Each lane's hash rolled from its window `at` (of its stretch of q windows) to the next; screen_of's locals. */
#define ROLL_LANES(h0, h1, h2, h3, at)                                                                   \
    do {                                                                                               \
        h0 = (h0 - token(t, (at), width)) * base_inv + token(t, (at) + anchor, width) * top;             \
        h1 = (h1 - token(t, q + (at), width)) * base_inv + token(t, q + (at) + anchor, width) * top;     \
        h2 = (h2 - token(t, 2 * q + (at), width)) * base_inv + token(t, 2 * q + (at) + anchor, width) * top; \
        h3 = (h3 - token(t, 3 * q + (at), width)) * base_inv + token(t, 3 * q + (at) + anchor, width) * top; \
    } while (0)

/* The filter's byte for a window hash, asked of the memory ahead of its test. */
ALWAYS_INLINE void filter_prefetch(const uint8_t *bits, uint64_t shift, uint64_t h) {
    __builtin_prefetch(bits + (((h * MIX) >> shift) >> 3));
}

/* Every window of `anchor` tokens of t[0:n] (n >= anchor) screened by the filter, as rows (position, hash) of the
 * windows that pass, in position order, to `passed` (2 words per window). The hash rolls along four stretches of the
 * target at once: one rolling hash is a chain of dependent multiplies, four independent ones keep the multiplier
 * busy. Stretch k holds windows [k * q, (k + 1) * q), the windows past 4 * q (fewer than four) follow; each writes to
 * its own part of `passed`, and the parts are joined in order. A filter larger than SCREEN_PREFETCH_BYTES has each
 * window's byte prefetched SCREEN_AHEAD windows before the window is tested. Returns how many rows. */
ALWAYS_INLINE int64_t screen_of(const sa_table *tb, const void *t, int width, int64_t n, int64_t anchor,
                                uint64_t *passed) {
    int64_t windows = n - anchor + 1;
    int64_t q = windows / SCREEN_LANES;
    uint64_t top = 1; /* BASE ** (anchor - 1) */
    for (int64_t j = 1; j < anchor; j++) top *= BASE;
    uint64_t base_inv = BASE; /* Newton's iteration for the inverse modulo 2**64 */
    for (int k = 0; k < 6; k++) base_inv *= 2 - BASE * base_inv;
    const uint8_t *bits = tb->bits;
    const uint64_t shift = tb->filter_shift;
    const id_table *chunks = &tb->chunks;
    int64_t n_passed = 0;
    if (q > 0) {
        uint64_t *end0 = passed, *end1 = passed + 2 * q, *end2 = passed + 4 * q, *end3 = passed + 6 * q;
        if ((((uint64_t)1 << (64 - shift)) >> 3) > SCREEN_PREFETCH_BYTES) {
            /* Lane k's hash of window k * q + i waits in ring[i % SCREEN_AHEAD][k], hashed and its filter byte asked
             * for SCREEN_AHEAD windows before its test: the filter is larger than what the caches keep between
             * requests, and a test's branch on memory would otherwise hold back the next windows' misses. */
            uint64_t ring[SCREEN_AHEAD][SCREEN_LANES];
            uint64_t a0 = window_hash(t, width, 0, anchor), a1 = window_hash(t, width, q, anchor);
            uint64_t a2 = window_hash(t, width, 2 * q, anchor), a3 = window_hash(t, width, 3 * q, anchor);
            int64_t ahead = q < SCREEN_AHEAD ? q : SCREEN_AHEAD;
            for (int64_t i = 0;; i++) { /* a_k: lane k's hash of window k * q + i */
                ring[i][0] = a0, ring[i][1] = a1, ring[i][2] = a2, ring[i][3] = a3;
                filter_prefetch(bits, shift, a0), filter_prefetch(bits, shift, a1);
                filter_prefetch(bits, shift, a2), filter_prefetch(bits, shift, a3);
                if (i + 1 == ahead) break;
                ROLL_LANES(a0, a1, a2, a3, i);
            }
            for (int64_t i = 0; i < q; i++) {
                int64_t next = i + ahead; /* the window hashed now, rolled from window next - 1 */
                if (next < q) {
                    int64_t at = next - 1;
                    ROLL_LANES(a0, a1, a2, a3, at);
                    filter_prefetch(bits, shift, a0), filter_prefetch(bits, shift, a1);
                    filter_prefetch(bits, shift, a2), filter_prefetch(bits, shift, a3);
                }
                uint64_t *due = ring[i & (SCREEN_AHEAD - 1)];
                SCREEN(end0, i, due[0]);
                SCREEN(end1, q + i, due[1]);
                SCREEN(end2, 2 * q + i, due[2]);
                SCREEN(end3, 3 * q + i, due[3]);
                if (next < q) due[0] = a0, due[1] = a1, due[2] = a2, due[3] = a3;
            }
        } else {
            uint64_t h0 = window_hash(t, width, 0, anchor), h1 = window_hash(t, width, q, anchor);
            uint64_t h2 = window_hash(t, width, 2 * q, anchor), h3 = window_hash(t, width, 3 * q, anchor);
            for (int64_t i = 0;; i++) {
                SCREEN(end0, i, h0);
                SCREEN(end1, q + i, h1);
                SCREEN(end2, 2 * q + i, h2);
                SCREEN(end3, 3 * q + i, h3);
                if (i + 1 == q) break;
                ROLL_LANES(h0, h1, h2, h3, i);
            }
        }
        n_passed = (end0 - passed) / 2;
        const uint64_t *ends[3] = {end1, end2, end3};
        for (int k = 0; k < 3; k++) { /* moved down: each part starts at or after where it goes */
            const uint64_t *part = passed + 2 * (k + 1) * q;
            for (int64_t e = 0; e < ends[k] - part; e++) passed[2 * n_passed + e] = part[e];
            n_passed += (ends[k] - part) / 2;
        }
    }
    /* The rest, fewer than four windows (all of them when the target has fewer than four): written past the parts'
     * room, then moved down. */
    uint64_t *rest = passed + 2 * SCREEN_LANES * q, *end = rest;
    for (int64_t i = SCREEN_LANES * q; i < windows; i++) SCREEN(end, i, window_hash(t, width, i, anchor));
    for (int64_t e = 0; e < end - rest; e++) passed[2 * n_passed + e] = rest[e];
    return n_passed + (end - rest) / 2;
}

/* Every window of `anchor` tokens of t[0:n] (n >= anchor) screened by the filter and looked up in the id table; writes
 * the hits as rows (serial, delta, position) to `hits`: a chunk of one donor gives its posting when the serial is
 * allowed, a chunk several donors share its newest `max_postings` allowed postings. `passed` holds 2 rows per window,
 * `hits` 3 * max_postings. Returns how many hit rows. */
ALWAYS_INLINE int64_t hits_of(const sa_table *tb, const void *t, int width, int64_t n, int64_t anchor,
                              int64_t max_postings, const int64_t *allowed, int64_t n_allowed, uint64_t *passed,
                              int64_t *hits) {
    int64_t n_passed = screen_of(tb, t, width, n, anchor, passed);
    /* The screen asked for the buckets of the windows that passed as they passed; each window's key id (in place of
     * its hash), whose per-key entries are fetched ahead the same way. */
    for (int64_t k = 0; k < n_passed; k++) {
        int64_t id = find_id(&tb->chunks, passed[2 * k + 1]);
        passed[2 * k + 1] = (uint64_t)id;
        if (id >= 0) {
            __builtin_prefetch(tb->single_serial + id);
            __builtin_prefetch(tb->single_offset + id);
        }
    }
    int64_t n_hits = 0;
    for (int64_t k = 0; k < n_passed; k++) {
        int64_t pos = (int64_t)passed[2 * k];
        int64_t id = (int64_t)passed[2 * k + 1];
        if (id < 0) continue;
        int64_t serial = tb->single_serial[id];
        if (serial >= 0) {
            if (!allowed_serial(allowed, n_allowed, serial)) continue;
            hits[3 * n_hits] = serial;
            hits[3 * n_hits + 1] = pos - tb->single_offset[id];
            hits[3 * n_hits + 2] = pos;
            n_hits++;
            continue;
        }
        /* Several donors: newest first (the list's end), at most max_postings allowed ones. */
        const int64_t *postings = (const int64_t *)(uintptr_t)tb->shared_at[id];
        int64_t taken = 0;
        for (int64_t j = tb->shared_count[id] - 1; j >= 0 && taken < max_postings; j--) {
            int64_t packed = postings[j];
            serial = packed >> OFFSET_BITS;
            if (!allowed_serial(allowed, n_allowed, serial)) continue;
            hits[3 * n_hits] = serial;
            hits[3 * n_hits + 1] = pos - (packed & (((int64_t)1 << OFFSET_BITS) - 1));
            hits[3 * n_hits + 2] = pos;
            n_hits++;
            taken++;
        }
    }
    return n_hits;
}

typedef struct {
    int64_t serial, delta, hits, first, last;
} diagonal;

static uint64_t mix2(uint64_t a, uint64_t b) {
    uint64_t x = a * PROBE_MIX ^ (b + 0x9E3779B97F4A7C15ULL) * MIX;
    return x ^ (x >> 29);
}

static uint64_t table_size(int64_t n) {
    uint64_t size = 16;
    while (size < 2 * (uint64_t)n) size *= 2;
    return size;
}

/* Most hits first, then the newest donor, then the smallest delta: a total order ((serial, delta) is unique). */
static int by_rank(const void *pa, const void *pb) {
    const diagonal *a = pa, *b = pb;
    if (a->hits != b->hits) return a->hits > b->hits ? -1 : 1;
    if (a->serial != b->serial) return a->serial > b->serial ? -1 : 1;
    if (a->delta != b->delta) return a->delta < b->delta ? -1 : 1;
    return 0;
}

static int same_signature(const diagonal *a, const diagonal *b) {
    return a->delta == b->delta && a->first == b->first && a->last == b->last && a->hits == b->hits;
}

/* Groups the hit rows (serial, delta, position) by diagonal (serial, delta): hit count, first and last position. Ranks
 * the diagonals, drops those whose (delta, first, last, hits) an earlier one has, and writes the first `max_diagonals`
 * of the rest as rows (serial, delta, first, last) to `out`. Returns how many, or -1 when out of memory. */
static int64_t diagonals_of(const int64_t *hits, int64_t total, int64_t max_diagonals, int64_t *out) {
    if (total == 0) return 0;
    uint64_t size = table_size(total);
    int64_t *slots = malloc(size * sizeof(int64_t));
    diagonal *diags = malloc((size_t)total * sizeof(diagonal));
    if (!slots || !diags) {
        free(slots);
        free(diags);
        return -1;
    }
    for (uint64_t s = 0; s < size; s++) slots[s] = -1;
    int64_t n_diags = 0;
    for (int64_t k = 0; k < total; k++) {
        const int64_t *hit = hits + 3 * k;
        int64_t serial = hit[0], delta = hit[1], pos = hit[2];
        uint64_t s = mix2((uint64_t)serial, (uint64_t)delta) & (size - 1);
        while (slots[s] >= 0 && (diags[slots[s]].serial != serial || diags[slots[s]].delta != delta))
            s = (s + 1) & (size - 1);
        if (slots[s] < 0) {
            slots[s] = n_diags;
            diags[n_diags++] = (diagonal){serial, delta, 1, pos, pos};
        } else {
            diagonal *d = &diags[slots[s]];
            d->hits++;
            if (pos < d->first) d->first = pos;
            if (pos > d->last) d->last = pos;
        }
    }
    qsort(diags, (size_t)n_diags, sizeof(diagonal), by_rank);
    /* Signatures seen, in a second open-addressing set over the same slots. */
    for (uint64_t s = 0; s < size; s++) slots[s] = -1;
    int64_t kept = 0, seen = 0;
    for (int64_t k = 0; k < n_diags && seen < max_diagonals; k++) {
        const diagonal *d = &diags[k];
        uint64_t s = mix2((uint64_t)d->delta ^ (uint64_t)d->hits << 40, (uint64_t)d->first ^ (uint64_t)d->last << 32) &
                     (size - 1);
        while (slots[s] >= 0 && !same_signature(&diags[slots[s]], d)) s = (s + 1) & (size - 1);
        if (slots[s] >= 0) continue;
        slots[s] = k;
        seen++;
        out[4 * kept] = d->serial;
        out[4 * kept + 1] = d->delta;
        out[4 * kept + 2] = d->first;
        out[4 * kept + 3] = d->last;
        kept++;
    }
    free(slots);
    free(diags);
    return kept;
}

/* The first i' in [i, hi) where t[i'] differs from d[i' - delta], or hi: compared 16 bytes at a time (about twice as
 * quick as token by token over the thousands of tokens of a long match). */
ALWAYS_INLINE int64_t same_until(const void *t, const void *d, int width, int64_t i, int64_t delta, int64_t hi) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    const unsigned char *a = (const unsigned char *)t, *b = (const unsigned char *)d;
    int64_t step = 16 / width; /* tokens per 16 bytes */
    for (; hi - i >= step; i += step) {
        uint64_t x0, x1, y0, y1;
        memcpy(&x0, a + i * width, 8);
        memcpy(&x1, a + i * width + 8, 8);
        memcpy(&y0, b + (i - delta) * width, 8);
        memcpy(&y1, b + (i - delta) * width + 8, 8);
        if ((x0 ^ y0) | (x1 ^ y1)) { /* the lowest differing byte is the first */
            if (x0 != y0) return i + __builtin_ctzll(x0 ^ y0) / 8 / width;
            return i + (8 + __builtin_ctzll(x1 ^ y1) / 8) / width;
        }
    }
#endif
    while (i < hi && token(t, i, width) == token(d, i - delta, width)) i++;
    return i;
}

ALWAYS_INLINE int64_t runs_of(const void *t, int width, int64_t n, const int64_t *rows, int64_t n_rows,
                              int64_t block_size, int64_t anchor, int64_t min_span, int64_t *out) {
    int64_t n_out = 0;
    int64_t reach = block_size + anchor;
    for (int64_t r = 0; r < n_rows; r++) {
        const void *d = (const void *)(uintptr_t)rows[5 * r];
        int64_t d_len = rows[5 * r + 1], delta = rows[5 * r + 2], first = rows[5 * r + 3], last = rows[5 * r + 4];
        int64_t diag_lo = delta > 0 ? delta : 0;
        int64_t diag_hi = d_len + delta < n ? d_len + delta : n;
        int64_t lo = first - reach > diag_lo ? first - reach : diag_lo;
        int64_t hi = last + anchor + reach < diag_hi ? last + anchor + reach : diag_hi;
        while (lo > diag_lo && token(t, lo, width) == token(d, lo - delta, width)) {
            int64_t next = lo - 2 * (hi - lo);
            lo = next > diag_lo ? next : diag_lo;
        }
        while (hi < diag_hi && token(t, hi - 1, width) == token(d, hi - 1 - delta, width)) {
            int64_t next = hi + 2 * (hi - lo);
            hi = next < diag_hi ? next : diag_hi;
        }
        if (hi - lo < min_span) continue;
        int64_t i = lo;
        while (i < hi) {
            if (token(t, i, width) != token(d, i - delta, width)) {
                i++;
                continue;
            }
            int64_t start = i;
            i = same_until(t, d, width, i, delta, hi);
            if (i - start < min_span) continue;
            int64_t begin = (start + block_size - 1) / block_size * block_size;
            int64_t end = i / block_size * block_size;
            if (end - begin >= min_span) {
                out[3 * n_out] = r;
                out[3 * n_out + 1] = begin;
                out[3 * n_out + 2] = end;
                n_out++;
            }
        }
    }
    return n_out;
}

typedef struct {
    int64_t serial, start, end, delta, slot;
} candidate;

/* Whether a goes before b in the greedy cover: longest first, then a donor already used, then delta 0, then the
 * smallest |delta|, the earliest start, the newest donor (SpanAligner._choose's key). */
static int preferred(const candidate *a, const candidate *b, const int64_t *used, int64_t n_used) {
    int64_t la = a->end - a->start, lb = b->end - b->start;
    if (la != lb) return la > lb;
    int ua = 0, ub = 0;
    for (int64_t u = 0; u < n_used; u++) {
        ua |= used[u] == a->serial;
        ub |= used[u] == b->serial;
    }
    if (ua != ub) return ua;
    if ((a->delta != 0) != (b->delta != 0)) return a->delta == 0;
    int64_t da = a->delta < 0 ? -a->delta : a->delta, db = b->delta < 0 ? -b->delta : b->delta;
    if (da != db) return da < db;
    if (a->start != b->start) return a->start < b->start;
    return a->serial > b->serial;
}

/* Stable insertion sort by target start (a handful of spans). */
static void sort_by_start(candidate *c, int64_t n) {
    for (int64_t i = 1; i < n; i++) {
        candidate x = c[i];
        int64_t j = i;
        while (j > 0 && c[j - 1].start > x.start) {
            c[j] = c[j - 1];
            j--;
        }
        c[j] = x;
    }
}

/* SpanAligner._choose: up to max_spans candidates that do not overlap on the target, as rows (donor slot, donor start,
 * target start, length) in target order to `out`; `found`: n_found rows in the numpy path's list order (ties go to the
 * first). Returns how many, or -1 when out of memory. */
static int64_t choose(const candidate *found, int64_t n_found, int64_t max_spans, int64_t min_span, int64_t *out) {
    int64_t cap = max_spans < n_found ? max_spans : n_found;
    candidate *chosen = malloc((size_t)(cap > 0 ? cap : 1) * sizeof(candidate));
    int64_t *used = NULL;
    candidate *remaining = NULL;
    int64_t n_chosen = 0, result = -1;
    if (!chosen) return -1;
    if (n_found <= max_spans) {
        for (int64_t k = 0; k < n_found; k++) chosen[k] = found[k];
        sort_by_start(chosen, n_found);
        int disjoint = 1;
        for (int64_t k = 1; k < n_found; k++) disjoint &= chosen[k - 1].end <= chosen[k].start;
        if (disjoint) { /* nothing overlaps (the usual case): the greedy cover would take every one, unclipped */
            n_chosen = n_found;
            goto write;
        }
    }
    used = malloc((size_t)cap * sizeof(int64_t));
    remaining = malloc((size_t)n_found * sizeof(candidate));
    if (!used || !remaining) goto done;
    for (int64_t k = 0; k < n_found; k++) remaining[k] = found[k];
    int64_t n_remaining = n_found;
    while (n_remaining && n_chosen < max_spans) {
        int64_t b = 0;
        for (int64_t k = 1; k < n_remaining; k++)
            if (preferred(&remaining[k], &remaining[b], used, n_chosen)) b = k; /* min(): the first of equals */
        candidate best = remaining[b];
        chosen[n_chosen] = best;
        used[n_chosen++] = best.serial;
        candidate *next = malloc((size_t)(2 * n_remaining) * sizeof(candidate));
        if (!next) goto done;
        int64_t n_next = 0;
        for (int64_t k = 0; k < n_remaining; k++) {
            candidate c = remaining[k];
            if (k == b) continue;
            if (c.end <= best.start || c.start >= best.end) {
                next[n_next++] = c;
                continue;
            }
            if (best.start - c.start >= min_span) next[n_next++] = (candidate){c.serial, c.start, best.start, c.delta, c.slot};
            if (c.end - best.end >= min_span) next[n_next++] = (candidate){c.serial, best.end, c.end, c.delta, c.slot};
        }
        free(remaining);
        remaining = next;
        n_remaining = n_next;
    }
    sort_by_start(chosen, n_chosen);
write:
    for (int64_t k = 0; k < n_chosen; k++) {
        out[4 * k] = chosen[k].slot;
        out[4 * k + 1] = chosen[k].start - chosen[k].delta;
        out[4 * k + 2] = chosen[k].start;
        out[4 * k + 3] = chosen[k].end - chosen[k].start;
    }
    result = n_chosen;
done:
    free(chosen);
    free(used);
    free(remaining);
    return result;
}

/* The int64 words sa_align's `work` must hold for a target of n tokens (n >= anchor). */
EXPORT int64_t sa_work_size(int64_t n, int64_t anchor, int64_t min_span, int64_t max_diagonals, int64_t max_postings,
                            int64_t max_spans) {
    int64_t windows = n - anchor + 1;
    /* A window holds at most (size + 1) / (min_span + 1) runs of min_span tokens. */
    return 4 * max_spans + 2 * windows + 3 * windows * max_postings + 10 * max_diagonals +
           3 * max_diagonals * ((n + 1) / (min_span + 1));
}

ALWAYS_INLINE int64_t align_of(const sa_table *tb, const sa_donors *dn, const void *t, int width, int64_t n,
                               int64_t anchor, int64_t block_size, int64_t min_span, int64_t max_diagonals,
                               int64_t max_postings, int64_t max_spans, const int64_t *allowed, int64_t n_allowed,
                               int64_t *work) {
    int64_t windows = n - anchor + 1;
    int64_t *out = work;
    uint64_t *passed = (uint64_t *)(out + 4 * max_spans);
    int64_t *hits = (int64_t *)passed + 2 * windows;
    int64_t *diags = hits + 3 * windows * max_postings;
    int64_t *rows = diags + 4 * max_diagonals;
    int64_t *slots = rows + 5 * max_diagonals;
    int64_t *runs = slots + max_diagonals;
    int64_t n_hits = hits_of(tb, t, width, n, anchor, max_postings, allowed, n_allowed, passed, hits);
    int64_t n_diags = diagonals_of(hits, n_hits, max_diagonals, diags);
    if (n_diags <= 0) return n_diags;
    for (int64_t r = 0; r < n_diags; r++) {
        int64_t slot = find_id(&dn->serials, (uint64_t)diags[4 * r]);
        if (slot < 0) return -2;
        slots[r] = slot;
        rows[5 * r] = dn->address[slot];
        rows[5 * r + 1] = dn->length[slot];
        rows[5 * r + 2] = diags[4 * r + 1];
        rows[5 * r + 3] = diags[4 * r + 2];
        rows[5 * r + 4] = diags[4 * r + 3];
    }
    int64_t n_runs = runs_of(t, width, n, rows, n_diags, block_size, anchor, min_span, runs);
    if (n_runs == 0) return 0;
    candidate *found = malloc((size_t)n_runs * sizeof(candidate));
    if (!found) return -1;
    for (int64_t k = 0; k < n_runs; k++) {
        int64_t r = runs[3 * k];
        found[k] = (candidate){diags[4 * r], runs[3 * k + 1], runs[3 * k + 2], diags[4 * r + 1], slots[r]};
    }
    int64_t n_out = choose(found, n_runs, max_spans, min_span, out);
    free(found);
    return n_out;
}

/* sa_align's arguments, one int64 word each (addresses as integers), in this order (semblend_dynamo/_native/__init__.py
 * names them the same). */
enum {
    ARG_TABLE,         /* const sa_table * */
    ARG_DONORS,        /* const sa_donors * */
    ARG_TARGET,        /* the target's tokens */
    ARG_WIDTH,         /* bytes a token: 4 (uint32) or 8 (int64), the donors' width too */
    ARG_N,             /* tokens in the target, >= anchor */
    ARG_ANCHOR,        /* chunk length */
    ARG_BLOCK_SIZE,    /* spans are trimmed to target blocks of this size */
    ARG_MIN_SPAN,      /* shortest span kept */
    ARG_MAX_DIAGONALS, /* diagonals compared, most hits first */
    ARG_MAX_POSTINGS,  /* donors read per shared chunk, newest first */
    ARG_MAX_SPANS,     /* spans chosen */
    ARG_ALLOWED,       /* const int64_t *: sorted serials of the donors that count */
    ARG_N_ALLOWED,     /* how many; < 0: every donor counts */
    ARG_WORK           /* int64_t *: sa_work_size() words */
};

/* SpanAligner.align for a target t[0:n] (n >= anchor) against one namespace's table: every window screened and looked
 * up, hits grouped into ranked, de-duplicated diagonals, each compared in a window galloping outward, the exact runs
 * trimmed to target blocks and chosen greedily. Only donors whose serial is in the sorted `allowed` count (all when
 * n_allowed < 0). `work` holds sa_work_size() words; the chosen spans are its first rows (the donor's slot in `dn`,
 * donor start, target start, length), in target order; donor start >= 0 and length >= min_span > 0. Returns how many,
 * -1 when out of memory, -2 when a diagonal's donor is not in `dn` (the tables disagree). The arguments come as one
 * block of words (`args`, the enum's order), which the caller fills in place between calls: one pointer to convert
 * per call instead of fourteen arguments. */
EXPORT int64_t sa_align(const int64_t *args) {
    const sa_table *tb = (const sa_table *)(uintptr_t)args[ARG_TABLE];
    const sa_donors *dn = (const sa_donors *)(uintptr_t)args[ARG_DONORS];
    const void *t = (const void *)(uintptr_t)args[ARG_TARGET];
    const int64_t *allowed = (const int64_t *)(uintptr_t)args[ARG_ALLOWED];
    int64_t *work = (int64_t *)(uintptr_t)args[ARG_WORK];
    int64_t n = args[ARG_N], anchor = args[ARG_ANCHOR], block_size = args[ARG_BLOCK_SIZE], min_span = args[ARG_MIN_SPAN];
    int64_t max_diagonals = args[ARG_MAX_DIAGONALS], max_postings = args[ARG_MAX_POSTINGS];
    int64_t max_spans = args[ARG_MAX_SPANS], n_allowed = args[ARG_N_ALLOWED];
    return args[ARG_WIDTH] == 4 ? align_of(tb, dn, t, 4, n, anchor, block_size, min_span, max_diagonals, max_postings,
                                           max_spans, allowed, n_allowed, work)
                                : align_of(tb, dn, t, 8, n, anchor, block_size, min_span, max_diagonals, max_postings,
                                           max_spans, allowed, n_allowed, work);
}

/* ---- the router's U64Map (semblend_dynamo/router/u64map.py): a bulk lookup, a bulk write and a merge of its sorted
 * levels ----
 * In this library for its build and loading only (plain C, any CPython); u64map.py's numpy code is the reference
 * these match exactly, and calls them with the GIL held (ctypes.PyDLL): the map's readers on other threads rely on it.
 * Booleans are numpy's (one byte, 0 or 1); positions are int64 (numpy's intp on the 64-bit hosts this builds for). */

/* Probes at a time in a search: their loads are independent, so the core waits on several cache misses at once. */
#define UM_LANES 16

/* The lower bound of each of probe[0:n] in the sorted keys[0:m] (m > 0), clamped to m - 1 (u64map._hits' `at`). */
static void um_lower_bounds(const uint64_t *keys, int64_t m, const uint64_t *probe, int64_t n, int64_t *at) {
    for (int64_t i0 = 0; i0 < n; i0 += UM_LANES) {
        int64_t lanes = n - i0 < UM_LANES ? n - i0 : UM_LANES;
        int64_t lo[UM_LANES];
        for (int64_t j = 0; j < lanes; j++) lo[j] = 0;
        for (int64_t len = m; len > 1;) {  /* the answer is in [lo, lo + len], lo + len <= m */
            int64_t half = len >> 1;
            for (int64_t j = 0; j < lanes; j++) lo[j] += keys[lo[j] + half - 1] < probe[i0 + j] ? half : 0;
            len -= half;
        }
        for (int64_t j = 0; j < lanes; j++) {
            int64_t a = lo[j] + (keys[lo[j]] < probe[i0 + j]);
            at[i0 + j] = a < m - 1 ? a : m - 1;
        }
    }
}

/* u64map.U64Map._base_hits' directory search, by interpolation: a probe's run holds the keys that share its top
 * 64 - shift bits, in [dir[run], dir[run + 1]) (the last run ends at m), and uniform keys (the directory's condition)
 * spread evenly over it, so the probe's place in the run's key range points within a few keys of its lower bound,
 * which a short walk finds (the lower bound, clamped to m - 1). The guesses of a lane group are fetched first: their
 * loads are independent, the walks that follow mostly hit what the fetches brought. */
static void um_dir_bounds(const uint64_t *keys, int64_t m, const void *dir, int wide, uint64_t shift,
                          const uint64_t *probe, int64_t n, int64_t *at) {
    int64_t last_run = ((int64_t)1 << (64 - shift)) - 1;
    for (int64_t i0 = 0; i0 < n; i0 += UM_LANES) {
        int64_t lanes = n - i0 < UM_LANES ? n - i0 : UM_LANES;
        int64_t start[UM_LANES], end[UM_LANES], guess[UM_LANES];
        for (int64_t j = 0; j < lanes; j++) {
            uint64_t p = probe[i0 + j], run = p >> shift;
            start[j] = wide ? ((const int64_t *)dir)[run] : (int64_t)((const int32_t *)dir)[run];
            end[j] = (int64_t)run == last_run ? m
                     : wide                  ? ((const int64_t *)dir)[run + 1]
                                             : (int64_t)((const int32_t *)dir)[run + 1];
            uint64_t within = p - (run << shift);
            guess[j] = start[j] + (int64_t)(((unsigned __int128)within * (uint64_t)(end[j] - start[j])) >> shift);
            __builtin_prefetch(&keys[guess[j] < m ? guess[j] : m - 1]);
        }
        for (int64_t j = 0; j < lanes; j++) {
            uint64_t p = probe[i0 + j];
            int64_t a = guess[j];
            while (a > start[j] && keys[a - 1] >= p) a--;
            while (a < end[j] && keys[a] < p) a++;
            at[i0 + j] = a < m - 1 ? a : m - 1;
        }
    }
}

enum {
    UM_PROBE, UM_N,                                          /* const uint64_t *, its length */
    UM_BASE_KEYS, UM_BASE_VALUES, UM_N_BASE,                 /* the base level */
    UM_DIR, UM_DIR_WIDE, UM_DIR_SHIFT, UM_DIR_STEPS,         /* its directory (steps 0: binary search) */
    UM_FROZEN_KEYS, UM_FROZEN_VALUES, UM_FROZEN_LIVE, UM_N_FROZEN,
    UM_OVER_KEYS, UM_OVER_VALUES, UM_OVER_LIVE, UM_N_OVER,
    UM_FOUND, UM_VALUES, UM_OVER_HIT, UM_OVER_AT, UM_BASE_HIT, UM_BASE_AT, /* out: n each */
    UM_ARGS
};

/* U64Map._locate: for each probe whether a sorted level holds it live and its value (0 where not), whether the
 * overlay holds it (live or deleted) and where, whether the base holds it and where (0 where a level is empty). */
EXPORT void um_locate(const int64_t *args) {
#define UM_PTR(type, i) ((type)(uintptr_t)args[i])
    const uint64_t *probe = UM_PTR(const uint64_t *, UM_PROBE);
    int64_t n = args[UM_N], n_base = args[UM_N_BASE], n_frozen = args[UM_N_FROZEN], n_over = args[UM_N_OVER];
    uint8_t *found = UM_PTR(uint8_t *, UM_FOUND), *over_hit = UM_PTR(uint8_t *, UM_OVER_HIT);
    uint8_t *base_hit = UM_PTR(uint8_t *, UM_BASE_HIT);
    uint64_t *values = UM_PTR(uint64_t *, UM_VALUES);
    int64_t *over_at = UM_PTR(int64_t *, UM_OVER_AT), *base_at = UM_PTR(int64_t *, UM_BASE_AT);
    if (n_base) {
        const uint64_t *keys = UM_PTR(const uint64_t *, UM_BASE_KEYS), *held = UM_PTR(const uint64_t *, UM_BASE_VALUES);
        if (args[UM_DIR_STEPS])
            um_dir_bounds(keys, n_base, UM_PTR(const void *, UM_DIR), (int)args[UM_DIR_WIDE],
                          (uint64_t)args[UM_DIR_SHIFT], probe, n, base_at);
        else
            um_lower_bounds(keys, n_base, probe, n, base_at);
        for (int64_t i = 0; i < n; i++) {
            base_hit[i] = found[i] = keys[base_at[i]] == probe[i];
            values[i] = held[base_at[i]];
        }
    } else {
        memset(found, 0, (size_t)n);
        memset(base_hit, 0, (size_t)n);
        memset(base_at, 0, (size_t)n * sizeof(int64_t));
        memset(values, 0, (size_t)n * sizeof(uint64_t));
    }
    if (n_frozen) {  /* its positions go in over_at for now: the overlay's are written below */
        const uint64_t *keys = UM_PTR(const uint64_t *, UM_FROZEN_KEYS);
        const uint64_t *held = UM_PTR(const uint64_t *, UM_FROZEN_VALUES);
        const uint8_t *live = UM_PTR(const uint8_t *, UM_FROZEN_LIVE);
        um_lower_bounds(keys, n_frozen, probe, n, over_at);
        for (int64_t i = 0; i < n; i++) {
            int64_t a = over_at[i];
            if (keys[a] == probe[i]) {
                found[i] = live[a];
                values[i] = held[a];
            }
        }
    }
    if (n_over) {
        const uint64_t *keys = UM_PTR(const uint64_t *, UM_OVER_KEYS), *held = UM_PTR(const uint64_t *, UM_OVER_VALUES);
        const uint8_t *live = UM_PTR(const uint8_t *, UM_OVER_LIVE);
        um_lower_bounds(keys, n_over, probe, n, over_at);
        for (int64_t i = 0; i < n; i++) {
            int64_t a = over_at[i];
            over_hit[i] = keys[a] == probe[i];
            if (over_hit[i]) {
                found[i] = live[a];
                values[i] = held[a];
            }
        }
    } else {
        memset(over_hit, 0, (size_t)n);
        memset(over_at, 0, (size_t)n * sizeof(int64_t));
    }
    for (int64_t i = 0; i < n; i++)
        if (!found[i]) values[i] = 0;
}

enum {
    UA_VALUES, UA_N,                                  /* const uint64_t *: the values of the located keys */
    UA_FOUND, UA_OVER_HIT, UA_OVER_AT, UA_BASE_HIT, UA_BASE_AT, /* um_locate's of the same keys */
    UA_OVER_VALUES, UA_OVER_LIVE, UA_BASE_VALUES,     /* written in place */
    UA_FROZEN,                                        /* a base rewrite in progress: the base is not written */
    UA_REST,                                          /* out, uint8_t *: the keys left for the overlay */
    UA_ARGS
};

/* U64Map.assign's writes in place: a key the overlay holds gets its value there (live again), one only the base holds
 * (no rewrite in progress) there; `rest` marks the others. Returns the map's new keys among the written ones (the
 * overlay's deleted ones; the base's none) plus, for the rest, those no level holds live (every one of them when no
 * rewrite is in progress: none is found then), and the rest's count << 32 added. */
EXPORT int64_t um_assign(const int64_t *args) {
    const uint64_t *values = UM_PTR(const uint64_t *, UA_VALUES);
    const uint8_t *found = UM_PTR(const uint8_t *, UA_FOUND), *over_hit = UM_PTR(const uint8_t *, UA_OVER_HIT);
    const uint8_t *base_hit = UM_PTR(const uint8_t *, UA_BASE_HIT);
    const int64_t *over_at = UM_PTR(const int64_t *, UA_OVER_AT), *base_at = UM_PTR(const int64_t *, UA_BASE_AT);
    uint64_t *over_values = UM_PTR(uint64_t *, UA_OVER_VALUES), *base_values = UM_PTR(uint64_t *, UA_BASE_VALUES);
    uint8_t *over_live = UM_PTR(uint8_t *, UA_OVER_LIVE), *rest = UM_PTR(uint8_t *, UA_REST);
    int64_t n = args[UA_N], frozen = args[UA_FROZEN], added = 0, left = 0;
    for (int64_t i = 0; i < n; i++) {
        rest[i] = 0;
        if (over_hit[i]) {
            int64_t a = over_at[i];
            added += !over_live[a];
            over_values[a] = values[i];
            over_live[a] = 1;
        } else if (!frozen && base_hit[i]) {
            base_values[base_at[i]] = values[i];
        } else {
            rest[i] = 1;
            left++;
            added += !found[i];
        }
    }
    return left << 32 | added;
}

enum {
    UG_OLD_KEYS, UG_OLD_VALUES, UG_OLD_LIVE, UG_N_OLD,   /* live 0 (no column): a base slice */
    UG_NEW_KEYS, UG_NEW_VALUES, UG_NEW_LIVE, UG_N_NEW,
    UG_OUT_KEYS, UG_OUT_VALUES, UG_OUT_LIVE,             /* out: as many entries as returned; live as the old's */
    UG_ARGS
};

/* The first position in keys[lo:hi] whose key is not below `key` (hi if none): galloping from lo, then a binary search,
 * so a short distance (a dense merge) costs a comparison or two. */
static int64_t um_first_at_least(const uint64_t *keys, int64_t lo, int64_t hi, uint64_t key) {
    int64_t top = lo;  /* keys before lo are below key; the answer is in [lo, top] */
    for (int64_t step = 1; top < hi && keys[top] < key; step <<= 1) {
        lo = top + 1;
        top = lo + step;
    }
    if (top > hi) top = hi;
    while (lo < top) {
        int64_t mid = lo + ((top - lo) >> 1);
        if (keys[mid] < key) lo = mid + 1;
        else top = mid;
    }
    return lo;
}

/* u64map._merged: the sorted, distinct-key columns `new` merged into the sorted, distinct-key `old`, in key order; a
 * new entry replaces the old entry of its key. With a live column (the overlay) the dead new entries are written
 * too; without one (a base slice with the frozen entries of its range) a dead new entry only removes its key. The old
 * entries between two new keys are copied as one run (a merge adds hundreds of keys to tens of thousands). The output
 * must hold the old entries and the new ones written. Returns how many entries it wrote. */
EXPORT int64_t um_merge(const int64_t *args) {
    const uint64_t *old_keys = UM_PTR(const uint64_t *, UG_OLD_KEYS), *old_values = UM_PTR(const uint64_t *, UG_OLD_VALUES);
    const uint64_t *new_keys = UM_PTR(const uint64_t *, UG_NEW_KEYS), *new_values = UM_PTR(const uint64_t *, UG_NEW_VALUES);
    const uint8_t *old_live = UM_PTR(const uint8_t *, UG_OLD_LIVE), *new_live = UM_PTR(const uint8_t *, UG_NEW_LIVE);
    uint64_t *out_keys = UM_PTR(uint64_t *, UG_OUT_KEYS), *out_values = UM_PTR(uint64_t *, UG_OUT_VALUES);
    uint8_t *out_live = UM_PTR(uint8_t *, UG_OUT_LIVE);
    int64_t n_old = args[UG_N_OLD], n_new = args[UG_N_NEW], i = 0, w = 0;
    for (int64_t j = 0; j <= n_new; j++) {
        int64_t end = j < n_new ? um_first_at_least(old_keys, i, n_old, new_keys[j]) : n_old;
        if (end > i) {  /* the old run below this new key */
            memcpy(out_keys + w, old_keys + i, (size_t)(end - i) * sizeof(uint64_t));
            memcpy(out_values + w, old_values + i, (size_t)(end - i) * sizeof(uint64_t));
            if (old_live) memcpy(out_live + w, old_live + i, (size_t)(end - i));
            w += end - i;
        }
        if (j == n_new) break;
        i = end + (end < n_old && old_keys[end] == new_keys[j]);  /* replaced */
        if (old_live || new_live[j]) {
            out_keys[w] = new_keys[j];
            out_values[w] = new_values[j];
            if (old_live) out_live[w] = new_live[j];
            w++;
        }
    }
    return w;
#undef UM_PTR
}
