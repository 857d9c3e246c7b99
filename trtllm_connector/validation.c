/* validate_load's passing path in C: the ValidatedLoad it returns when every check passes, and None otherwise.
 *
 * A CPython extension module (built per Python version by trtllm_connector.native_validation). load() follows
 * trtllm_connector/validation.py's validate_load step by step; for any check that fails, and for input it does not take
 * as it is (a span field that is not an exact int, tokens that are not 1-D contiguous uint32 buffers, more than
 * MAX_SPANS spans, any Python error on the way) it returns None and the caller runs validate_load, which then decides
 * (and raises its Declined). Token runs are compared in place (memcmp on the prompt's and the donor's buffers, no
 * copies). The donor comes from the registry's own get(); Segment and ValidatedLoad are made by their classes.
 * Runs with the GIL held. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#ifndef MODULE_SOURCE_DIGEST
#define MODULE_SOURCE_DIGEST "unknown"
#endif

#define MAX_SPANS 64

/* Set once by setup(): Segment, ValidatedLoad, Lineage.EXACT. */
static PyObject *segment_class, *load_class, *lineage_exact;
enum {
    N_DONOR_ID, N_DONOR_START, N_TARGET_START, N_LENGTH, N_GET, N_NAMESPACE, N_TOKENS, N_BLOCK_IDS, N_LINEAGE,
    N_GENERATION, N_ROTATES, N_NAMES
};
static const char *const name_text[N_NAMES] = {
    "donor_id", "donor_start", "target_start", "length", "get", "namespace_digest", "tokens", "block_ids", "lineage",
    "generation", "requires_rope_correction",
};
static PyObject *names[N_NAMES];

typedef struct {
    PyObject *donor_id; /* new reference */
    long long donor_start, target_start, length;
} span_t;

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

/* A 1-D C-contiguous buffer of native uint32 ("I", 4 bytes): what _same compares (same shape, same dtype). */
static int u32_buffer(PyObject *obj, Py_buffer *view) {
    if (PyObject_GetBuffer(obj, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        return 1;
    }
    const char *f = view->format ? view->format : "B";
    if (*f == '=' || *f == '@') f++;
    if (view->ndim != 1 || view->itemsize != 4 || strcmp(f, "I") != 0) {
        PyBuffer_Release(view);
        return 1;
    }
    return 0;
}

static PyObject *setup(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *segment, *load, *exact;
    if (!PyArg_ParseTuple(args, "OOO", &segment, &load, &exact)) return NULL;
    Py_XSETREF(segment_class, Py_NewRef(segment));
    Py_XSETREF(load_class, Py_NewRef(load));
    Py_XSETREF(lineage_exact, Py_NewRef(exact));
    for (int i = 0; i < N_NAMES; i++) {
        if (names[i] == NULL && (names[i] = PyUnicode_InternFromString(name_text[i])) == NULL) return NULL;
    }
    Py_RETURN_NONE;
}

/* load(target, num_computed, spans, registry, namespace_digest, tokens_per_block, exact_only, shift_supported,
 *      tokens_checked) */
static PyObject *load(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
#ifdef Py_GIL_DISABLED
    (void)args, (void)nargs;
    Py_RETURN_NONE; /* another thread could change the spans under us: the Python code decides */
#endif
    if (nargs != 9 || segment_class == NULL) {
        PyErr_SetString(PyExc_TypeError, "load() takes 9 arguments, after setup()");
        return NULL;
    }
    PyObject *spans = args[2], *registry = args[3], *namespace = args[4];
    long long computed, tpb;
    int exact_only = PyObject_IsTrue(args[6]), shift_supported = PyObject_IsTrue(args[7]);
    int checked = PyObject_IsTrue(args[8]);
    if (exact_only < 0 || shift_supported < 0 || checked < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (exact_ll(args[1], &computed) || exact_ll(args[5], &tpb) || tpb <= 0 || computed < 0) Py_RETURN_NONE;
    if (!PyUnicode_CheckExact(namespace)) Py_RETURN_NONE;
    if (!PyList_CheckExact(spans) && !PyTuple_CheckExact(spans)) Py_RETURN_NONE;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(spans);
    if (n == 0 || n > MAX_SPANS) Py_RETURN_NONE;

    Py_buffer target;
    if (u32_buffer(args[0], &target)) Py_RETURN_NONE;
    const uint32_t *t = (const uint32_t *)target.buf;
    long long target_len = (long long)(target.len / 4);
    span_t in[MAX_SPANS];
    PyObject *segments = NULL, *result = NULL, *load_obj = NULL;
    Py_ssize_t read = 0, n_segments = 0;

    if (computed % tpb) goto done;
    long long limit = (target_len - 1) / tpb * tpb;
    if (target_len < 1 || limit <= computed) goto done;
    PyObject **items = PySequence_Fast_ITEMS(spans);
    for (; read < n; read++) {
        span_t *s = &in[read];
        PyObject *start = NULL, *target_start = NULL, *length = NULL;
        s->donor_id = PyObject_GetAttr(items[read], names[N_DONOR_ID]);
        int bad = s->donor_id == NULL;
        if (!bad) {
            start = PyObject_GetAttr(items[read], names[N_DONOR_START]);
            target_start = PyObject_GetAttr(items[read], names[N_TARGET_START]);
            length = PyObject_GetAttr(items[read], names[N_LENGTH]);
            bad = exact_ll(start, &s->donor_start) || exact_ll(target_start, &s->target_start) ||
                  exact_ll(length, &s->length);
        }
        Py_XDECREF(start), Py_XDECREF(target_start), Py_XDECREF(length);
        if (bad || s->donor_start < 0 || s->target_start < 0 || s->length <= 0) {
            read++;
            goto done;
        }
    }
    for (Py_ssize_t i = 1; i < n; i++) { /* sorted(spans, key=target_start): stable */
        span_t key = in[i];
        Py_ssize_t j = i;
        for (; j > 0 && in[j - 1].target_start > key.target_start; j--) in[j] = in[j - 1];
        in[j] = key;
    }

    /* The pieces continuing the prefix, cut at the limit, then to whole blocks. */
    long long piece_start[MAX_SPANS], piece_stop[MAX_SPANS];
    Py_ssize_t piece_span[MAX_SPANS], n_pieces = 0;
    long long pos = computed;
    for (Py_ssize_t i = 0; i < n; i++) {
        long long te = in[i].target_start + in[i].length;
        if (te <= pos) continue;
        if (in[i].target_start > pos || pos >= limit) break;
        long long stop = te < limit ? te : limit;
        piece_span[n_pieces] = i, piece_start[n_pieces] = pos, piece_stop[n_pieces] = stop;
        n_pieces++;
        pos = stop;
    }
    long long end = pos / tpb * tpb;
    if (end <= computed) goto done;

    segments = PyTuple_New(n_pieces);
    if (segments == NULL) goto done;
    for (Py_ssize_t p = 0; p < n_pieces; p++) {
        span_t *s = &in[piece_span[p]];
        long long start = piece_start[p], stop = piece_stop[p] < end ? piece_stop[p] : end;
        if (stop <= start) break;
        PyObject *donor = PyObject_CallMethodOneArg(registry, names[N_GET], s->donor_id);
        if (donor == NULL || donor == Py_None) {
            Py_XDECREF(donor);
            goto done;
        }
        PyObject *digest = PyObject_GetAttr(donor, names[N_NAMESPACE]);
        PyObject *tokens = PyObject_GetAttr(donor, names[N_TOKENS]);
        PyObject *blocks = PyObject_GetAttr(donor, names[N_BLOCK_IDS]);
        PyObject *lineage = PyObject_GetAttr(donor, names[N_LINEAGE]);
        PyObject *generation = PyObject_GetAttr(donor, names[N_GENERATION]);
        PyObject *segment = NULL;
        Py_buffer donor_tokens;
        int have_tokens = 0;
        int ok = digest != NULL && tokens != NULL && blocks != NULL && lineage != NULL && generation != NULL &&
                 PyUnicode_CheckExact(digest) && PyUnicode_Compare(digest, namespace) == 0;
        long long d0 = s->donor_start + (start - s->target_start), len = stop - start;
        if (ok) {
            have_tokens = !u32_buffer(tokens, &donor_tokens);
            Py_ssize_t n_blocks = PyObject_Length(blocks);
            ok = have_tokens && n_blocks >= 0 && d0 + len <= (long long)(donor_tokens.len / 4) &&
                 (d0 + len + tpb - 1) / tpb <= (long long)n_blocks;
        }
        if (ok) {
            const uint32_t *d = (const uint32_t *)donor_tokens.buf;
            ok = checked || memcmp(t + start, d + d0, (size_t)len * 4) == 0;
            int exact = ok && lineage == lineage_exact && d0 == start && (!start || memcmp(t, d, (size_t)start * 4) == 0);
            if (ok && exact_only && !exact) ok = 0;
            if (ok) {
                PyObject *vals[6] = {donor, generation, PyLong_FromLongLong(d0), PyLong_FromLongLong(start),
                                     PyLong_FromLongLong(len), exact ? Py_True : Py_False};
                segment = vals[2] && vals[3] && vals[4] ? PyObject_Vectorcall(segment_class, vals, 6, NULL) : NULL;
                Py_XDECREF(vals[2]), Py_XDECREF(vals[3]), Py_XDECREF(vals[4]);
            }
        }
        if (have_tokens) PyBuffer_Release(&donor_tokens);
        Py_XDECREF(digest), Py_XDECREF(tokens), Py_XDECREF(blocks), Py_XDECREF(lineage), Py_XDECREF(generation);
        Py_DECREF(donor);
        if (segment == NULL) goto done;
        PyTuple_SET_ITEM(segments, n_segments++, segment);
    }
    if (n_segments < n_pieces && _PyTuple_Resize(&segments, n_segments) < 0) goto done;
    PyObject *computed_obj = PyLong_FromLongLong(computed), *tokens_obj = PyLong_FromLongLong(end - computed);
    if (computed_obj != NULL && tokens_obj != NULL) {
        PyObject *vals[3] = {computed_obj, tokens_obj, segments};
        load_obj = PyObject_Vectorcall(load_class, vals, 3, NULL);
    }
    Py_XDECREF(computed_obj), Py_XDECREF(tokens_obj);
    if (load_obj == NULL) goto done;
    if (!shift_supported) {
        PyObject *rotates = PyObject_GetAttr(load_obj, names[N_ROTATES]);
        int moves = rotates == NULL ? -1 : PyObject_IsTrue(rotates);
        Py_XDECREF(rotates);
        if (moves != 0) goto done;
    }
    result = Py_NewRef(load_obj);

done:
    if (result == NULL) PyErr_Clear();
    Py_XDECREF(load_obj);
    Py_XDECREF(segments);
    for (Py_ssize_t i = 0; i < (read < n ? read : n); i++) Py_XDECREF(in[i].donor_id);
    PyBuffer_Release(&target);
    if (result == NULL) Py_RETURN_NONE;
    return result;
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS, "setup(Segment, ValidatedLoad, Lineage.EXACT)"},
    {"load", (PyCFunction)(void (*)(void))load, METH_FASTCALL,
     "load(target, num_computed, spans, registry, namespace_digest, tokens_per_block, exact_only, shift_supported, "
     "tokens_checked): validate_load's ValidatedLoad when every check passes, or None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_validation", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__validation(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddStringConstant(m, "SOURCE_DIGEST", MODULE_SOURCE_DIGEST) < 0) Py_CLEAR(m);
    return m;
}
