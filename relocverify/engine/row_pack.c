/* relocverify.engine.row_pack: a function's packed row (store/packed_rows.py), from its instructions' key
   numbers, in two passes around the per-instruction Python path of ``engine.worker``.

   ``scan`` finds the positions the Python path must take: those ``forced`` on it (kernel sites, another
   function's instructions), and those whose key has no plain shared finding in the worker's tables yet
   (``oid`` 0) or whose key's representative is this very instruction (``rep`` its address).

   ``pack`` then writes the row as one walk in address order would (``Worker.function_rows``): every
   position's outcome id, from the tables or from the Python path's result (``special``), numbered ``k`` by
   first appearance, an instruction's own outcome before its live variants'; the instructions counted by
   ``k`` (a variant alone counts 0); a 12-byte record (offset, length | fresh << 4 | k << 5, proof µs) for
   every instruction that is not a full row; (offset, site mask) for those at sites; (offset, j, k) for
   each variant with no reason of its own.  Every value is a little-endian u32, as the store keeps them.
   A position at sites that only mark it (``marks``: position, mask) keeps its key's finding, so the tables
   serve it unless it is special for another reason; its mask is the mark's.

   It is a second implementation of that Python walk's bookkeeping, not of any decision:
   ``tests/test_row_pack.py`` holds the two alike, and the whole-kernel test compares every reader's
   answers with the recorded digest. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "buffers.h"

/* flags of a special position */
#define DROPPED 1 /* another function owns it: no row, no count */
#define FULL 2    /* a full row (instructions table): counted, no plain record */
#define FRESH 4   /* its plain record carries the fresh bit */
#define FRESH_BIT 16
#define K_SHIFT 5

typedef struct {
    int64_t *keys;
    Py_ssize_t *vals;
    Py_ssize_t cap; /* a power of two */
} Kmap;

static int kmap_init(Kmap *m, Py_ssize_t n) {
    Py_ssize_t cap = 16;
    while (cap < 2 * n + 2)
        cap <<= 1;
    m->cap = cap;
    m->keys = PyMem_Malloc(sizeof(int64_t) * cap);
    m->vals = PyMem_Malloc(sizeof(Py_ssize_t) * cap);
    if (m->keys == NULL || m->vals == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < cap; i++)
        m->vals[i] = -1;
    return 0;
}

static void kmap_free(Kmap *m) {
    PyMem_Free(m->keys);
    PyMem_Free(m->vals);
}

/* The slot of ``key``: its value (>= 0) if present, else the empty slot to put it in. */
static Py_ssize_t kmap_slot(const Kmap *m, int64_t key) {
    uint64_t h = (uint64_t)key * 0x9E3779B97F4A7C15ULL;
    Py_ssize_t i = (Py_ssize_t)(h >> 20) & (m->cap - 1);
    while (m->vals[i] >= 0 && m->keys[i] != key)
        i = (i + 1) & (m->cap - 1);
    return i;
}

typedef struct {
    uint32_t *data;
    Py_ssize_t n, cap;
} U32s;

static int u32_push(U32s *a, uint32_t v) {
    if (a->n == a->cap) {
        Py_ssize_t cap = a->cap ? 2 * a->cap : 64;
        uint32_t *d = PyMem_Realloc(a->data, sizeof(uint32_t) * cap);
        if (d == NULL)
            return -1;
        a->data = d;
        a->cap = cap;
    }
    a->data[a->n++] = v;
    return 0;
}

static PyObject *u32_bytes(const U32s *a) {
    /* little-endian u32s: this build's order on x86-64 and every other little-endian host */
#if PY_BIG_ENDIAN
    PyObject *b = PyBytes_FromStringAndSize(NULL, a->n * 4);
    if (b == NULL)
        return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(b);
    for (Py_ssize_t i = 0; i < a->n; i++) {
        uint32_t v = a->data[i];
        p[4 * i] = v & 0xff; p[4 * i + 1] = (v >> 8) & 0xff; p[4 * i + 2] = (v >> 16) & 0xff; p[4 * i + 3] = v >> 24;
    }
    return b;
#else
    return PyBytes_FromStringAndSize((const char *)a->data, a->n * 4);
#endif
}

/* scan(lengths, numbers, start, oid, rep, forced) -> array of the special positions, ascending, as bytes of
   u32 */
static PyObject *scan(PyObject *self, PyObject *args) {
    PyObject *o[5];
    unsigned long long start;
    if (!PyArg_ParseTuple(args, "OOKOOO", &o[0], &o[1], &start, &o[2], &o[3], &o[4]))
        return NULL;
    Buf b[5] = {{0}};
    U32s out = {0};
    PyObject *result = NULL;
    if (get(o[0], &b[0], 1, "lengths") < 0 || get(o[1], &b[1], 4, "numbers") < 0 || get(o[2], &b[2], 8, "oid") < 0 ||
        get(o[3], &b[3], 8, "rep") < 0 || get(o[4], &b[4], 4, "forced") < 0)
        goto done;
    const unsigned char *lengths = b[0].b.buf;
    const uint32_t *numbers = b[1].b.buf;
    const int64_t *oid = b[2].b.buf;
    const uint64_t *rep = b[3].b.buf;
    const uint32_t *forced = b[4].b.buf;
    Py_ssize_t n = b[0].b.len, tab = b[2].b.len / 8, nf = b[4].b.len / 4;
    if (b[1].b.len / 4 != n || b[3].b.len / 8 != tab) {
        PyErr_SetString(PyExc_ValueError, "scan: lengths and numbers, or oid and rep, differ in length");
        goto done;
    }
    uint64_t address = start;
    Py_ssize_t f = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t j = numbers[i];
        int special = 0;
        while (f < nf && forced[f] < (uint32_t)i)
            f++;
        if (f < nf && forced[f] == (uint32_t)i)
            special = 1;
        else if (j >= tab || oid[j] == 0 || rep[j] == address)
            special = 1;
        if (special && u32_push(&out, (uint32_t)i) < 0) {
            PyErr_NoMemory();
            goto done;
        }
        address += lengths[i];
    }
    result = u32_bytes(&out);
done:
    release(b, 5);
    PyMem_Free(out.data);
    return result;
}

/* pack(lengths, numbers, oid, us, specials, s_oid, s_us, s_flags, s_mask, v_special, v_vid, v_j, marks)
   -> (outcome ids by k (a list), counts, plain, at_sites, variants) */
static PyObject *pack(PyObject *self, PyObject *args) {
    PyObject *o[13];
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8],
                          &o[9], &o[10], &o[11], &o[12]))
        return NULL;
    static const Py_ssize_t sizes[13] = {1, 4, 8, 4, 4, 8, 4, 1, 4, 4, 8, 4, 4};
    static const char *names[13] = {"lengths", "numbers", "oid", "us", "specials", "s_oid", "s_us", "s_flags",
                                    "s_mask", "v_special", "v_vid", "v_j", "marks"};
    Buf b[13] = {{0}};
    Kmap m = {0};
    U32s counts = {0}, plain = {0}, sites = {0}, variants = {0};
    int64_t *order = NULL;
    PyObject *result = NULL;
    for (int k = 0; k < 13; k++)
        if (get(o[k], &b[k], sizes[k], names[k]) < 0)
            goto done;
    const unsigned char *lengths = b[0].b.buf;
    const uint32_t *numbers = b[1].b.buf, *us = b[3].b.buf, *specials = b[4].b.buf, *s_us = b[6].b.buf;
    const uint32_t *s_mask = b[8].b.buf, *v_special = b[9].b.buf;
    const int64_t *oid = b[2].b.buf, *s_oid = b[5].b.buf, *v_vid = b[10].b.buf;
    const unsigned char *s_flags = b[7].b.buf;
    const int32_t *v_j = b[11].b.buf;
    const uint32_t *marks = b[12].b.buf;
    Py_ssize_t n = b[0].b.len, tab = b[2].b.len / 8, ns = b[4].b.len / 4, nv = b[9].b.len / 4;
    Py_ssize_t nm = b[12].b.len / 8, mk = 0;
    if (b[1].b.len / 4 != n || b[3].b.len / 4 != tab || b[5].b.len / 8 != ns || b[6].b.len / 4 != ns ||
        b[7].b.len != ns || b[8].b.len / 4 != ns || b[10].b.len / 8 != nv || b[11].b.len / 4 != nv ||
        b[12].b.len % 8) {
        PyErr_SetString(PyExc_ValueError, "pack: arrays of one table differ in length");
        goto done;
    }
    for (Py_ssize_t k = 0; k < nm; k++)
        if (marks[2 * k] >= (uint32_t)n || (k && marks[2 * k] <= marks[2 * k - 2])) {
            PyErr_SetString(PyExc_ValueError, "pack: marks out of order or out of range");
            goto done;
        }
    if (kmap_init(&m, n + nv) < 0 || (order = PyMem_Malloc(sizeof(int64_t) * (n + nv + 1))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t nk = 0, s = 0, v = 0;
    uint32_t off = 0;
    for (Py_ssize_t i = 0; i < n; off += lengths[i], i++) {
        int64_t id;
        uint32_t time, flags = 0, mask = 0;
        int special = s < ns && specials[s] == (uint32_t)i;
        for (; mk < nm && marks[2 * mk] < (uint32_t)i; mk++)
            ;
        int marked = mk < nm && marks[2 * mk] == (uint32_t)i;
        if (special) {
            flags = s_flags[s];
            id = s_oid[s];
            time = s_us[s];
            mask = s_mask[s];
        } else {
            uint32_t j = numbers[i];
            if (j >= tab || oid[j] == 0) {
                PyErr_Format(PyExc_ValueError, "pack: position %zd has no outcome and is not special", i);
                goto done;
            }
            id = oid[j];
            time = us[j];
            if (marked)
                mask = marks[2 * mk + 1];
        }
        if (!(flags & DROPPED)) {
            Py_ssize_t slot = kmap_slot(&m, id), k = m.vals[slot];
            if (k < 0) {
                k = m.vals[slot] = nk;
                m.keys[slot] = id;
                order[nk++] = id;
                if (u32_push(&counts, 1) < 0)
                    goto nomem;
            } else {
                counts.data[k]++;
            }
            if (!(flags & FULL)) {
                if (u32_push(&plain, off) < 0 ||
                    u32_push(&plain, lengths[i] | ((flags & FRESH) ? FRESH_BIT : 0) | ((uint32_t)k << K_SHIFT)) < 0 ||
                    u32_push(&plain, time) < 0)
                    goto nomem;
                if (mask && (u32_push(&sites, off) < 0 || u32_push(&sites, mask) < 0))
                    goto nomem;
            }
        }
        if (special) {
            for (; v < nv && v_special[v] < (uint32_t)s; v++)
                ;
            for (; v < nv && v_special[v] == (uint32_t)s; v++) {
                Py_ssize_t slot = kmap_slot(&m, v_vid[v]), vk = m.vals[slot];
                if (vk < 0) {
                    vk = m.vals[slot] = nk;
                    m.keys[slot] = v_vid[v];
                    order[nk++] = v_vid[v];
                    if (u32_push(&counts, 0) < 0)
                        goto nomem;
                }
                if (v_j[v] >= 0 && (u32_push(&variants, off) < 0 || u32_push(&variants, (uint32_t)v_j[v]) < 0 ||
                                    u32_push(&variants, (uint32_t)vk) < 0))
                    goto nomem;
            }
            s++;
        }
    }
    if (s != ns || v != nv) {
        PyErr_SetString(PyExc_ValueError, "pack: special positions or variants out of order or out of range");
        goto done;
    }
    PyObject *ids = PyList_New(nk);
    if (ids == NULL)
        goto done;
    for (Py_ssize_t k = 0; k < nk; k++) {
        PyObject *x = PyLong_FromLongLong(order[k]);
        if (x == NULL) {
            Py_DECREF(ids);
            goto done;
        }
        PyList_SET_ITEM(ids, k, x);
    }
    result = Py_BuildValue("(NNNNN)", ids, u32_bytes(&counts), u32_bytes(&plain), u32_bytes(&sites),
                           u32_bytes(&variants));
    goto done;
nomem:
    PyErr_NoMemory();
done:
    release(b, 13);
    kmap_free(&m);
    PyMem_Free(order);
    PyMem_Free(counts.data);
    PyMem_Free(plain.data);
    PyMem_Free(sites.data);
    PyMem_Free(variants.data);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(lengths, numbers, start, oid, rep, forced) -> the positions the per-instruction path takes (u32s)"},
    {"pack", pack, METH_VARARGS,
     "pack(lengths, numbers, oid, us, specials, s_oid, s_us, s_flags, s_mask, v_special, v_vid, v_j, marks)"
     " -> (outcome ids by k, counts, plain, at_sites, variants)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "row_pack",
                                    "A function's packed row from its key numbers (engine.worker).", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_row_pack(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
#ifndef RV_SOURCE_SHA256
#define RV_SOURCE_SHA256 "unknown"
#endif
    if (PyModule_AddStringConstant(m, "SOURCE_SHA256", RV_SOURCE_SHA256) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
