/* relocverify.store.tally: an image's packed counts added up, for ``store.store.ImageReads.tallies`` (the
   summary of every run, ``report`` and ``show``).

   ``add(rows, weak)`` takes the rows of ``SELECT p.function, f.section, p.outcomes, p.counts[, p.sites]`` (a
   function's outcome ids, int32, its instructions per outcome, uint32, and its (offset, site mask) pairs,
   uint32, all little-endian: store/packed_rows.py) and the outcome ids that are not ``proved``.  It returns
   (section -> {outcome id -> instructions}, the rows of the functions that name an outcome of ``weak``,
   site mask -> instructions), as ``store.store.add_counts`` makes them: every (id, count) pair added, a
   count of 0 included, in the rows' order.

   It is a second implementation of that loop, not of any decision: ``tests/test_store.py`` holds the two
   alike on generated rows, and the whole-kernel test compares the summary's counts with the recorded ones. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static int32_t read_i32(const char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
#if PY_BIG_ENDIAN
    v = ((v & 0xFF) << 24) | ((v & 0xFF00) << 8) | ((v >> 8) & 0xFF00) | (v >> 24);
#endif
    return (int32_t)v;
}

/* One section's sums: an open-addressing table of outcome id -> instructions, and the ids in the order first
   added (the order the Python loop's dict has). */
typedef struct {
    int32_t *keys;
    long long *sums;
    unsigned char *used;
    int32_t *order;
    Py_ssize_t n, cap; /* cap a power of two */
} Sums;

static int sums_init(Sums *t) {
    t->n = 0;
    t->cap = 64;
    t->keys = PyMem_Malloc(sizeof(int32_t) * t->cap);
    t->sums = PyMem_Malloc(sizeof(long long) * t->cap);
    t->used = PyMem_Calloc(t->cap, 1);
    t->order = PyMem_Malloc(sizeof(int32_t) * t->cap);
    return t->keys && t->sums && t->used && t->order ? 0 : -1;
}

static void sums_free(Sums *t) {
    PyMem_Free(t->keys);
    PyMem_Free(t->sums);
    PyMem_Free(t->used);
    PyMem_Free(t->order);
}

static Py_ssize_t slot(const Sums *t, int32_t key) {
    Py_ssize_t i = (Py_ssize_t)(((uint32_t)key * 2654435761u) & (uint32_t)(t->cap - 1));
    while (t->used[i] && t->keys[i] != key)
        i = (i + 1) & (t->cap - 1);
    return i;
}

static int grow(Sums *t) {
    Sums bigger = {NULL, NULL, NULL, NULL, 0, t->cap * 2};
    bigger.keys = PyMem_Malloc(sizeof(int32_t) * bigger.cap);
    bigger.sums = PyMem_Malloc(sizeof(long long) * bigger.cap);
    bigger.used = PyMem_Calloc(bigger.cap, 1);
    bigger.order = PyMem_Realloc(t->order, sizeof(int32_t) * bigger.cap);
    if (!bigger.keys || !bigger.sums || !bigger.used || !bigger.order) {
        PyMem_Free(bigger.keys);
        PyMem_Free(bigger.sums);
        PyMem_Free(bigger.used);
        if (bigger.order)
            t->order = bigger.order;
        return -1;
    }
    for (Py_ssize_t i = 0; i < t->cap; i++)
        if (t->used[i]) {
            Py_ssize_t j = slot(&bigger, t->keys[i]);
            bigger.used[j] = 1, bigger.keys[j] = t->keys[i], bigger.sums[j] = t->sums[i];
        }
    bigger.n = t->n;
    PyMem_Free(t->keys);
    PyMem_Free(t->sums);
    PyMem_Free(t->used);
    *t = bigger;
    return 0;
}

static int sums_add(Sums *t, int32_t key, uint32_t n) {
    Py_ssize_t i = slot(t, key);
    if (t->used[i]) {
        t->sums[i] += n;
        return 0;
    }
    if (2 * (t->n + 1) > t->cap) {
        if (grow(t) < 0)
            return -1;
        i = slot(t, key);
    }
    t->used[i] = 1, t->keys[i] = key, t->sums[i] = n;
    t->order[t->n++] = key;
    return 0;
}

static PyObject *sums_dict(const Sums *t, int unsigned_keys) {
    PyObject *d = PyDict_New();
    for (Py_ssize_t k = 0; d != NULL && k < t->n; k++) {
        int32_t key = t->order[k];
        PyObject *ko = unsigned_keys ? PyLong_FromUnsignedLong((uint32_t)key) : PyLong_FromLong(key),
                 *vo = PyLong_FromLongLong(t->sums[slot(t, key)]);
        if (ko == NULL || vo == NULL || PyDict_SetItem(d, ko, vo) < 0)
            Py_CLEAR(d);
        Py_XDECREF(ko);
        Py_XDECREF(vo);
    }
    return d;
}

/* The function's pairs added into its section's sums; 1 when one of its outcomes is in ``weak``. */
static int add_row(Sums *mine, PyObject *outcomes, PyObject *counts, const Sums *weak) {
    Py_buffer o, c;
    if (PyObject_GetBuffer(outcomes, &o, PyBUF_SIMPLE) < 0)
        return -1;
    if (PyObject_GetBuffer(counts, &c, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&o);
        return -1;
    }
    int rc = -1, hit = 0;
    if (o.len % 4 || c.len % 4) {
        PyErr_SetString(PyExc_ValueError, "outcomes and counts are whole 4-byte items");
        goto done;
    }
    Py_ssize_t n = o.len / 4 < c.len / 4 ? o.len / 4 : c.len / 4; /* zip() stops at the shorter */
    const char *op = o.buf, *cp = c.buf;
    for (Py_ssize_t i = 0; i < n; i++)
        if (sums_add(mine, read_i32(op + 4 * i), (uint32_t)read_i32(cp + 4 * i)) < 0) {
            PyErr_NoMemory();
            goto done;
        }
    for (Py_ssize_t i = 0; i < o.len / 4 && !hit; i++) /* isdisjoint over every outcome id */
        hit = weak->n && weak->used[slot(weak, read_i32(op + 4 * i))];
    rc = hit;
done:
    PyBuffer_Release(&o);
    PyBuffer_Release(&c);
    return rc;
}

/* The site masks of a packed row's (offset, mask) pairs counted; None counts nothing. */
static int add_masks(Sums *masks, PyObject *sites) {
    if (sites == Py_None)
        return 0;
    Py_buffer b;
    if (PyObject_GetBuffer(sites, &b, PyBUF_SIMPLE) < 0)
        return -1;
    int rc = 0;
    if (b.len % 8) {
        PyErr_SetString(PyExc_ValueError, "sites are whole (offset, mask) pairs of 4-byte items");
        rc = -1;
    }
    for (Py_ssize_t i = 4; rc == 0 && i < b.len; i += 8)
        if (sums_add(masks, read_i32((const char *)b.buf + i), 1) < 0) {
            PyErr_NoMemory();
            rc = -1;
        }
    PyBuffer_Release(&b);
    return rc;
}

/* ``weak``'s ids as a table (an id outside int32 can name no stored outcome: left out). */
static int weak_table(PyObject *weak, Sums *t) {
    if (sums_init(t) < 0)
        return -1;
    PyObject *it = PyObject_GetIter(weak), *item;
    if (it == NULL)
        return -1;
    while ((item = PyIter_Next(it)) != NULL) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(item, &overflow);
        Py_DECREF(item);
        if (v == -1 && PyErr_Occurred())
            break;
        if (!overflow && v >= INT32_MIN && v <= INT32_MAX && sums_add(t, (int32_t)v, 0) < 0) {
            PyErr_NoMemory();
            break;
        }
    }
    Py_DECREF(it);
    return PyErr_Occurred() ? -1 : 0;
}

static PyObject *add(PyObject *self, PyObject *args) {
    PyObject *rows, *weak;
    if (!PyArg_ParseTuple(args, "OO", &rows, &weak))
        return NULL;
    if (!PyAnySet_Check(weak)) {
        PyErr_SetString(PyExc_TypeError, "weak is a set or a frozenset of outcome ids");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(rows, "rows is a sequence of (function, section, outcomes, counts)");
    if (seq == NULL)
        return NULL;
    PyObject *index = PyDict_New(), *sections = PyList_New(0), *weak_rows = PyList_New(0), *out = NULL;
    Sums weak_ids = {NULL, NULL, NULL, NULL, 0, 0}, masks = {NULL, NULL, NULL, NULL, 0, 0};
    Sums *tables = NULL;
    Py_ssize_t ntables = 0;
    if (index == NULL || sections == NULL || weak_rows == NULL || weak_table(weak, &weak_ids) < 0)
        goto done;
    if (sums_init(&masks) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) < 4 || PyTuple_GET_SIZE(row) > 5) {
            PyErr_SetString(PyExc_TypeError, "a row is (function, section, outcomes, counts[, sites])");
            goto done;
        }
        if (PyTuple_GET_SIZE(row) == 5 && add_masks(&masks, PyTuple_GET_ITEM(row, 4)) < 0)
            goto done;
        PyObject *section = PyTuple_GET_ITEM(row, 1), *at = PyDict_GetItemWithError(index, section);
        Py_ssize_t k;
        if (at != NULL) {
            k = PyLong_AsSsize_t(at);
        } else {
            if (PyErr_Occurred())
                goto done;
            Sums *more = PyMem_Realloc(tables, sizeof(Sums) * (ntables + 1));
            if (more == NULL) {
                PyErr_NoMemory();
                goto done;
            }
            tables = more;
            k = ntables++;
            PyObject *ko = PyLong_FromSsize_t(k);
            int bad = sums_init(&tables[k]) < 0 || ko == NULL || PyDict_SetItem(index, section, ko) < 0 ||
                      PyList_Append(sections, section) < 0;
            Py_XDECREF(ko);
            if (bad) {
                if (!PyErr_Occurred())
                    PyErr_NoMemory();
                goto done;
            }
        }
        int hit = add_row(&tables[k], PyTuple_GET_ITEM(row, 2), PyTuple_GET_ITEM(row, 3), &weak_ids);
        if (hit < 0 || (hit && PyList_Append(weak_rows, row) < 0))
            goto done;
    }
    PyObject *by_section = PyDict_New();
    for (Py_ssize_t k = 0; by_section != NULL && k < ntables; k++) {
        PyObject *d = sums_dict(&tables[k], 0);
        if (d == NULL || PyDict_SetItem(by_section, PyList_GET_ITEM(sections, k), d) < 0)
            Py_CLEAR(by_section);
        Py_XDECREF(d);
    }
    PyObject *mask_counts = by_section == NULL ? NULL : sums_dict(&masks, 1);
    if (mask_counts != NULL)
        out = Py_BuildValue("(NON)", by_section, weak_rows, mask_counts);
    else
        Py_XDECREF(by_section);
done:
    for (Py_ssize_t k = 0; k < ntables; k++)
        sums_free(&tables[k]);
    PyMem_Free(tables);
    sums_free(&weak_ids);
    sums_free(&masks);
    Py_DECREF(seq);
    Py_XDECREF(index);
    Py_XDECREF(sections);
    Py_XDECREF(weak_rows);
    return out;
}

static PyMethodDef methods[] = {
    {"add", add, METH_VARARGS, "(section -> {outcome id -> instructions}, the rows naming a weak outcome)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "tally", NULL, -1, methods};

PyMODINIT_FUNC PyInit_tally(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddStringConstant(m, "SOURCE_SHA256", RV_SOURCE_SHA256) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
