#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
static inline int ub_small(PyObject *v, uint32_t *out) {
    Py_ssize_t size = Py_SIZE(v);
    if (size == 1) { *out = (uint32_t)((PyLongObject *)v)->ob_digit[0]; return 1; }
    if (size == 0) { *out = 0; return 1; }
    if (size < 0) return 0;
    unsigned long x = PyLong_AsUnsignedLong(v);
    if (x == (unsigned long)-1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
    if (x > 0xFFFFFFFFul) return 0;
    *out = (uint32_t)x; return 1;
}
static PyObject *zero;
/* u32(list) -> array('I') or None */
static PyObject *u32(PyObject *self, PyObject *list) {
    if (!PyList_CheckExact(list)) Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(list);
    PyObject *out = PySequence_Repeat(zero, n);
    if (!out) return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(out, &b, PyBUF_WRITABLE) < 0) { Py_DECREF(out); return NULL; }
    uint32_t *o = b.buf;
    PyObject **items = ((PyListObject *)list)->ob_item;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = items[i];
        if (!PyLong_CheckExact(v) || !ub_small(v, &o[i])) { PyBuffer_Release(&b); Py_DECREF(out); Py_RETURN_NONE; }
    }
    PyBuffer_Release(&b);
    return out;
}
static PyObject *setup(PyObject *self, PyObject *z) { Py_XSETREF(zero, Py_NewRef(z)); Py_RETURN_NONE; }
static PyMethodDef m[] = {{"u32", u32, METH_O, ""}, {"setup", setup, METH_O, ""}, {0}};
static struct PyModuleDef d = {PyModuleDef_HEAD_INIT, "unbox_ext", 0, -1, m};
PyMODINIT_FUNC PyInit_unbox_ext(void) { return PyModule_Create(&d); }
