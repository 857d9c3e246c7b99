/* A sync page's donor entries built in C: Residency._entries' DonorEntry objects for rows of one size.
 *
 * A CPython extension module (built per Python version by semblend_dynamo.native_entries). build() makes, for each row
 * picked, the DonorEntry that the Python path of semblend_dynamo/router/residency.py (_entries: _fixed_blobs, then
 * DonorEntry(...)) makes from the same columns: the same slot values, the strings and small ints shared through the
 * same callables (sys.intern, _shared_int, called once per distinct value of a column as _shared does), the worker key
 * from the same dict, and the blob (head, hashes, embedding) written straight from the page's buffers into its bytes.
 * The object is allocated by the class's own allocator and its slots written through their member descriptors'
 * offsets, so no __init__ frame runs and no intermediate array or list of bytes is made. Anything it does not take as
 * it is (a column that is not a list, buffers of other sizes, a row out of range, a value of another type) raises;
 * the caller sends it only what the Python path would take the same way (tests/router/test_native_entries.py builds
 * both and compares every slot). Runs with the GIL held. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

#if PY_BIG_ENDIAN
#error "the blob's head is little-endian: this file writes it in the host's order"
#endif
#define BLOB_HEAD 19 /* residency.BLOB_HEAD: setup() checks it */
#ifdef Py_T_OBJECT_EX /* 3.12's name; structmember.h's T_OBJECT_EX before */
#define SLOT_MEMBER Py_T_OBJECT_EX
#else
#define SLOT_MEMBER T_OBJECT_EX
#endif

#ifndef MODULE_SOURCE_DIGEST
#define MODULE_SOURCE_DIGEST "unknown"
#endif

/* The DonorEntry slots build() writes, in this order (setup() checks the class has each as a member). */
enum { S_DONOR_ID, S_DONOR_KEY, S_ROUTER_ID, S_WORKER, S_DEPLOYMENT, S_NAMESPACE, S_NUM_TOKENS, S_BLOCK_SIZE, S_BLOB,
       S_MISSING, S_COUNT };
static const char *const slot_names[S_COUNT] = {
    "donor_id", "donor_key", "router_id", "worker", "deployment", "namespace", "num_tokens", "block_size", "blob",
    "missing",
};
static PyTypeObject *entry_class;
static Py_ssize_t offsets[S_COUNT];

/* setup(DonorEntry, BLOB_HEAD): note the class and its slots' offsets; raises if a slot is not a plain object member
 * or the blob's head is not the one this file writes. */
static PyObject *setup(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *cls;
    Py_ssize_t head;
    if (!PyArg_ParseTuple(args, "On", &cls, &head)) return NULL;
    if (!PyType_Check(cls) || head != BLOB_HEAD) {
        PyErr_SetString(PyExc_TypeError, "setup() takes the DonorEntry class and a blob head of 19 bytes");
        return NULL;
    }
    for (int i = 0; i < S_COUNT; i++) {
        PyObject *descr = PyObject_GetAttrString(cls, slot_names[i]);
        if (descr == NULL) return NULL;
        if (!Py_IS_TYPE(descr, &PyMemberDescr_Type) ||
            ((PyMemberDescrObject *)descr)->d_member->type != SLOT_MEMBER) {
            Py_DECREF(descr);
            PyErr_Format(PyExc_TypeError, "%s is not a slot", slot_names[i]);
            return NULL;
        }
        offsets[i] = ((PyMemberDescrObject *)descr)->d_member->offset;
        Py_DECREF(descr);
    }
    Py_INCREF(cls);
    Py_XSETREF(entry_class, (PyTypeObject *)cls);
    Py_RETURN_NONE;
}

/* column[row] of a list (borrowed), or NULL with IndexError. */
static PyObject *at(PyObject *column, Py_ssize_t row) {
    if (row < 0 || row >= PyList_GET_SIZE(column)) {
        PyErr_SetString(PyExc_IndexError, "row out of range");
        return NULL;
    }
    return PyList_GET_ITEM(column, row);
}

/* share(value), once per distinct value (memo: value -> shared); a new reference, or NULL. */
static PyObject *shared(PyObject *memo, PyObject *share, PyObject *value) {
    PyObject *held = PyDict_GetItemWithError(memo, value);
    if (held != NULL) {
        Py_INCREF(held);
        return held;
    }
    if (PyErr_Occurred()) return NULL;
    held = PyObject_CallOneArg(share, value);
    if (held == NULL || PyDict_SetItem(memo, value, held) < 0) {
        Py_XDECREF(held);
        return NULL;
    }
    return held;
}

static inline void put(PyObject *obj, int slot, PyObject *value) {
    *(PyObject **)((char *)obj + offsets[slot]) = value; /* steals value; the slot was NULL (fresh object) */
}

/* The blob columns of build(): the page's block hashes and embeddings (buffers, rows of one size), the rows' stamps,
 * embedding dims and forms (lists) and the slots reserved for the entries (a uint32 array, one per row picked). */
typedef struct {
    Py_buffer hashes, embeddings, slots;
    PyObject *registered_at, *dims, *codes;
    Py_ssize_t hash_count, embedding_bytes;
} blob_columns;

/* build(rows, ids, donor_ids, donor_keys, router_ids, worker_ids, keys, deployment, namespaces, num_tokens,
 *       block_sizes, intern, share_int, block_hashes, hash_count, embeddings, embedding_bytes, registered_at,
 *       embedding_dims, embedding_codes, slots) -> list of entries.
 * rows: a list of row numbers; ids: None or the entries' donor ids (a list, one per row picked); the columns: the
 * page's lists; keys: worker id -> worker key; then the blobs' parts (blob_columns). Each blob is written as
 * _fixed_blobs lays it out: the head (BLOB_HEAD bytes: slot u32, registered_at f64, hashes_end u32, embedding_dim
 * u16, codes u8, little-endian and packed), the row's hashes, its embedding. */
static PyObject *build(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 21) {
        PyErr_SetString(PyExc_TypeError, "build() takes 21 arguments");
        return NULL;
    }
    if (entry_class == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "setup() was not called");
        return NULL;
    }
    PyObject *rows = args[0], *ids = args[1], *keys = args[6], *deployment = args[7], *intern = args[11],
             *share_int = args[12];
    enum { C_DONOR_ID, C_DONOR_KEY, C_ROUTER_ID, C_WORKER_ID, C_NAMESPACE, C_NUM_TOKENS, C_BLOCK_SIZE, C_STAMP, C_DIM,
           C_CODES, C_COUNT };
    PyObject *columns[C_COUNT] = {args[2], args[3], args[4], args[5], args[8], args[9], args[10], args[17], args[18],
                                  args[19]};
    if (!PyList_CheckExact(rows) || (ids != Py_None && !PyList_CheckExact(ids)) || !PyDict_CheckExact(keys)) {
        PyErr_SetString(PyExc_TypeError, "rows and ids must be lists, keys a dict");
        return NULL;
    }
    for (int c = 0; c < C_COUNT; c++) {
        if (!PyList_CheckExact(columns[c])) {
            PyErr_SetString(PyExc_TypeError, "the columns must be lists");
            return NULL;
        }
    }
    Py_ssize_t count = PyList_GET_SIZE(rows);
    if (ids != Py_None && PyList_GET_SIZE(ids) != count) {
        PyErr_SetString(PyExc_ValueError, "ids and rows differ in number");
        return NULL;
    }
    Py_ssize_t hash_count = PyLong_AsSsize_t(args[14]), embedding_bytes = PyLong_AsSsize_t(args[16]);
    if ((hash_count == -1 || embedding_bytes == -1) && PyErr_Occurred()) return NULL;
    if (hash_count <= 0 || embedding_bytes <= 0 || hash_count > 0x1fffffff || embedding_bytes > 0xffffff) {
        PyErr_SetString(PyExc_ValueError, "rows of one size: hashes and embedding bytes must be positive");
        return NULL;
    }
    blob_columns blob = {.hash_count = hash_count, .embedding_bytes = embedding_bytes};
    if (PyObject_GetBuffer(args[13], &blob.hashes, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(args[15], &blob.embeddings, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&blob.hashes);
        return NULL;
    }
    if (PyObject_GetBuffer(args[20], &blob.slots, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&blob.hashes);
        PyBuffer_Release(&blob.embeddings);
        return NULL;
    }
    PyObject *out = NULL, *memos[4] = {NULL, NULL, NULL, NULL};
    Py_ssize_t page_rows = blob.hashes.len / (8 * hash_count), head = BLOB_HEAD, hashes_end = 8 * hash_count;
    Py_ssize_t size = head + hashes_end + embedding_bytes;
    if (blob.slots.itemsize != 4 || blob.slots.len != 4 * count ||
        (blob.slots.format != NULL && strcmp(blob.slots.format, "I") != 0 && strcmp(blob.slots.format, "<I") != 0 &&
         strcmp(blob.slots.format, "=I") != 0) ||
        blob.embeddings.len / embedding_bytes < page_rows) {
        PyErr_SetString(PyExc_ValueError, "slots must be uint32, one per row picked; embeddings one a hash row");
        goto done;
    }
    for (int m = 0; m < 4; m++) {
        if ((memos[m] = PyDict_New()) == NULL) goto done;
    }
    if ((out = PyList_New(count)) == NULL) goto done;
    PyObject *missing = PyLong_FromLong(-1);
    if (missing == NULL) goto fail;
    for (Py_ssize_t j = 0; j < count; j++) {
        Py_ssize_t row = PyLong_AsSsize_t(PyList_GET_ITEM(rows, j));
        if (row == -1 && PyErr_Occurred()) goto fail_missing;
        if (row < 0 || row >= page_rows) {
            PyErr_SetString(PyExc_IndexError, "row out of range");
            goto fail_missing;
        }
        PyObject *values[C_COUNT];
        for (int c = 0; c < C_COUNT; c++) {
            if ((values[c] = at(columns[c], row)) == NULL) goto fail_missing;
        }
        double stamp = PyFloat_AsDouble(values[C_STAMP]);
        long dim = PyLong_AsLong(values[C_DIM]);
        int codes = PyObject_IsTrue(values[C_CODES]);
        if ((stamp == -1.0 || dim == -1 || codes < 0) && PyErr_Occurred()) goto fail_missing;
        if (dim < 0 || dim > 0xffff) {
            PyErr_SetString(PyExc_OverflowError, "embedding_dim out of range");
            goto fail_missing;
        }
        PyObject *key = PyDict_GetItemWithError(keys, values[C_WORKER_ID]);
        if (key == NULL) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, values[C_WORKER_ID]);
            goto fail_missing;
        }
        PyObject *router_id = shared(memos[0], intern, values[C_ROUTER_ID]);
        PyObject *namespace = router_id == NULL ? NULL : shared(memos[1], intern, values[C_NAMESPACE]);
        PyObject *tokens = namespace == NULL ? NULL : shared(memos[2], share_int, values[C_NUM_TOKENS]);
        PyObject *block = tokens == NULL ? NULL : shared(memos[3], share_int, values[C_BLOCK_SIZE]);
        PyObject *bytes = block == NULL ? NULL : PyBytes_FromStringAndSize(NULL, size);
        PyObject *obj = bytes == NULL ? NULL : entry_class->tp_alloc(entry_class, 0);
        if (obj == NULL) {
            Py_XDECREF(router_id);
            Py_XDECREF(namespace);
            Py_XDECREF(tokens);
            Py_XDECREF(block);
            Py_XDECREF(bytes);
            goto fail_missing;
        }
        char *to = PyBytes_AS_STRING(bytes);
        uint32_t hashes_bytes = (uint32_t)hashes_end;
        uint16_t dim16 = (uint16_t)dim;
        uint8_t codes8 = (uint8_t)codes;
        memcpy(to, (const char *)blob.slots.buf + 4 * j, 4);
        memcpy(to + 4, &stamp, 8);
        memcpy(to + 12, &hashes_bytes, 4);
        memcpy(to + 16, &dim16, 2);
        memcpy(to + 18, &codes8, 1);
        memcpy(to + head, (const char *)blob.hashes.buf + row * hashes_end, (size_t)hashes_end);
        memcpy(to + head + hashes_end, (const char *)blob.embeddings.buf + row * embedding_bytes,
               (size_t)embedding_bytes);
        PyObject *donor_id = ids == Py_None ? values[C_DONOR_ID] : PyList_GET_ITEM(ids, j);
        put(obj, S_DONOR_ID, Py_NewRef(donor_id));
        put(obj, S_DONOR_KEY, Py_NewRef(values[C_DONOR_KEY]));
        put(obj, S_ROUTER_ID, router_id);
        put(obj, S_WORKER, Py_NewRef(key));
        put(obj, S_DEPLOYMENT, Py_NewRef(deployment));
        put(obj, S_NAMESPACE, namespace);
        put(obj, S_NUM_TOKENS, tokens);
        put(obj, S_BLOCK_SIZE, block);
        put(obj, S_BLOB, bytes);
        put(obj, S_MISSING, Py_NewRef(missing));
        PyList_SET_ITEM(out, j, obj);
    }
    Py_DECREF(missing);
    goto done;
fail_missing:
    Py_DECREF(missing);
fail:
    Py_CLEAR(out); /* the items not set yet are NULL: the list's dealloc skips them */
done:
    for (int m = 0; m < 4; m++) Py_XDECREF(memos[m]);
    PyBuffer_Release(&blob.hashes);
    PyBuffer_Release(&blob.embeddings);
    PyBuffer_Release(&blob.slots);
    return out;
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS, "setup(DonorEntry, BLOB_HEAD): the class build() makes"},
    {"build", (PyCFunction)(void (*)(void))build, METH_FASTCALL,
     "build(rows, ids, donor_ids, donor_keys, router_ids, worker_ids, keys, deployment, namespaces, num_tokens, "
     "block_sizes, intern, share_int, block_hashes, hash_count, embeddings, embedding_bytes, registered_at, "
     "embedding_dims, embedding_codes, slots): the entries of a page's rows"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_entries", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__entries(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddStringConstant(m, "SOURCE_DIGEST", MODULE_SOURCE_DIGEST) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
