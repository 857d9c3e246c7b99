/* The prompt TensorRT-LLM hands the connector (a list of Python ints) as native u32 token ids, in one pass.
 *
 * array.array("I").fromlist does the same through one indirect call, a type check and PyLong_AsUnsignedLong per item
 * (~4 ns an item; 8,192 ids ~34 µs in the connector's decision); this reads a small int's value from the object.
 * u32(tokens) returns the new array('I'), or None without raising for anything it does not take as it is (not an
 * exact list, an item that is not exactly an int, negative, >= 2**32): the caller then converts with fromlist, which
 * accepts what it accepts (e.g. numpy integers) and raises what it raises. It also copies a one-dimensional buffer of
 * native 4-byte integers without a negative one (a zero-copy int32 view of the tokens, should a binding give one).
 *
 * A CPython extension module (built per Python version by trtllm_connector.unbox); a function of the module, not a
 * ctypes call, because ctypes' argument conversion ran cold on every decision (~7-10 µs of the decision's u32_prompt,
 * docs/benchmarks.md, session 19). Runs with the GIL held, so the list cannot change under it; items are borrowed. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#ifndef MODULE_SOURCE_DIGEST
#define MODULE_SOURCE_DIGEST "unknown"
#endif

/* Set once by setup(): array('I', [0]), repeated into each result. */
static PyObject *zero;

/* The value of an exact int in [0, 2**32) in *out; 0 when it is not one. */
static inline int ub_small(PyObject *v, uint32_t *out) {
#if PY_VERSION_HEX >= 0x030C0000
    if (PyUnstable_Long_IsCompact((PyLongObject *)v)) { /* |v| < 2**30: one digit, its sign in the tag */
        Py_ssize_t x = PyUnstable_Long_CompactValue((PyLongObject *)v);
        if (x < 0) return 0;
        *out = (uint32_t)x;
        return 1;
    }
#else
    Py_ssize_t size = Py_SIZE(v); /* digits, negative for a negative int */
    if (size == 1) {
        *out = (uint32_t)((PyLongObject *)v)->ob_digit[0];
        return 1;
    }
    if (size == 0) {
        *out = 0;
        return 1;
    }
    if (size < 0) return 0;
#endif
    unsigned long x = PyLong_AsUnsignedLong(v); /* a larger positive int */
    if (x == (unsigned long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (x > 0xFFFFFFFFul) return 0;
    *out = (uint32_t)x;
    return 1;
}

/* setup(array('I', [0])): the one-item array every result repeats. */
static PyObject *setup(PyObject *self, PyObject *template) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(template, &view, PyBUF_FORMAT) < 0) return NULL;
    const char *f = view.format ? view.format : "B";
    int ok = view.itemsize == 4 && view.len == 4 && strcmp(f, "I") == 0 && *(const uint32_t *)view.buf == 0;
    PyBuffer_Release(&view);
    if (!ok) {
        PyErr_SetString(PyExc_TypeError, "setup() takes array('I', [0])");
        return NULL;
    }
    Py_INCREF(template);
    Py_XSETREF(zero, template);
    Py_RETURN_NONE;
}

/* Whether a buffer's struct format is one native 4-byte integer: *is_signed says which kind. */
static int int32_format(const char *f, int *is_signed) {
    if (f[0] == '@' || f[0] == '=' || (f[0] == '<' && PY_LITTLE_ENDIAN) || (f[0] == '>' && PY_BIG_ENDIAN)) f++;
    if (f[0] == '\0' || f[1] != '\0') return 0;
    int int32 = f[0] == 'i' || (f[0] == 'l' && sizeof(long) == 4);
    int uint32 = f[0] == 'I' || (f[0] == 'L' && sizeof(long) == 4);
    *is_signed = int32;
    return int32 || uint32;
}

/* A new array('I') of n zeros, its writable buffer in *view (the caller releases it); NULL with an exception when out
 * of memory. */
static PyObject *new_u32(Py_ssize_t n, Py_buffer *view) {
    PyObject *out = PySequence_Repeat(zero, n);
    if (out != NULL && PyObject_GetBuffer(out, view, PyBUF_WRITABLE) < 0) Py_CLEAR(out);
    return out;
}

/* A one-dimensional, C-contiguous buffer of native 4-byte integers, none negative (a zero-copy view of the request's
 * int32 tokens, should a binding hand one over), as a new array('I'): one copy, no int object per token; None for
 * any other buffer (the caller converts it), NULL with an exception only when out of memory. bytes and bytearray are
 * left to the caller: array() reads them as raw bytes. */
static PyObject *u32_of_buffer(PyObject *tokens) {
    if (PyBytes_Check(tokens) || PyByteArray_Check(tokens)) Py_RETURN_NONE;
    Py_buffer view;
    if (PyObject_GetBuffer(tokens, &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    int is_signed = 0;
    if (view.ndim != 1 || view.itemsize != 4 || view.format == NULL || !int32_format(view.format, &is_signed)) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    Py_ssize_t n = view.len / 4;
    if (is_signed) { /* the sign bits of all items, or-ed two items at a time */
        const unsigned char *bytes = view.buf;
        uint64_t any = 0, word;
        Py_ssize_t i = 0;
        for (; i + 8 <= view.len; i += 8) {
            memcpy(&word, bytes + i, 8);
            any |= word;
        }
        uint32_t last = 0;
        if (i < view.len) memcpy(&last, bytes + i, 4);
        if ((any & 0x8000000080000000ull) || (last & 0x80000000u)) {
            PyBuffer_Release(&view);
            Py_RETURN_NONE;
        }
    }
    Py_buffer into;
    PyObject *out = new_u32(n, &into);
    if (out != NULL) {
        memcpy(into.buf, view.buf, (size_t)n * 4);
        PyBuffer_Release(&into);
    }
    PyBuffer_Release(&view);
    return out;
}

/* u32(tokens): array('I', tokens) for an exact list of exact ints in [0, 2**32) or a buffer u32_of_buffer takes,
 * else None (nothing raised). */
static PyObject *u32(PyObject *self, PyObject *list) {
    (void)self;
#ifdef Py_GIL_DISABLED
    (void)list;
    Py_RETURN_NONE; /* another thread could change the list under us: fromlist converts */
#else
    if (zero == NULL) {
        PyErr_SetString(PyExc_TypeError, "u32() is called after setup()");
        return NULL;
    }
    if (!PyList_CheckExact(list)) return PyObject_CheckBuffer(list) ? u32_of_buffer(list) : Py_NewRef(Py_None);
    Py_ssize_t n = PyList_GET_SIZE(list);
    Py_buffer view;
    PyObject *out = new_u32(n, &view);
    if (out == NULL) return NULL;
    uint32_t *o = view.buf;
    PyObject **items = ((PyListObject *)list)->ob_item;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = items[i];
        if (!PyLong_CheckExact(v) || !ub_small(v, &o[i])) {
            PyBuffer_Release(&view);
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
    }
    PyBuffer_Release(&view);
    return out;
#endif
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_O, "setup(array('I', [0]))"},
    {"u32", u32, METH_O,
     "u32(tokens): array('I', tokens) for an exact list of exact ints in [0, 2**32) or a native int32 / uint32 "
     "buffer without negative items, else None (nothing raised)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_unbox", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__unbox(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddStringConstant(m, "SOURCE_DIGEST", MODULE_SOURCE_DIGEST) < 0) Py_CLEAR(m);
    return m;
}
