/* The request path of semblend_dynamo.span_aligner.SpanAligner.align, in plain C (no Python API: one shared library
 * serves every CPython version). Loaded with ctypes by semblend_dynamo/_native/__init__.py, which documents the
 * buffers; the numpy implementation in span_aligner.py is the reference these functions must match exactly.
 *
 * All integers are int64 unless named otherwise; arrays are C-contiguous and owned by Python. Token arrays (a target
 * and the donors compared with it) are of one width per call, `width` bytes a token: 8 (int64, the router's) or 4
 * (uint32, the connector's); each exported function that reads tokens has one body, compiled once per width. */
#include <stdint.h>
#include <stdlib.h>

#define EXPORT __attribute__((visibility("default")))

#ifndef SA_SOURCE_DIGEST
#define SA_SOURCE_DIGEST "unknown"
#endif

static const uint64_t BASE = 0x9E3779B97F4A7C15ULL | 1;
static const uint64_t MIX = 0xD6E8FEB86659FD93ULL;
static const uint64_t PROBE_MIX = 0xBF58476D1CE4E5B9ULL;
static const int32_t EMPTY = -1;

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* Token i of an array of `width`-byte tokens; `width` is a constant in every caller's specialization. */
ALWAYS_INLINE uint64_t token(const void *tokens, int64_t i, int width) {
    return width == 4 ? ((const uint32_t *)tokens)[i] : (uint64_t)((const int64_t *)tokens)[i];
}

/* One namespace's chunk table, as _ChunkTable and its _IdTable hold it. */
typedef struct {
    const uint8_t *bits; /* filter bitset, little bit order */
    uint64_t filter_shift;
    const uint64_t *keys; /* id table: buckets of 8 hashes */
    const int32_t *ids;   /* id table: buckets of 8 key ids (-1 empty, -2 removed) */
    uint64_t id_shift;
    uint64_t id_mask;
    const int64_t *single_serial; /* per key id: the one donor's serial, -1 when several donors share the chunk */
    const int64_t *single_offset;
} sa_table;

EXPORT const char *sa_source_digest(void) { return SA_SOURCE_DIGEST; }

static int64_t find_id(const sa_table *tb, uint64_t h, uint64_t bucket) {
    for (;;) {
        const uint64_t *keys = tb->keys + 8 * bucket;
        const int32_t *ids = tb->ids + 8 * bucket;
        int open = 0;
        for (int e = 0; e < 8; e++) {
            if (ids[e] >= 0 && keys[e] == h) return ids[e];
            open |= ids[e] == EMPTY;
        }
        if (open) return -1;
        bucket = (bucket + 1) & tb->id_mask;
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

ALWAYS_INLINE void hits_of(const sa_table *tb, const void *t, int width, int64_t n, int64_t anchor,
                           const int64_t *allowed, int64_t n_allowed, int64_t *hits, int64_t *shared, int64_t *counts) {
    int64_t windows = n - anchor + 1;
    /* The windows that pass the filter, as rows (position, hash), in `shared`'s room: row k is read before shared row
     * n_shared <= k is written, so the shared hits are compacted in place (no allocation per call). */
    uint64_t *passed = (uint64_t *)shared;
    uint64_t top = 1; /* BASE ** (anchor - 1) */
    uint64_t h = 0;
    uint64_t power = 1;
    for (int64_t j = 0; j < anchor; j++) {
        h += token(t, j, width) * power;
        top = power;
        power *= BASE;
    }
    uint64_t base_inv = BASE; /* Newton's iteration for the inverse modulo 2**64 */
    for (int k = 0; k < 6; k++) base_inv *= 2 - BASE * base_inv;
    int64_t n_passed = 0;
    for (int64_t i = 0;; i++) {
        uint64_t slot = (h * MIX) >> tb->filter_shift;
        if ((tb->bits[slot >> 3] >> (slot & 7)) & 1) {
            passed[2 * n_passed] = (uint64_t)i;
            passed[2 * n_passed + 1] = h;
            n_passed++;
        }
        if (i + 1 == windows) break;
        h = (h - token(t, i, width)) * base_inv + token(t, i + anchor, width) * top;
    }
    /* The buckets of all windows that passed are fetched before the first is read, so their cache misses overlap. */
    for (int64_t k = 0; k < n_passed; k++) {
        uint64_t bucket = (passed[2 * k + 1] * PROBE_MIX) >> tb->id_shift;
        __builtin_prefetch(tb->keys + 8 * bucket);
        __builtin_prefetch(tb->ids + 8 * bucket);
    }
    int64_t n_hits = 0, n_shared = 0;
    for (int64_t k = 0; k < n_passed; k++) {
        int64_t pos = (int64_t)passed[2 * k];
        uint64_t hash = passed[2 * k + 1];
        int64_t id = find_id(tb, hash, (hash * PROBE_MIX) >> tb->id_shift);
        if (id < 0) continue;
        int64_t serial = tb->single_serial[id];
        if (serial < 0) {
            shared[2 * n_shared] = pos;
            shared[2 * n_shared + 1] = (int64_t)hash;
            n_shared++;
        } else if (allowed_serial(allowed, n_allowed, serial)) {
            hits[3 * n_hits] = serial;
            hits[3 * n_hits + 1] = pos - tb->single_offset[id];
            hits[3 * n_hits + 2] = pos;
            n_hits++;
        }
    }
    counts[0] = n_hits;
    counts[1] = n_shared;
}

/* Every window of `anchor` tokens of t[0:n] (n >= anchor) screened by the filter and looked up in the id table.
 * Writes the chunk hits of one donor as rows (serial, delta, position) to `hits`, only serials in the sorted
 * `allowed` (all when n_allowed < 0), and the hits on chunks several donors share as rows (position, hash) to
 * `shared`, both in target order; each needs room for n - anchor + 1 rows. counts[0], counts[1]: rows written. */
EXPORT void sa_hits(const sa_table *tb, const void *t, int64_t width, int64_t n, int64_t anchor,
                    const int64_t *allowed, int64_t n_allowed, int64_t *hits, int64_t *shared, int64_t *counts) {
    if (width == 4)
        hits_of(tb, t, 4, n, anchor, allowed, n_allowed, hits, shared, counts);
    else
        hits_of(tb, t, 8, n, anchor, allowed, n_allowed, hits, shared, counts);
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

/* Groups the hit rows (serial, delta, position) of `hits` and then `extra` by diagonal (serial, delta): hit count,
 * first and last position. Ranks the diagonals, drops those whose (delta, first, last, hits) an earlier one has, and
 * writes the first `max_diagonals` of the rest as rows (serial, delta, first, last) to `out`. Returns how many, or -1
 * when out of memory. */
EXPORT int64_t sa_diagonals(const int64_t *hits, int64_t n_hits, const int64_t *extra, int64_t n_extra,
                            int64_t max_diagonals, int64_t *out) {
    int64_t total = n_hits + n_extra;
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
        const int64_t *hit = k < n_hits ? hits + 3 * k : extra + 3 * (k - n_hits);
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
            while (i < hi && token(t, i, width) == token(d, i - delta, width)) i++;
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

/* For each diagonal row (donor token address, donor length, delta, first hit, last hit): the comparison window one
 * chunk beyond the hits, galloping outward while its edge token matches (skipped when shorter than min_span), then
 * every exact run in it of at least min_span tokens, trimmed inward to target blocks; runs still min_span long are
 * written as rows (row index, target start, target end) to `out`, in row then target order. Returns how many. */
EXPORT int64_t sa_runs(const void *t, int64_t width, int64_t n, const int64_t *rows, int64_t n_rows,
                       int64_t block_size, int64_t anchor, int64_t min_span, int64_t *out) {
    return width == 4 ? runs_of(t, 4, n, rows, n_rows, block_size, anchor, min_span, out)
                      : runs_of(t, 8, n, rows, n_rows, block_size, anchor, min_span, out);
}
