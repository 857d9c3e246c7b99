/* The prompt TensorRT-LLM hands the connector (a list of Python ints) as native u32 token ids, in one pass.
 *
 * array.array("I").fromlist does the same through one indirect call, a type check and PyLong_AsUnsignedLong per item
 * (~4 ns an item; 8,192 ids ~34 µs in the connector's decision); this reads a small int's value from the object.
 * u32(tokens) returns the new array('I'), or None without raising for anything it does not take as it is (not an
 * exact list, an item that is not exactly an int, negative, >= 2**32): the caller then converts with fromlist, which
 * accepts what it accepts (e.g. numpy integers) and raises what it raises.
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

/* u32(tokens): array('I', tokens) for an exact list of exact ints in [0, 2**32), else None (nothing raised). */
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
    if (!PyList_CheckExact(list)) Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(list);
    PyObject *out = PySequence_Repeat(zero, n);
    if (out == NULL) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(out, &view, PyBUF_WRITABLE) < 0) {
        Py_DECREF(out);
        return NULL;
    }
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
     "u32(tokens): array('I', tokens) for an exact list of exact ints in [0, 2**32), else None (nothing raised)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_unbox", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__unbox(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddStringConstant(m, "SOURCE_DIGEST", MODULE_SOURCE_DIGEST) < 0) Py_CLEAR(m);
    return m;
}
