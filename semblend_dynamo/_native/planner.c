/* The planner's accepting path in C: Planner.plan's decision when every gate passes, and None otherwise.
 *
 * A CPython extension module (built per Python version by semblend_dynamo.native_planner). accept() follows
 * semblend_dynamo/planner.py's Planner.plan step by step and returns the PlanDecision it would return when it accepts,
 * and its exact_only_mode decline (every gate before it passed, no leading exact-equivalent span: the router's usual
 * decline of shifted spans, which would otherwise run the Python gates a second time);
 * for any other decline, discovery_only, or input it does not take as it is (a value that is not an exact int, float or str
 * where the planner gets one, more than MAX_SPANS spans, any Python error on the way) it returns None and the caller
 * runs the Python planner, which then makes the decision (and raises what it raises). The float values are computed
 * with the same operations in the same order as planner.py (libm's exp and log2, as math's; the sum of the weighted
 * deviations by Python's own sum()), so the decision's floats are the Python planner's to the bit
 * (tests/core/test_native_planner.py compares them on random inputs). Runs with the GIL held. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <structmember.h> /* PyMemberDef's types before 3.12 (T_OBJECT_EX) */

#ifndef MODULE_SOURCE_DIGEST
#define MODULE_SOURCE_DIGEST "unknown"
#endif

#define MAX_SPANS 64

/* Set once by setup(): the classes the decision is made of, and planner.py's deviation constants. */
static PyObject *span_class, *plan_class, *decision_class, *sum_builtin;
/* DeclineReason.EXACT_ONLY_MODE and planner.EXACT_ONLY_DETAIL. */
static PyObject *exact_only_reason, *exact_only_detail;
/* Attribute names, interned once. */
enum {
    N_BLOCK_SIZE, N_ENABLED, N_MIN_SPAN, N_EXACT_ONLY, N_STRICT, N_MAX_SPANS, N_MIN_RATIO, N_MAX_DEVIATION, N_DISCOVERY,
    N_MIN_SIMILARITY, N_ISOLATION, N_DONOR_ID, N_DONOR_START, N_TARGET_START, N_LENGTH, N_NAMES
};
static const char *const name_text[N_NAMES] = {
    "block_size", "enabled", "min_span_tokens", "exact_materialization_only", "strict_prefix_boundary", "max_spans",
    "min_reuse_ratio", "max_deviation", "discovery_only", "min_similarity", "isolation", "donor_id", "donor_start",
    "target_start", "length",
};
static PyObject *names[N_NAMES];
static double decay_tokens, context_floor, rope_numeric, displacement_weight, displacement_tokens;

typedef struct {
    PyObject *obj;      /* the Span (borrowed from the caller's sequence) */
    PyObject *donor_id; /* new reference */
    long long donor_start, target_start, length;
} span_t;

typedef struct {
    PyObject *span; /* new reference: the span itself or its clipped copy */
    long long donor_start, target_start, length;
    int exact;
} chosen_t;

/* An exact int's value in *out (0), or 1 when it is not an exact int or does not fit (nothing raised). */
static int exact_ll(PyObject *v, long long *out) {
    if (v == NULL || !PyLong_CheckExact(v)) return 1;
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (x == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 1;
    }
    *out = x;
    return 0;
}

/* cfg.<name> as an exact int / float / truth value (0), or 1 (nothing raised). */
static int cfg_ll(PyObject *cfg, int name, long long *out) {
    PyObject *v = PyObject_GetAttr(cfg, names[name]);
    int bad = exact_ll(v, out);
    Py_XDECREF(v);
    PyErr_Clear();
    return bad;
}

static int cfg_double(PyObject *cfg, int name, double *out) {
    PyObject *v = PyObject_GetAttr(cfg, names[name]);
    int bad = v == NULL || !PyFloat_CheckExact(v);
    if (!bad) *out = PyFloat_AS_DOUBLE(v);
    Py_XDECREF(v);
    PyErr_Clear();
    return bad;
}

static int cfg_truth(PyObject *cfg, int name, int *out) {
    PyObject *v = PyObject_GetAttr(cfg, names[name]);
    int bad = v == NULL || !PyBool_Check(v);
    if (!bad) *out = v == Py_True;
    Py_XDECREF(v);
    PyErr_Clear();
    return bad;
}

/* planner.span_deviation(length, delta, skipped=skipped), operation for operation (length > 0 here). */
static double span_deviation(long long length, long long delta, long long skipped) {
    double tau = decay_tokens;
    double boundary = tau / (double)length * exp((double)(-skipped) / tau) * (1.0 - exp((double)(-length) / tau));
    long long magnitude = delta < 0 ? -delta : delta;
    double rope = rope_numeric * log2((double)(1 + magnitude)) / 17.0;
    double moved = (double)magnitude / displacement_tokens;
    double displacement = displacement_weight * (moved < 2.0 ? moved : 2.0);
    double total = context_floor + (1.0 - context_floor) * boundary + displacement + rope;
    return total < 1.0 ? total : 1.0;
}

/* Span(donor_id, donor_start, target_start, length): the class's own __init__ (and its checks). */
static PyObject *make_span(PyObject *donor_id, long long donor_start, long long target_start, long long length) {
    PyObject *args[4] = {donor_id, PyLong_FromLongLong(donor_start), PyLong_FromLongLong(target_start),
                         PyLong_FromLongLong(length)};
    PyObject *span = args[1] && args[2] && args[3] ? PyObject_Vectorcall(span_class, args, 4, NULL) : NULL;
    Py_XDECREF(args[1]), Py_XDECREF(args[2]), Py_XDECREF(args[3]);
    return span;
}

/* MaterializationPlan(spans, prompt_tokens, reused_tokens, reuse_ratio, requires_rope_correction,
 * estimated_deviation, mode). */
static PyObject *make_plan(PyObject *spans, PyObject *prompt_tokens, long long reused, double ratio, int rotates,
                           double deviation, int shifted) {
    PyObject *args[7] = {spans, prompt_tokens, PyLong_FromLongLong(reused), PyFloat_FromDouble(ratio),
                         rotates ? Py_True : Py_False, PyFloat_FromDouble(deviation),
                         PyUnicode_InternFromString(shifted ? "shifted" : "exact")};
    PyObject *plan = args[2] && args[3] && args[5] && args[6] ? PyObject_Vectorcall(plan_class, args, 7, NULL) : NULL;
    Py_XDECREF(args[2]), Py_XDECREF(args[3]), Py_XDECREF(args[5]), Py_XDECREF(args[6]);
    return plan;
}

static PyObject *setup(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *span, *plan, *decision, *builtin_sum, *reason, *detail;
    double c[5];
    if (!PyArg_ParseTuple(args, "OOOO(ddddd)OU", &span, &plan, &decision, &builtin_sum, &c[0], &c[1], &c[2], &c[3], &c[4],
                          &reason, &detail))
        return NULL;
    Py_XSETREF(exact_only_reason, Py_NewRef(reason));
    Py_XSETREF(exact_only_detail, Py_NewRef(detail));
    Py_XSETREF(span_class, Py_NewRef(span));
    Py_XSETREF(plan_class, Py_NewRef(plan));
    Py_XSETREF(decision_class, Py_NewRef(decision));
    Py_XSETREF(sum_builtin, Py_NewRef(builtin_sum));
    decay_tokens = c[0], context_floor = c[1], rope_numeric = c[2], displacement_weight = c[3], displacement_tokens = c[4];
    for (int i = 0; i < N_NAMES; i++) {
        if (names[i] == NULL && (names[i] = PyUnicode_InternFromString(name_text[i])) == NULL) return NULL;
    }
    Py_RETURN_NONE;
}

/* accept(cfg, target_len, spans, similarity, device_prefix_tokens, approximate_donors, chain_head_tokens) */
static PyObject *accept(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
#ifdef Py_GIL_DISABLED
    (void)args, (void)nargs;
    Py_RETURN_NONE; /* another thread could change the spans under us: the Python code decides */
#endif
    if (nargs != 7 || span_class == NULL) {
        PyErr_SetString(PyExc_TypeError, "accept() takes 7 arguments, after setup()");
        return NULL;
    }
    PyObject *cfg = args[0], *target_obj = args[1], *spans = args[2], *similarity = args[3];
    PyObject *approximate = args[5], *chain_head = args[6];
    span_t in[MAX_SPANS];
    chosen_t out[MAX_SPANS];
    Py_ssize_t n = 0, n_out = 0;
    PyObject *result = NULL, *plan_spans = NULL, *weighted = NULL, *plan = NULL;
    long long target_len, prefix, skipped = 0, bs, min_span, max_spans;
    int enabled, exact_only, strict, discovery;
    double min_ratio, min_similarity = 0.0, max_deviation;

    if (exact_ll(target_obj, &target_len) || exact_ll(args[4], &prefix)) Py_RETURN_NONE;
    if (chain_head != Py_None && exact_ll(chain_head, &skipped)) Py_RETURN_NONE;
    if (similarity != Py_None && !PyFloat_CheckExact(similarity)) Py_RETURN_NONE;
    if (!PyList_CheckExact(spans) && !PyTuple_CheckExact(spans)) Py_RETURN_NONE;
    n = PySequence_Fast_GET_SIZE(spans);
    if (n == 0 || n > MAX_SPANS) Py_RETURN_NONE;
    if (cfg_ll(cfg, N_BLOCK_SIZE, &bs) || cfg_truth(cfg, N_ENABLED, &enabled)) Py_RETURN_NONE;
    if (target_len <= 0 || !enabled || bs <= 0 || target_len <= bs || prefix < 0 || prefix % bs) Py_RETURN_NONE;
    long long limit = (target_len - 1) / bs * bs;
    if (prefix >= limit) Py_RETURN_NONE;
    if (cfg_ll(cfg, N_MIN_SPAN, &min_span) || cfg_truth(cfg, N_EXACT_ONLY, &exact_only) ||
        cfg_truth(cfg, N_STRICT, &strict) || cfg_ll(cfg, N_MAX_SPANS, &max_spans) ||
        cfg_double(cfg, N_MIN_RATIO, &min_ratio) || cfg_double(cfg, N_MAX_DEVIATION, &max_deviation) ||
        cfg_truth(cfg, N_DISCOVERY, &discovery))
        Py_RETURN_NONE;
    if (discovery) Py_RETURN_NONE;

    /* The spans' fields; then a stable sort by target start (sorted(spans, key=target_start)). */
    PyObject **items = PySequence_Fast_ITEMS(spans);
    Py_ssize_t read = 0;
    for (; read < n; read++) {
        span_t *s = &in[read];
        PyObject *start = NULL, *target = NULL, *length = NULL;
        s->obj = items[read];
        s->donor_id = PyObject_GetAttr(s->obj, names[N_DONOR_ID]);
        int bad = s->donor_id == NULL || !PyUnicode_CheckExact(s->donor_id);
        if (!bad) {
            start = PyObject_GetAttr(s->obj, names[N_DONOR_START]);
            target = PyObject_GetAttr(s->obj, names[N_TARGET_START]);
            length = PyObject_GetAttr(s->obj, names[N_LENGTH]);
            bad = exact_ll(start, &s->donor_start) || exact_ll(target, &s->target_start) || exact_ll(length, &s->length);
        }
        Py_XDECREF(start), Py_XDECREF(target), Py_XDECREF(length);
        if (bad || s->donor_start < 0 || s->target_start < 0 || s->length <= 0) {
            read++;
            goto done;
        }
    }
    for (Py_ssize_t i = 1; i < n; i++) {
        span_t key = in[i];
        Py_ssize_t j = i;
        for (; j > 0 && in[j - 1].target_start > key.target_start; j--) in[j] = in[j - 1];
        in[j] = key;
    }
    long long prev_end = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (in[i].target_start < prev_end) goto done;
        prev_end = in[i].target_start + in[i].length;
    }
    if (prev_end > target_len) goto done;

    /* Exact-equivalence, trimmed inward to target blocks, clipped to [device prefix, limit). */
    long long kept = 0;
    span_t *prev = NULL;
    int prev_exact = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        span_t *s = &in[i];
        long long ts = s->target_start, te = ts + s->length;
        int is_exact;
        if (s->donor_start != ts) {
            is_exact = 0;
        } else {
            int approx = PySequence_Contains(approximate, s->donor_id);
            if (approx < 0) goto done;
            if (approx) {
                is_exact = 0;
            } else if (ts == 0) {
                is_exact = 1;
            } else {
                is_exact = 0;
                if (prev != NULL && prev_exact && prev->target_start + prev->length == ts) {
                    int same = PyObject_RichCompareBool(prev->donor_id, s->donor_id, Py_EQ);
                    if (same < 0) goto done;
                    is_exact = same;
                }
            }
        }
        prev = s, prev_exact = is_exact;
        if (te <= prefix) continue;
        long long start = (ts + bs - 1) / bs * bs;
        if (start < prefix) start = prefix;
        long long end = te / bs * bs;
        if (end > limit) end = limit;
        if (end <= start) continue;
        kept++;
        if (end - start < min_span) continue;
        chosen_t *c = &out[n_out];
        c->donor_start = s->donor_start + (start - ts), c->target_start = start, c->length = end - start;
        c->exact = is_exact;
        if (start == ts && end == te) {
            c->span = Py_NewRef(s->obj);
        } else {
            c->span = make_span(s->donor_id, c->donor_start, start, end - start);
            if (c->span == NULL) goto done;
        }
        n_out++;
    }
    if (!kept || !n_out) goto done;
    Py_ssize_t n_chosen = n_out;
    if (exact_only) {
        Py_ssize_t lead = 0;
        while (lead < n_chosen && out[lead].exact) lead++;
        if (lead == 0) {
            PyObject *decline[] = {Py_None, exact_only_reason, exact_only_detail};
            result = PyObject_Vectorcall(decision_class, decline, 3, NULL);
            goto done; /* returns the decline (None if it could not be made) */
        }
        n_chosen = lead;
    }
    if (strict) {
        if (out[0].target_start != prefix) goto done;
        Py_ssize_t tiled = 1;
        while (tiled < n_chosen &&
               out[tiled].target_start == out[tiled - 1].target_start + out[tiled - 1].length)
            tiled++;
        n_chosen = tiled;
    }
    if (n_chosen > max_spans) goto done;

    plan_spans = PyList_New(n_chosen);
    weighted = PyList_New(0);
    if (plan_spans == NULL || weighted == NULL) goto done;
    long long reused = 0, shifted_total = 0;
    int moves = 0;
    for (Py_ssize_t i = 0; i < n_chosen; i++) {
        chosen_t *c = &out[i];
        PyList_SET_ITEM(plan_spans, i, Py_NewRef(c->span));
        reused += c->length;
        if (!c->exact) {
            long long delta = c->target_start - c->donor_start;
            shifted_total += c->length;
            PyObject *w = PyFloat_FromDouble((double)c->length * span_deviation(c->length, delta, skipped));
            if (w == NULL || PyList_Append(weighted, w) < 0) {
                Py_XDECREF(w);
                goto done;
            }
            Py_DECREF(w);
            if (delta) moves = 1;
        }
    }
    double ratio = (double)reused / (double)target_len;
    if (chain_head == Py_None && ratio < min_ratio) goto done;
    int shifted = shifted_total > 0;
    double deviation = 0.0;
    if (shifted) {
        PyObject *sum = PyObject_CallOneArg(sum_builtin, weighted);
        if (sum == NULL || !PyFloat_CheckExact(sum)) {
            Py_XDECREF(sum);
            goto done;
        }
        deviation = PyFloat_AS_DOUBLE(sum) / (double)shifted_total;
        Py_DECREF(sum);
        if (similarity != Py_None) {
            if (cfg_double(cfg, N_MIN_SIMILARITY, &min_similarity)) goto done;
            if (!(PyFloat_AS_DOUBLE(similarity) >= min_similarity)) goto done;
        }
        if (deviation > max_deviation) goto done;
        PyObject *isolation = PyObject_GetAttr(cfg, names[N_ISOLATION]);
        int none = isolation == NULL || !PyUnicode_CheckExact(isolation) ||
                   PyUnicode_CompareWithASCIIString(isolation, "none") == 0;
        Py_XDECREF(isolation);
        if (none) goto done;
    }
    plan = make_plan(plan_spans, target_obj, reused, ratio, shifted && moves, deviation, shifted);
    if (plan == NULL) goto done;
    PyObject *decision_args[2] = {plan, Py_None};
    result = PyObject_Vectorcall(decision_class, decision_args, 2, NULL);

done: /* the decision made so far (result), or None: the Python planner decides */
    if (result == NULL) PyErr_Clear();
    Py_XDECREF(plan);
    Py_XDECREF(plan_spans);
    Py_XDECREF(weighted);
    for (Py_ssize_t i = 0; i < n_out; i++) Py_DECREF(out[i].span);
    for (Py_ssize_t i = 0; i < (read < n ? read : n); i++) Py_XDECREF(in[i].donor_id);
    if (result == NULL) Py_RETURN_NONE;
    return result;
}


/* The span aligner's call (SpanAligner._native_align): sa_align through its address, and its rows as Span objects.
 * Set once by setup_spans(): Span's class, the offsets of its four slots (its member descriptors') and the word of
 * sa_align's argument block that holds the target's address. */
static PyTypeObject *spans_type;
static Py_ssize_t slot_offset[4]; /* donor_id, donor_start, target_start, length */
static Py_ssize_t target_word = -1;

/* The offsets of cls's own object slots named fields[0..n) in out; -1 with TypeError when one is not such a slot. */
static int slot_offsets(PyObject *cls, const char *const *fields, int n, Py_ssize_t *out) {
#ifdef Py_T_OBJECT_EX
    const int object_ex = Py_T_OBJECT_EX;
#else
    const int object_ex = T_OBJECT_EX;
#endif
    for (int i = 0; i < n; i++) {
        PyObject *d = PyObject_GetAttrString(cls, fields[i]);
        if (d == NULL) return -1;
        int slot = Py_IS_TYPE(d, &PyMemberDescr_Type) && ((PyMemberDescrObject *)d)->d_member->type == object_ex &&
                   PyDescr_TYPE(d) == (PyTypeObject *)cls;
        if (slot) out[i] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_DECREF(d);
        if (!slot) {
            PyErr_Format(PyExc_TypeError, "%s is not a slot of its own", fields[i]);
            return -1;
        }
    }
    return 0;
}

static PyObject *setup_spans(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *cls;
    Py_ssize_t word;
    if (!PyArg_ParseTuple(args, "O!n", &PyType_Type, &cls, &word)) return NULL;
    if (word < 0) {
        PyErr_SetString(PyExc_ValueError, "the target's word must be >= 0");
        return NULL;
    }
    static const char *const fields[4] = {"donor_id", "donor_start", "target_start", "length"};
    if (slot_offsets(cls, fields, 4, slot_offset) < 0) return NULL;
    Py_XSETREF(spans_type, (PyTypeObject *)Py_NewRef(cls));
    target_word = word;
    Py_RETURN_NONE;
}

/* A Span of one row without its __init__ (object.__new__ and the slots set, as span_aligner.py's _spans_of). */
static PyObject *row_span(PyObject *donor_id, int64_t donor_start, int64_t target_start, int64_t length) {
    PyObject *span = spans_type->tp_alloc(spans_type, 0);
    if (span == NULL) return NULL;
    PyObject *v[4] = {Py_NewRef(donor_id), PyLong_FromLongLong(donor_start), PyLong_FromLongLong(target_start),
                      PyLong_FromLongLong(length)};
    for (int i = 0; i < 4; i++) *(PyObject **)((char *)span + slot_offset[i]) = v[i];
    if (v[1] == NULL || v[2] == NULL || v[3] == NULL) Py_CLEAR(span);
    return span;
}

typedef int64_t (*align_fn)(void *);

/* spans(sa_align's address, its argument block's address, hold_gil, work address, donor ids, target): the target's
 * address (a C-contiguous buffer, held through the call) into the block, the call (without the GIL unless hold_gil),
 * then the spans of its rows (donor slot, donor start, target start, length, at the work buffer's start), or the
 * errors AlignCall.run raises for its negative results. */
static PyObject *spans(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 6 || spans_type == NULL || !PyList_CheckExact(args[4])) {
        PyErr_SetString(PyExc_TypeError, "spans() takes 6 arguments (the fifth a list), after setup_spans()");
        return NULL;
    }
    align_fn align = (align_fn)PyLong_AsVoidPtr(args[0]);
    void *block = PyLong_AsVoidPtr(args[1]);
    int hold = PyObject_IsTrue(args[2]);
    const int64_t *rows = (const int64_t *)PyLong_AsVoidPtr(args[3]);
    if (PyErr_Occurred() || hold < 0) return NULL;
    if (align == NULL || block == NULL || rows == NULL) {
        PyErr_SetString(PyExc_ValueError, "spans(): a null address");
        return NULL;
    }
    Py_buffer target; /* PyBUF_SIMPLE: C-contiguous (numpy refuses any other array), no format asked */
    if (PyObject_GetBuffer(args[5], &target, PyBUF_SIMPLE) < 0) return NULL;
    ((int64_t *)block)[target_word] = (int64_t)(intptr_t)target.buf;
    int64_t found;
    if (hold) {
        found = align(block);
    } else {
        Py_BEGIN_ALLOW_THREADS found = align(block);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&target);
    if (found < 0) {
        if (found == -1) return PyErr_Format(PyExc_MemoryError, "span aligner: out of memory");
        return PyErr_Format(PyExc_RuntimeError, "span aligner: a diagonal's donor is missing from the donor table");
    }
    PyObject *names = args[4];
    PyObject *out = PyList_New((Py_ssize_t)found);
    if (out == NULL) return NULL;
    for (int64_t i = 0; i < found; i++, rows += 4) {
        if (rows[0] < 0 || rows[0] >= PyList_GET_SIZE(names)) {
            Py_DECREF(out);
            return PyErr_Format(PyExc_RuntimeError, "span aligner: a row's donor slot %lld is not in the book",
                                (long long)rows[0]);
        }
        PyObject *span = row_span(PyList_GET_ITEM(names, rows[0]), rows[1], rows[2], rows[3]);
        if (span == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, span);
    }
    return out;
}

/* The router's exact-wins gate (residency.py's Residency.stored_together and read_stored_together, their Python
 * code the reference): whether some worker rank's block map holds every one of the prompt's hashes with a value above
 * the posting mask, read in one call. Each U64Map (u64map.py) keeps its sorted levels' addresses and lengths in its
 * _view slot (a tuple made by levels() below: the address words, then the arrays, held so that a view is never of freed
 * memory), remade wherever a level is replaced; its dict of recent changes (_delta) and its deletions (_gone) come
 * first, as in U64Map.get. Set once by setup_gate(): U64Map's class and the offsets of the slots read. */
static PyTypeObject *map_type;
enum { M_BUSY, M_CHANGES, M_DELTA, M_GONE, M_VIEW, M_SLOTS };
static Py_ssize_t map_offset[M_SLOTS];
static PyObject *hashes_name; /* "hashes": a worker rank's block map, tokens_hash -> blocks << 32 | posting */
/* A view's address words: each level's keys, values (u64) and, for the overlay and the frozen level, live flags (numpy
 * bools), then its length; newest level first, as U64Map.get reads them. */
enum { V_OVER, V_FROZEN = 4, V_BASE = 8, V_WORDS = 11 };

static PyObject *setup_gate(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *cls;
    if (!PyArg_ParseTuple(args, "O!", &PyType_Type, &cls)) return NULL;
    static const char *const fields[M_SLOTS] = {"_busy", "_changes", "_delta", "_gone", "_view"};
    if (slot_offsets(cls, fields, M_SLOTS, map_offset) < 0) return NULL;
    if (hashes_name == NULL && (hashes_name = PyUnicode_InternFromString("hashes")) == NULL) return NULL;
    Py_XSETREF(map_type, (PyTypeObject *)Py_NewRef(cls));
    Py_RETURN_NONE;
}

/* levels(over keys, over values, over live, frozen keys, frozen values, frozen live, base keys, base values): a
 * map's view, (address words as bytes, the eight arrays). Each a C-contiguous buffer (numpy refuses others), the keys
 * and values 8 bytes an entry, the live flags 1. */
static PyObject *levels(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "levels() takes 8 arrays");
        return NULL;
    }
    int64_t words[V_WORDS];
    static const int word_of[8] = {V_OVER, V_OVER + 1, V_OVER + 2, V_FROZEN, V_FROZEN + 1, V_FROZEN + 2, V_BASE,
                                   V_BASE + 1};
    static const int width_of[8] = {8, 8, 1, 8, 8, 1, 8, 8};
    static const int level_of[8] = {V_OVER, V_OVER, V_OVER, V_FROZEN, V_FROZEN, V_FROZEN, V_BASE, V_BASE};
    static const int columns_of[3] = {3, 3, 2};
    for (int i = 0; i < 8; i++) {
        Py_buffer b;
        if (PyObject_GetBuffer(args[i], &b, PyBUF_SIMPLE) < 0) return NULL;
        words[word_of[i]] = (int64_t)(intptr_t)b.buf;
        Py_ssize_t len = b.len;
        PyBuffer_Release(&b);
        int n_word = level_of[i] + columns_of[level_of[i] / 4];
        if (len % width_of[i] || (word_of[i] != level_of[i] && words[n_word] != len / width_of[i])) {
            PyErr_SetString(PyExc_ValueError, "levels(): a level's columns differ in length");
            return NULL;
        }
        words[n_word] = len / width_of[i];
    }
    PyObject *out = PyTuple_New(9);
    if (out == NULL) return NULL;
    PyObject *packed = PyBytes_FromStringAndSize((const char *)words, sizeof words);
    if (packed == NULL) {
        Py_DECREF(out);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 0, packed);
    for (int i = 0; i < 8; i++) PyTuple_SET_ITEM(out, i + 1, Py_NewRef(args[i]));
    return out;
}

/* Where key is in the sorted keys[0..n), or -1. */
static int64_t sorted_at(const uint64_t *keys, int64_t n, uint64_t key) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + ((hi - lo) >> 1);
        if (keys[mid] < key) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && keys[lo] == key ? lo : -1;
}

/* A map's slot (borrowed), or NULL with AttributeError. */
static PyObject *map_slot(PyObject *map, int slot) {
    PyObject *v = *(PyObject **)((char *)map + map_offset[slot]);
    if (v == NULL) PyErr_SetString(PyExc_AttributeError, "a block map slot is not set");
    return v;
}

/* Whether the map holds key (the Python int key, its u64 value in *value when in_range) with a value above floor
 * (floor_obj, the same as an int): 1 or 0, -1 on an error. U64Map.get's order: the dict, the deletions, then the
 * levels newest first. */
static int held_above(PyObject *map, PyObject *key, int in_range, uint64_t value, PyObject *floor_obj, uint64_t floor) {
    PyObject *delta = map_slot(map, M_DELTA), *gone = map_slot(map, M_GONE), *view = map_slot(map, M_VIEW);
    if (delta == NULL || gone == NULL || view == NULL) return -1;
    if (!PyDict_Check(delta) || !PyAnySet_Check(gone) || !PyTuple_Check(view) || PyTuple_GET_SIZE(view) != 9 ||
        !PyBytes_Check(PyTuple_GET_ITEM(view, 0)) || PyBytes_GET_SIZE(PyTuple_GET_ITEM(view, 0)) != V_WORDS * 8) {
        PyErr_SetString(PyExc_TypeError, "a block map without its levels' view");
        return -1;
    }
    PyObject *held = PyDict_GetItemWithError(delta, key);
    if (held != NULL) return PyObject_RichCompareBool(held, floor_obj, Py_GT);
    if (PyErr_Occurred()) return -1;
    if (PySet_GET_SIZE(gone)) {
        int deleted = PySet_Contains(gone, key);
        if (deleted) return deleted < 0 ? -1 : 0;
    }
    if (!in_range) return 0; /* no u64 key equals it */
    int64_t words[V_WORDS];
    memcpy(words, PyBytes_AS_STRING(PyTuple_GET_ITEM(view, 0)), sizeof words);
    for (int level = V_OVER; level <= V_FROZEN; level += 4) {
        int64_t at = sorted_at((const uint64_t *)(intptr_t)words[level], words[level + 3], value);
        if (at >= 0) {
            if (!((const uint8_t *)(intptr_t)words[level + 2])[at]) return 0; /* deleted */
            return ((const uint64_t *)(intptr_t)words[level + 1])[at] > floor;
        }
    }
    int64_t at = sorted_at((const uint64_t *)(intptr_t)words[V_BASE], words[V_BASE + 2], value);
    return at >= 0 && ((const uint64_t *)(intptr_t)words[V_BASE + 1])[at] > floor;
}

/* A map's U64Map.quiet(): its change count (a new reference), or NULL while a change runs (*error set on an error). */
static PyObject *quiet(PyObject *map, int *error) {
    PyObject *busy = map_slot(map, M_BUSY), *changes = map_slot(map, M_CHANGES);
    if (busy == NULL || changes == NULL) {
        *error = 1;
        return NULL;
    }
    int running = PyObject_IsTrue(busy);
    if (running) {
        *error = running < 0;
        return NULL;
    }
    return Py_NewRef(changes);
}

#define GATE_KEYS 8

/* stored_together(workers, hashes, floor, careful): whether the block map (`hashes`) of some value of the dict
 * `workers` holds every one of the ints `hashes` with a value above `floor` (>= 0): True or False. With `careful`
 * (a reader without the residency's lock), Residency.read_stored_together's answer: a map read while a change of it
 * runs (U64Map.quiet None before or after the read, or its count moved) makes the answer None unless another map
 * holds them all. The GIL is held for the whole call and nothing here runs Python code, so no change starts or runs
 * Python code during it: a map quiet before the read is quiet after it, as in the reference when no change overlaps
 * its read; a change that let the GIL go halfway (a compiled merge) is running, so its map reads as busy. */
static PyObject *stored_together(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
#ifdef Py_GIL_DISABLED
    (void)args, (void)nargs;
    PyErr_SetString(PyExc_RuntimeError, "stored_together() needs the GIL");
    return NULL;
#else
    if (nargs != 4 || map_type == NULL || !PyDict_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "stored_together() takes 4 arguments (the first a dict), after setup_gate()");
        return NULL;
    }
    PyObject *workers = args[0], *floor_obj = args[2];
    uint64_t floor = PyLong_AsUnsignedLongLong(floor_obj);
    int careful = PyObject_IsTrue(args[3]);
    if (PyErr_Occurred() || careful < 0) return NULL;
    PyObject *seq = PySequence_Fast(args[1], "stored_together(): the hashes are not a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **keys = PySequence_Fast_ITEMS(seq);
    uint64_t small_values[GATE_KEYS];
    char small_in_range[GATE_KEYS];
    uint64_t *values = small_values;
    char *in_range = small_in_range;
    PyObject *result = NULL;
    if (n > GATE_KEYS) {
        values = PyMem_Malloc((size_t)n * sizeof *values);
        in_range = PyMem_Malloc((size_t)n);
        if (values == NULL || in_range == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyLong_Check(keys[i])) {
            PyErr_SetString(PyExc_TypeError, "stored_together(): a hash is not an int");
            goto done;
        }
        values[i] = PyLong_AsUnsignedLongLong(keys[i]);
        in_range[i] = !PyErr_Occurred();
        if (!in_range[i]) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError)) goto done;
            PyErr_Clear(); /* negative or past 2**64: on no level */
        }
    }
    Py_ssize_t pos = 0;
    PyObject *key, *blocks;
    int unsure = 0;
    while (PyDict_Next(workers, &pos, &key, &blocks)) {
        PyObject *map = PyObject_GetAttr(blocks, hashes_name);
        if (map == NULL) goto done;
        if (!Py_IS_TYPE(map, map_type)) {
            Py_DECREF(map);
            PyErr_SetString(PyExc_TypeError, "a worker's block map is not a U64Map");
            goto done;
        }
        PyObject *before = NULL;
        int error = 0, stored = 1;
        if (careful && (before = quiet(map, &error)) == NULL) stored = 0;
        for (Py_ssize_t i = 0; stored == 1 && !error && i < n; i++)
            stored = held_above(map, keys[i], in_range[i], values[i], floor_obj, floor);
        if (careful && before != NULL && stored >= 0) {
            PyObject *after = quiet(map, &error);
            int same = after == NULL ? 0 : PyObject_RichCompareBool(after, before, Py_EQ);
            Py_XDECREF(after);
            if (same < 0) error = 1;
            else if (!same) Py_CLEAR(before);
        }
        Py_DECREF(map);
        int changing = careful && before == NULL;
        Py_XDECREF(before);
        if (error || stored < 0) goto done;
        if (changing) unsure = 1;
        else if (stored) {
            result = Py_NewRef(Py_True);
            goto done;
        }
    }
    result = Py_NewRef(unsure ? Py_None : Py_False);
done:
    if (values != small_values) PyMem_Free(values);
    if (in_range != small_in_range) PyMem_Free(in_range);
    Py_DECREF(seq);
    return result;
#endif
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS,
     "setup(Span, MaterializationPlan, PlanDecision, sum, (decay, floor, rope, displacement weight, tokens))"},
    {"accept", (PyCFunction)(void (*)(void))accept, METH_FASTCALL,
     "accept(cfg, target_len, spans, similarity, device_prefix_tokens, approximate_donors, chain_head_tokens): "
     "Planner.plan's accepting decision, or None"},
    {"setup_spans", setup_spans, METH_VARARGS, "setup_spans(Span, the argument block's word of the target)"},
    {"spans", (PyCFunction)(void (*)(void))spans, METH_FASTCALL,
     "spans(sa_align address, argument block address, hold_gil, work address, donor ids, target): the aligner's "
     "spans"},
    {"setup_gate", setup_gate, METH_VARARGS, "setup_gate(U64Map)"},
    {"levels", (PyCFunction)(void (*)(void))levels, METH_FASTCALL,
     "levels(over keys, over values, over live, frozen keys, frozen values, frozen live, base keys, base values): a "
     "block map's view of its levels"},
    {"stored_together", (PyCFunction)(void (*)(void))stored_together, METH_FASTCALL,
     "stored_together(workers, hashes, floor, careful): whether one worker's block map holds every hash above floor "
     "(None: careful, and a map it read was changing)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_planner", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__planner(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddStringConstant(m, "SOURCE_DIGEST", MODULE_SOURCE_DIGEST) < 0) Py_CLEAR(m);
    return m;
}
