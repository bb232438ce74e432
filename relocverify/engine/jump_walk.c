/* relocverify.engine.jump_walk: one function's jump-probe answers in one walk (``engine.jumps``).

   ``walk`` answers every instruction of a function as ``JumpProver.function`` does, in the same order and
   with the same side effects, and calls back into Python for each instruction the walk cannot answer from
   what is already known.  For the instruction at i, the run i..j-1 is the fewest whole instructions that
   cover ``jump_size`` bytes (or reach the function's end), and:

   1. its range [A, A + max(jump_size, run)) is asked the questions of ``PatchRanges.refusals``, in their
      order (past the function's end; a site, the first by kind among those over the whole function and
      those that overlap; the exception table; a jump table; a stored pointer inside; another indirect
      jump; a direct branch target inside), from the function's facts (``PatchRanges.function_facts``)
      passed as sorted arrays;
   2. in a function far from the trampoline (``compose`` given), the run is eligible when every piece is
      known to pass (``JumpProver._known``: a copy's token ``lane_token`` with ``COPY_LANE``, or with no
      answer yet ``derive(k)``; a relative branch's ``branch_token`` with whether it is last; looked up in
      ``pieces``), and refused as a call
      in range when its keys' facts say ``plan_block`` would (``JumpProver._call_first``);
   3. otherwise ``slow(i, j, length)`` answers (decodes, plans, proves: it may learn pieces and facts,
      which the walk reads as it goes on).

   Each answer is a slot, a byte the caller gives a meaning (a bucket and how to say why); ``aux`` holds
   the index of the stored pointer or branch target a range refusal names, or where in its run the call is
   that refuses it.  It is a second implementation
   of the decisions of ``JumpProver.function`` over ``PatchRanges.refusals`` (their Python serves where it
   is not built): ``tests/test_jump_walk.py`` holds the two alike on generated functions and on a slice
   of the kernel. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "buffers.h"

typedef unsigned __int128 u128;

/* The range facts of one function (see ``walk``'s argument ``ranges``). */
typedef struct {
    int sites;
    long cover_rank, cover_slot;
    const uint64_t *p_start, *p_end;
    const uint32_t *p_rank;
    const unsigned char *p_slot;
    Py_ssize_t np;
    uint64_t reach;
    long extable_slot, table_slot, ptr_slot, indirect_slot, target_slot, past_slot;
    const uint64_t *ptr;
    Py_ssize_t nptr;
    const uint64_t *targets;
    Py_ssize_t ntargets;
} Ranges;

/* the first index whose value is > x (bisect_right) or >= x (bisect_left) */
static Py_ssize_t bisect_right(const uint64_t *a, Py_ssize_t n, uint64_t x) {
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (x < a[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

static Py_ssize_t bisect_left(const uint64_t *a, Py_ssize_t n, u128 x) {
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if ((u128)a[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The slot of the refusal of [address, address + length) (0: none), as ``PatchRanges.refusals`` orders the
   questions; *aux: the pointer's or target's index. */
static long range_slot(const Ranges *r, uint64_t address, uint64_t length, u128 fend, uint32_t *aux) {
    u128 end = (u128)address + length;
    *aux = 0;
    if (end > fend)
        return r->past_slot;
    if (r->sites) {
        long best_rank = r->cover_rank, best_slot = r->cover_slot;
        u128 top = (u128)address + (length ? length : 1);
        Py_ssize_t k = address < r->reach ? 0 : bisect_right(r->p_start, r->np, address - r->reach);
        Py_ssize_t stop = bisect_left(r->p_start, r->np, top);
        for (; k < stop; k++)
            if (r->p_end[k] > address && (best_rank < 0 || (long)r->p_rank[k] < best_rank)) {
                best_rank = r->p_rank[k];
                best_slot = r->p_slot[k];
            }
        if (best_rank >= 0)
            return best_slot;
        if (r->extable_slot)
            return r->extable_slot;
    }
    if (r->table_slot)
        return r->table_slot;
    Py_ssize_t k = bisect_right(r->ptr, r->nptr, address);
    if (k < r->nptr && (u128)r->ptr[k] < end) {
        *aux = (uint32_t)k;
        return r->ptr_slot;
    }
    if (r->indirect_slot)
        return r->indirect_slot;
    k = bisect_right(r->targets, r->ntargets, address);
    if (k < r->ntargets && (u128)r->targets[k] < end) {
        *aux = (uint32_t)k;
        return r->target_slot;
    }
    return 0;
}

/* What composing needs (``walk``'s argument ``compose``). */
typedef struct {
    PyObject *found, *data, *aim, *derive, *pieces, *facts, *copy_lane;
    uint64_t tramp, clearance;
    PyObject **tokens; /* per instruction: NULL not made yet, Py_None none, BRANCH a branch, else a copy token */
    uint64_t *targets; /* a branch's target (``aim``) */
    unsigned char *known;
} Compose;

#define KEY(c, k) PyTuple_GET_ITEM(PyTuple_GET_ITEM((c)->found, (k)), 2)

static PyObject BRANCH_MARK; /* a distinct address: "a relative branch or RIP-relative operand" */
#define BRANCH (&BRANCH_MARK)

/* ``lane_token(key, raw) or _aimed(key, raw, address)``, a branch's (key, target) kept as BRANCH with its
   target (``aim(k)``, None for none) in targets[k]. NULL on error. */
static PyObject *token_of(Compose *c, Py_ssize_t k, const unsigned char *data, uint32_t off, unsigned len) {
    if (c->tokens[k] != NULL)
        return c->tokens[k];
    PyObject *key = KEY(c, k), *token = Py_None;
    if (!PyBytes_Check(key)) {
        PyErr_SetString(PyExc_TypeError, "walk: a key is not bytes");
        return NULL;
    }
    const unsigned char *s = (const unsigned char *)PyBytes_AS_STRING(key);
    Py_ssize_t n = PyBytes_GET_SIZE(key);
    if (n >= 3 && s[1] == 'n') {
        if (s[0] == 'b' || (s[0] == 'd' && s[2] == 0xFF)) {
            token = key;
        } else if (s[0] == 'd') {
            token = PyBytes_FromStringAndSize(NULL, n + 1 + len);
            if (token == NULL)
                return NULL;
            char *t = PyBytes_AS_STRING(token);
            memcpy(t, s, n);
            t[n] = '|';
            memcpy(t + n + 1, data + off, len);
            c->tokens[k] = token; /* owned */
            return token;
        } else if ((s[0] == 'j' || s[0] == 'r') && s[2] == 'n') {
            PyObject *target = PyObject_CallFunction(c->aim, "n", k);
            if (target == NULL)
                return NULL;
            if (target != Py_None) {
                c->targets[k] = PyLong_AsUnsignedLongLongMask(target);
                if (c->targets[k] == (uint64_t)-1 && PyErr_Occurred()) {
                    Py_DECREF(target);
                    return NULL;
                }
                token = BRANCH;
            }
            Py_DECREF(target);
        }
    }
    if (token != BRANCH)
        Py_INCREF(token);
    c->tokens[k] = token;
    return token;
}

/* Is (token, last) a piece known to pass?  1 yes, 0 no, 2 no answer yet, -1 on error. */
static int piece_passes(Compose *c, PyObject *token, PyObject *last) {
    PyObject *probe = PyTuple_Pack(2, token, last);
    if (probe == NULL)
        return -1;
    PyObject *v = PyDict_GetItemWithError(c->pieces, probe);
    Py_DECREF(probe);
    if (v == NULL)
        return PyErr_Occurred() ? -1 : 2;
    return PyObject_IsTrue(v);
}

/* ``derive(k)``: a copy with no answer yet, answered from its int3 proof (``JumpProver._derived``). */
static int derived(Compose *c, Py_ssize_t k) {
    PyObject *v = PyObject_CallFunction(c->derive, "n", k);
    if (v == NULL)
        return -1;
    int ok = PyObject_IsTrue(v);
    Py_DECREF(v);
    return ok;
}

/* ``JumpProver._known`` for the run i..j-1 (1 known, 0 not, -1 error). */
static int known(Compose *c, Py_ssize_t i, Py_ssize_t j, uint64_t start, const uint32_t *offs,
                 const unsigned char *lengths, const unsigned char *data) {
    uint64_t end = start + offs[j - 1] + lengths[j - 1];
    for (Py_ssize_t k = i; k < j; k++) {
        if (c->known[k])
            continue;
        PyObject *token = token_of(c, k, data, offs[k], lengths[k]);
        if (token == NULL)
            return -1;
        if (token == Py_None)
            return 0;
        if (token != BRANCH) {
            int ok = piece_passes(c, token, c->copy_lane);
            if (ok == 2)
                ok = derived(c, k);
            if (ok <= 0)
                return ok;
            c->known[k] = 1;
            continue;
        }
        /* branch_token(key, target, k - i, boundaries, end, tramp) */
        uint64_t target = c->targets[k];
        if (target - c->tramp + c->clearance < 2 * c->clearance)
            return 0;
        long role = -1;
        if (target == end)
            role = j - i;
        else
            for (Py_ssize_t m = i; m < j; m++)
                if (start + offs[m] == target) {
                    role = m - i;
                    break;
                }
        if (role < 0) {
            if (start + offs[i] < target && target < end)
                return 0;
            role = 254;
        }
        PyObject *key = KEY(c, k);
        Py_ssize_t n = PyBytes_GET_SIZE(key);
        PyObject *bt = PyBytes_FromStringAndSize(NULL, n + 3);
        if (bt == NULL)
            return -1;
        unsigned char *t = (unsigned char *)PyBytes_AS_STRING(bt);
        memcpy(t, PyBytes_AS_STRING(key), n);
        t[n] = (unsigned char)(k - i);
        t[n + 1] = (unsigned char)(j - i);
        t[n + 2] = (unsigned char)role;
        int ok = piece_passes(c, bt, k == j - 1 ? Py_True : Py_False);
        Py_DECREF(bt);
        if (ok != 1)
            return ok == 2 ? 0 : ok;
    }
    return 1;
}

/* fact f (0: decodes, 1: is a call, 2: has no target) of the key of instruction k; absent or None: -2 */
static int fact(Compose *c, Py_ssize_t k, int f) {
    PyObject *v = PyDict_GetItemWithError(c->facts, KEY(c, k));
    if (v == NULL)
        return PyErr_Occurred() ? -1 : -2;
    if (v == Py_None)
        return -2;
    if (!PyTuple_Check(v) || PyTuple_GET_SIZE(v) < 3) {
        PyErr_SetString(PyExc_TypeError, "walk: a key's facts are not a 3-tuple");
        return -1;
    }
    return PyObject_IsTrue(PyTuple_GET_ITEM(v, f));
}

/* ``JumpProver._call_first`` for the run i..j-1: the call's index k (i <= k < j), j for none, -1 on error. */
static Py_ssize_t call_first(Compose *c, Py_ssize_t i, Py_ssize_t j) {
    for (Py_ssize_t k = i; k < j; k++) {
        int decodes = fact(c, k, 0);
        if (decodes == -1)
            return -1;
        if (decodes <= 0)
            return j;
        int call = fact(c, k, 1);
        if (call < 0)
            return -1;
        if (call) {
            for (Py_ssize_t m = k + 1; m < j; m++) {
                int d = fact(c, m, 0);
                if (d == -1)
                    return -1;
                if (d <= 0)
                    return j;
            }
            return k;
        }
        int bare = fact(c, k, 2);
        if (bare < 0)
            return -1;
        if (!bare)
            return j;
    }
    return j;
}

static int slot_arg(PyObject *o, long *out, const char *what) {
    long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < -1 || v > 255) {
        PyErr_Format(PyExc_ValueError, "walk: %s %ld is not a slot", what, v);
        return -1;
    }
    *out = v;
    return 0;
}

/* walk(found, start, fend, ranges, compose, eligible_slot, call_slot, jump_size, slow)
     found:   the function's (offset, length, key) from its first byte on, each offset the sum of the
              lengths before it (``KeyMaker.keys``)
     ranges:  (sites, cover_rank, cover_slot, p_start, p_end, p_rank, p_slot, extable_slot, table_slot,
               pointers, ptr_slot, indirect_slot, targets, target_slot, past_slot)
     compose: None, or (data, aim, derive, pieces, facts, copy_lane, tramp, clearance)
   -> (slots, aux, offsets, composed, calls) */
static PyObject *walk(PyObject *self, PyObject *args) {
    PyObject *listed, *ranges_o, *compose_o, *slow;
    unsigned long long start, fend;
    long eligible_slot, call_slot, jump_size;
    if (!PyArg_ParseTuple(args, "O!KKOOlllO", &PyList_Type, &listed, &start, &fend, &ranges_o, &compose_o,
                          &eligible_slot, &call_slot, &jump_size, &slow))
        return NULL;
    /* a tuple of its own: the callbacks run Python, which must not change what the walk indexes */
    PyObject *found = PyList_AsTuple(listed);
    if (found == NULL)
        return NULL;
    Buf b[8] = {{0}};
    Compose c = {0};
    Ranges r = {0};
    PyObject *result = NULL, *slots = NULL, *aux = NULL, *offsets = NULL;
    uint32_t *offs = NULL;
    unsigned char *lengths = NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(found), composed = 0, calls = 0;
    offs = PyMem_Malloc(sizeof(uint32_t) * (n ? n : 1));
    lengths = PyMem_Malloc(n ? n : 1);
    if (offs == NULL || lengths == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    uint64_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyTuple_GET_ITEM(found, i);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 3 || !PyBytes_Check(PyTuple_GET_ITEM(t, 2))) {
            PyErr_SetString(PyExc_TypeError, "walk: found holds (offset, length, key bytes)");
            goto done;
        }
        unsigned long long o = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, 0));
        long m = PyLong_AsLong(PyTuple_GET_ITEM(t, 1));
        if (PyErr_Occurred())
            goto done;
        if (o != total || m < 1 || m > 15 || total + m > 0xFFFFFFFFu) {
            PyErr_SetString(PyExc_ValueError, "walk: the instructions do not follow each other from offset 0");
            goto done;
        }
        offs[i] = (uint32_t)o;
        lengths[i] = (unsigned char)m;
        total += m;
    }
    if (!PyTuple_Check(ranges_o) || PyTuple_GET_SIZE(ranges_o) != 15) {
        PyErr_SetString(PyExc_TypeError, "walk: ranges must be a 15-tuple");
        goto done;
    }
    PyObject **ro = &PyTuple_GET_ITEM(ranges_o, 0);
    r.sites = PyObject_IsTrue(ro[0]);
    if (r.sites < 0 || slot_arg(ro[1], &r.cover_rank, "cover_rank") < 0 ||
        slot_arg(ro[2], &r.cover_slot, "cover_slot") < 0 || get(ro[3], &b[1], 8, "p_start") < 0 ||
        get(ro[4], &b[2], 8, "p_end") < 0 || get(ro[5], &b[3], 4, "p_rank") < 0 || get(ro[6], &b[4], 1, "p_slot") < 0 ||
        slot_arg(ro[7], &r.extable_slot, "extable_slot") < 0 || slot_arg(ro[8], &r.table_slot, "table_slot") < 0 ||
        get(ro[9], &b[5], 8, "pointers") < 0 || slot_arg(ro[10], &r.ptr_slot, "ptr_slot") < 0 ||
        slot_arg(ro[11], &r.indirect_slot, "indirect_slot") < 0 || get(ro[12], &b[6], 8, "targets") < 0 ||
        slot_arg(ro[13], &r.target_slot, "target_slot") < 0 || slot_arg(ro[14], &r.past_slot, "past_slot") < 0)
        goto done;
    r.p_start = b[1].b.buf;
    r.p_end = b[2].b.buf;
    r.p_rank = b[3].b.buf;
    r.p_slot = b[4].b.buf;
    r.np = b[1].b.len / 8;
    if (b[2].b.len / 8 != r.np || b[3].b.len / 4 != r.np || b[4].b.len != r.np) {
        PyErr_SetString(PyExc_ValueError, "walk: the points' arrays differ in length");
        goto done;
    }
    for (Py_ssize_t k = 0; k < r.np; k++)
        if (r.p_end[k] - r.p_start[k] > r.reach)
            r.reach = r.p_end[k] - r.p_start[k];
    r.ptr = b[5].b.buf;
    r.nptr = b[5].b.len / 8;
    r.targets = b[6].b.buf;
    r.ntargets = b[6].b.len / 8;
    if (compose_o != Py_None) {
        unsigned long long tramp, clearance;
        if (!PyTuple_Check(compose_o) ||
            !PyArg_ParseTuple(compose_o, "OOOO!O!OKK", &c.data, &c.aim, &c.derive, &PyDict_Type, &c.pieces,
                              &PyDict_Type, &c.facts, &c.copy_lane, &tramp, &clearance))
            goto done;
        c.found = found;
        c.tramp = tramp;
        c.clearance = clearance;
        if (get(c.data, &b[7], 1, "data") < 0)
            goto done;
        if ((uint64_t)b[7].b.len < total) {
            PyErr_SetString(PyExc_ValueError, "walk: data is shorter than the instructions");
            goto done;
        }
        c.tokens = PyMem_Calloc(n ? n : 1, sizeof(PyObject *));
        c.targets = PyMem_Calloc(n ? n : 1, sizeof(uint64_t));
        c.known = PyMem_Calloc(n ? n : 1, 1);
        if (c.tokens == NULL || c.targets == NULL || c.known == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    slots = PyBytes_FromStringAndSize(NULL, n);
    aux = PyBytes_FromStringAndSize(NULL, 4 * n);
    offsets = PyBytes_FromStringAndSize(NULL, 4 * n);
    if (slots == NULL || aux == NULL || offsets == NULL)
        goto done;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(slots);
    unsigned char *le = (unsigned char *)PyBytes_AS_STRING(offsets); /* little-endian u32s, as the store keeps */
    uint32_t *ax = (uint32_t *)PyBytes_AS_STRING(aux); /* native order: read back as array("I") */
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t o = offs[i];
        le[4 * i] = o & 0xff;
        le[4 * i + 1] = (o >> 8) & 0xff;
        le[4 * i + 2] = (o >> 16) & 0xff;
        le[4 * i + 3] = o >> 24;
    }
    const unsigned char *data = c.tokens != NULL ? b[7].b.buf : NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t j = i;
        uint64_t length = 0;
        while (length < (uint64_t)jump_size && j < n)
            length += lengths[j++];
        uint64_t address = start + offs[i];
        uint32_t a = 0;
        long slot = range_slot(&r, address, length > (uint64_t)jump_size ? length : (uint64_t)jump_size,
                               (u128)fend, &a);
        ax[i] = a;
        if (slot) {
            out[i] = (unsigned char)slot;
            continue;
        }
        if (c.tokens != NULL && length >= (uint64_t)jump_size) {
            int ok = known(&c, i, j, start, offs, lengths, data);
            if (ok < 0)
                goto done;
            if (ok) {
                composed++;
                out[i] = (unsigned char)eligible_slot;
                continue;
            }
            Py_ssize_t call = call_first(&c, i, j);
            if (call < 0)
                goto done;
            if (call < j) {
                calls++;
                ax[i] = (uint32_t)(call - i);
                out[i] = (unsigned char)call_slot;
                continue;
            }
        }
        PyObject *v = PyObject_CallFunction(slow, "nnK", i, j, (unsigned long long)length);
        if (v == NULL)
            goto done;
        long s = PyLong_AsLong(v);
        Py_DECREF(v);
        if (s == -1 && PyErr_Occurred())
            goto done;
        if (s < 1 || s > 255) {
            PyErr_Format(PyExc_ValueError, "walk: slow gave %ld, not a slot", s);
            goto done;
        }
        out[i] = (unsigned char)s;
    }
    result = Py_BuildValue("(OOOnn)", slots, aux, offsets, composed, calls);
done:
    Py_XDECREF(slots);
    Py_XDECREF(aux);
    Py_XDECREF(offsets);
    if (c.tokens != NULL)
        for (Py_ssize_t k = 0; k < n; k++)
            if (c.tokens[k] != NULL && c.tokens[k] != BRANCH)
                Py_DECREF(c.tokens[k]);
    PyMem_Free(c.tokens);
    PyMem_Free(c.targets);
    PyMem_Free(c.known);
    PyMem_Free(offs);
    PyMem_Free(lengths);
    release(b, 8);
    Py_DECREF(found);
    return result;
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS,
     "walk(found, start, fend, ranges, compose, eligible_slot, call_slot, jump_size, slow)"
     " -> (slots, aux, offsets, composed, calls)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "jump_walk",
                                    "One function's jump-probe answers in one walk (engine.jumps).", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_jump_walk(void) {
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
