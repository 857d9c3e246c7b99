/* The prompt TensorRT-LLM hands the connector (a list of Python ints) as native u32 token ids, in one pass.
 *
 * array.array("I").fromlist does the same through one indirect call, a type check and PyLong_AsUnsignedLong per item
 * (~4 ns an item; 8,192 ids ~34 µs in the connector's decision); this reads a small int's value from the object. Any
 * item it does not take as it is (not exactly an int, negative, >= 2**32) makes it return -1 without raising: the
 * caller then converts with fromlist, which accepts what it accepts (e.g. numpy integers) and raises what it raises.
 *
 * Runs with the GIL held (ctypes.PyDLL), so the list cannot change under it; items are borrowed. Built per CPython
 * version (it reads int objects), by trtllm_connector.unbox.build. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#ifndef UB_SOURCE_DIGEST
#define UB_SOURCE_DIGEST "unknown"
#endif

__attribute__((visibility("default"))) const char *ub_source_digest(void) { return UB_SOURCE_DIGEST; }

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

/* The n items of `list` into out[0..n); 0 on success, -1 (nothing raised) when some item is not taken as it is or the
 * list is not an exact list of n items. */
__attribute__((visibility("default"))) int ub_u32(PyObject *list, uint32_t *out, Py_ssize_t n) {
#ifdef Py_GIL_DISABLED
    (void)list, (void)out, (void)n;
    return -1; /* another thread could change the list under us */
#else
    if (!PyList_CheckExact(list) || PyList_GET_SIZE(list) != n) return -1;
    PyObject **items = ((PyListObject *)list)->ob_item;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = items[i];
        if (!PyLong_CheckExact(v) || !ub_small(v, &out[i])) return -1;
    }
    return 0;
#endif
}
