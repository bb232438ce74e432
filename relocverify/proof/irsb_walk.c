/* relocverify.proof.irsb_walk: a VEX IRSB, read where libVEX left it, in the two forms the proofs read.

   ``walk(irsb, constant, summary)`` returns what ``proof.canonical.canon_block`` makes of the block that
   pyvex would build from the same C IRSB, without building pyvex's objects first, and, when ``summary``
   is true, the facts ``proof.lifter_checks`` reads of it.  It is a second implementation of those two
   Python functions, not a new semantics: ``tests/test_lifted.py`` compares the two on every distinct
   instruction shape of a kernel and on random bytes, and ``proof.lifted`` uses this one only for blocks
   libVEX lifted whole (the cases in which ``pyvex.lift`` returns libVEX's block unchanged: a block that ends
   in ``Ijk_NoDecode`` returns None here).

   The walk follows ``canon_block`` statement by statement, in its order, with the same values:
   temporaries renumbered by definition order, IMarks, no-ops, ABI hints and writes of rip dropped, a
   read of rip refused (``NotApplicable``), a dirty helper refused as a gap (``Gap``), an undefined
   temporary a ``KeyError``.  Exit targets are left as the block's own values, with their positions
   (``exits``), because resolving a trampoline-internal target lifts another block, which would free this
   one: the caller resolves them in order after the walk.  An error is returned, not raised, with the
   exits before it, for the same reason.  Blocks this walk does not know (a constant or statement tag
   pyvex refuses) return None: the caller lifts again through pyvex.

   The block lives in libVEX's temporary arena until the next lift, so the caller holds pyvex's lift lock
   from the lift to the end of the walk. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "libvex_basictypes.h"
#include "libvex_ir.h"

#define ENUM_BASE 0x1100
#define ENUM_LIMIT 0x2000

static PyObject *enum_name[ENUM_LIMIT - ENUM_BASE]; /* libVEX enum value -> pyvex's name for it */
static PyObject *enum_dict;                          /* the whole table, for values outside the array */
static PyObject *NotApplicable, *Gap;
static int rip_offset = -1;
static PyObject *S_t, *S_c, *S_get, *S_ld, *S_ite, *S_ccall, *S_wr, *S_put, *S_st, *S_stg, *S_ldg, *S_cas,
    *S_cas2, *S_mbe, *S_exit, *S_next, *S_boring;
static PyObject *S_ity[16]; /* IRConst tag - Ico_U1 -> the constant's type name */

/* Raised inside the walk for a block pyvex itself would refuse: the caller lifts through pyvex. */
static PyObject *Unsupported;

static PyObject *name_of(int value) {
    PyObject *s = NULL;
    if (value >= ENUM_BASE && value < ENUM_LIMIT)
        s = enum_name[value - ENUM_BASE];
    if (s == NULL) {
        PyObject *key = PyLong_FromLong(value);
        if (key == NULL)
            return NULL;
        s = PyDict_GetItemWithError(enum_dict, key);
        Py_DECREF(key);
        if (s == NULL) {
            if (!PyErr_Occurred())
                PyErr_Format(Unsupported, "no pyvex name for the enum value %#x", value);
            return NULL;
        }
    }
    Py_INCREF(s);
    return s;
}

typedef struct {
    Py_ssize_t *canon; /* VEX temp -> its canonical number, -1 while undefined */
    unsigned char *folded_at;
    PyObject **folded; /* VEX temp -> the constant a folded jump qword load gave it */
    Py_ssize_t ntemps;
    Py_ssize_t defined; /* len(temps) in canon_block */
    int any_folded;
} Temps;

static Py_ssize_t define(Temps *t, IRTemp tmp) {
    if ((Py_ssize_t)tmp >= t->ntemps) {
        PyErr_Format(Unsupported, "temporary t%u outside the type environment", tmp);
        return -1;
    }
    Py_ssize_t n = t->defined;
    if (t->canon[tmp] < 0)
        t->defined++;
    t->canon[tmp] = n;
    return n;
}

static PyObject *tuple_steal(Py_ssize_t n, PyObject **items) {
    PyObject *t = PyTuple_New(n);
    if (t == NULL) {
        for (Py_ssize_t i = 0; i < n; i++)
            Py_XDECREF(items[i]);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        PyTuple_SET_ITEM(t, i, items[i]);
    return t;
}

static PyObject *const_value(const IRConst *c) {
    switch (c->tag) {
    case Ico_U1: return PyLong_FromLong(c->Ico.U1);
    case Ico_U8: return PyLong_FromLong(c->Ico.U8);
    case Ico_U16: return PyLong_FromLong(c->Ico.U16);
    case Ico_U32: return PyLong_FromUnsignedLong(c->Ico.U32);
    case Ico_U64: return PyLong_FromUnsignedLongLong(c->Ico.U64);
    case Ico_F32: return PyFloat_FromDouble((double)c->Ico.F32);
    case Ico_F32i: return PyLong_FromUnsignedLong(c->Ico.F32i);
    case Ico_F64: return PyFloat_FromDouble(c->Ico.F64);
    case Ico_F64i: return PyLong_FromUnsignedLongLong(c->Ico.F64i);
    case Ico_V128: return PyLong_FromLong(c->Ico.V128);
    case Ico_V256: return PyLong_FromUnsignedLong(c->Ico.V256);
    default:
        PyErr_Format(Unsupported, "IRConst tag %#x", c->tag);
        return NULL;
    }
}

static PyObject *const_type(const IRConst *c) {
    unsigned k = (unsigned)(c->tag - Ico_U1);
    if (k >= 16 || S_ity[k] == NULL) {
        PyErr_Format(Unsupported, "IRConst tag %#x", c->tag);
        return NULL;
    }
    Py_INCREF(S_ity[k]);
    return S_ity[k];
}

static PyObject *raise_value(PyObject *type, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    if (msg != NULL) {
        PyErr_SetObject(type, msg);
        Py_DECREF(msg);
    }
    return NULL;
}

static const char *expr_class(IRExprTag tag) {
    switch (tag) {
    case Iex_Binder: return "Binder";
    case Iex_GetI: return "GetI";
    case Iex_VECRET: return "VECRET";
    case Iex_GSPTR: return "GSPTR";
    default: return NULL;
    }
}

static PyObject *canon_expr(const IRExpr *e, Temps *t);

static PyObject *canon_args(PyObject *head, IRExpr *const *args, int n, Temps *t) {
    /* (head, canon(args[0]), ...): an operation or a clean call's tail */
    PyObject *items[8];
    items[0] = head;
    for (int i = 0; i < n; i++) {
        items[i + 1] = canon_expr(args[i], t);
        if (items[i + 1] == NULL) {
            for (int j = 0; j <= i; j++)
                Py_DECREF(items[j]);
            return NULL;
        }
    }
    return tuple_steal(n + 1, items);
}

static PyObject *canon_expr(const IRExpr *e, Temps *t) {
    if (e == NULL)
        return raise_value(Unsupported, "a NULL expression");
    switch (e->tag) {
    case Iex_RdTmp: {
        IRTemp tmp = e->Iex.RdTmp.tmp;
        if ((Py_ssize_t)tmp >= t->ntemps || t->canon[tmp] < 0) {
            PyObject *key = PyLong_FromUnsignedLong(tmp);
            if (key != NULL) {
                PyErr_SetObject(PyExc_KeyError, key);
                Py_DECREF(key);
            }
            return NULL;
        }
        PyObject *n = PyLong_FromSsize_t(t->canon[tmp]);
        if (n == NULL)
            return NULL;
        Py_INCREF(S_t);
        PyObject *items[2] = {S_t, n};
        return tuple_steal(2, items);
    }
    case Iex_Const: {
        PyObject *items[3];
        items[1] = const_type(e->Iex.Const.con);
        if (items[1] == NULL)
            return NULL;
        items[2] = const_value(e->Iex.Const.con);
        if (items[2] == NULL) {
            Py_DECREF(items[1]);
            return NULL;
        }
        Py_INCREF(S_c);
        items[0] = S_c;
        return tuple_steal(3, items);
    }
    case Iex_Get: {
        if (e->Iex.Get.offset == rip_offset)
            return raise_value(NotApplicable, "reads rip");
        PyObject *items[3];
        items[2] = name_of(e->Iex.Get.ty);
        if (items[2] == NULL)
            return NULL;
        items[1] = PyLong_FromLong(e->Iex.Get.offset);
        if (items[1] == NULL) {
            Py_DECREF(items[2]);
            return NULL;
        }
        Py_INCREF(S_get);
        items[0] = S_get;
        return tuple_steal(3, items);
    }
    case Iex_Unop: {
        PyObject *op = name_of(e->Iex.Unop.op);
        if (op == NULL)
            return NULL;
        IRExpr *args[1] = {e->Iex.Unop.arg};
        return canon_args(op, args, 1, t);
    }
    case Iex_Binop: {
        PyObject *op = name_of(e->Iex.Binop.op);
        if (op == NULL)
            return NULL;
        IRExpr *args[2] = {e->Iex.Binop.arg1, e->Iex.Binop.arg2};
        return canon_args(op, args, 2, t);
    }
    case Iex_Triop: {
        const IRTriop *d = e->Iex.Triop.details;
        PyObject *op = name_of(d->op);
        if (op == NULL)
            return NULL;
        IRExpr *args[3] = {d->arg1, d->arg2, d->arg3};
        return canon_args(op, args, 3, t);
    }
    case Iex_Qop: {
        const IRQop *d = e->Iex.Qop.details;
        PyObject *op = name_of(d->op);
        if (op == NULL)
            return NULL;
        IRExpr *args[4] = {d->arg1, d->arg2, d->arg3, d->arg4};
        return canon_args(op, args, 4, t);
    }
    case Iex_Load: {
        PyObject *items[4];
        items[1] = name_of(e->Iex.Load.end);
        if (items[1] == NULL)
            return NULL;
        items[2] = name_of(e->Iex.Load.ty);
        if (items[2] == NULL) {
            Py_DECREF(items[1]);
            return NULL;
        }
        items[3] = canon_expr(e->Iex.Load.addr, t);
        if (items[3] == NULL) {
            Py_DECREF(items[1]);
            Py_DECREF(items[2]);
            return NULL;
        }
        Py_INCREF(S_ld);
        items[0] = S_ld;
        return tuple_steal(4, items);
    }
    case Iex_ITE: {
        Py_INCREF(S_ite);
        IRExpr *args[3] = {e->Iex.ITE.cond, e->Iex.ITE.iftrue, e->Iex.ITE.iffalse};
        return canon_args(S_ite, args, 3, t);
    }
    case Iex_CCall: {
        IRExpr **args = e->Iex.CCall.args;
        Py_ssize_t n = 0;
        while (args[n] != NULL)
            n++;
        PyObject *out = PyTuple_New(3 + n);
        if (out == NULL)
            return NULL;
        Py_INCREF(S_ccall);
        PyTuple_SET_ITEM(out, 0, S_ccall);
        PyObject *name = PyUnicode_FromString(e->Iex.CCall.cee->name);
        if (name == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, 1, name);
        PyObject *retty = name_of(e->Iex.CCall.retty);
        if (retty == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, 2, retty);
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *a = canon_expr(args[i], t);
            if (a == NULL) {
                Py_DECREF(out); /* the unset slots are NULL, which tuple deallocation skips */
                return NULL;
            }
            PyTuple_SET_ITEM(out, 3 + i, a);
        }
        return out;
    }
    default: {
        const char *cls = expr_class(e->tag);
        if (cls == NULL)
            return raise_value(Unsupported, "IRExpr tag %#x", e->tag);
        return raise_value(NotApplicable, "expression %s", cls);
    }
    }
}

/* Does ``e`` read a folded temporary anywhere below it (pyvex's ``child_expressions``)? */
static int reads_folded_below(const IRExpr *e, const Temps *t);

static int reads_folded(const IRExpr *e, const Temps *t) {
    if (e == NULL)
        return 0;
    if (e->tag == Iex_RdTmp) {
        IRTemp tmp = e->Iex.RdTmp.tmp;
        return (Py_ssize_t)tmp < t->ntemps && t->folded_at[tmp];
    }
    return reads_folded_below(e, t);
}

static int reads_folded_below(const IRExpr *e, const Temps *t) {
    switch (e->tag) {
    case Iex_Unop: return reads_folded(e->Iex.Unop.arg, t);
    case Iex_Binop: return reads_folded(e->Iex.Binop.arg1, t) || reads_folded(e->Iex.Binop.arg2, t);
    case Iex_Triop: {
        const IRTriop *d = e->Iex.Triop.details;
        return reads_folded(d->arg1, t) || reads_folded(d->arg2, t) || reads_folded(d->arg3, t);
    }
    case Iex_Qop: {
        const IRQop *d = e->Iex.Qop.details;
        return reads_folded(d->arg1, t) || reads_folded(d->arg2, t) || reads_folded(d->arg3, t) ||
               reads_folded(d->arg4, t);
    }
    case Iex_Load: return reads_folded(e->Iex.Load.addr, t);
    case Iex_ITE:
        return reads_folded(e->Iex.ITE.cond, t) || reads_folded(e->Iex.ITE.iftrue, t) ||
               reads_folded(e->Iex.ITE.iffalse, t);
    case Iex_GetI: return reads_folded(e->Iex.GetI.ix, t);
    case Iex_CCall:
        for (IRExpr **a = e->Iex.CCall.args; *a != NULL; a++)
            if (reads_folded(*a, t))
                return 1;
        return 0;
    default: return 0;
    }
}

static PyObject *jumpkind(IRJumpKind jk) {
    /* Call and Ret are hints to VEX's clients; as state transitions they are Boring (``canonical._jk``). */
    if (jk == Ijk_Boring || jk == Ijk_Call || jk == Ijk_Ret) {
        Py_INCREF(S_boring);
        return S_boring;
    }
    return name_of(jk);
}

/* -- _drop_dead, on the canonical tuples, exactly as canon_block's ------------------------------------ */

static int is_str(PyObject *o, PyObject *s) {
    return PyUnicode_Check(o) && PyUnicode_Compare(o, s) == 0;
}

static int uses(PyObject *node, PyObject *used) {
    if (!PyTuple_Check(node))
        return 0;
    Py_ssize_t n = PyTuple_GET_SIZE(node);
    if (n == 2 && is_str(PyTuple_GET_ITEM(node, 0), S_t) && PyLong_Check(PyTuple_GET_ITEM(node, 1)))
        return PySet_Add(used, PyTuple_GET_ITEM(node, 1));
    for (Py_ssize_t i = 0; i < n; i++)
        if (uses(PyTuple_GET_ITEM(node, i), used) < 0)
            return -1;
    return 0;
}

static int pure(PyObject *node) {
    if (!PyTuple_Check(node))
        return 1;
    Py_ssize_t n = PyTuple_GET_SIZE(node);
    if (n > 0 && is_str(PyTuple_GET_ITEM(node, 0), S_ld))
        return 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (!pure(PyTuple_GET_ITEM(node, i)))
            return 0;
    return 1;
}

/* stmts (a list) with the dead pure temp writes dropped; exits' positions moved to match. */
static PyObject *drop_dead(PyObject *stmts, PyObject *exits) {
    PyObject *used = PySet_New(NULL);
    if (used == NULL)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(stmts);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *st = PyList_GET_ITEM(stmts, i);
        Py_ssize_t len = PyTuple_GET_SIZE(st);
        if (is_str(PyTuple_GET_ITEM(st, 0), S_wr)) {
            if (uses(PyTuple_GET_ITEM(st, 2), used) < 0)
                goto fail;
        } else {
            /* _uses(st[1:]): a tuple of the rest, walked as one node */
            PyObject *rest = PyTuple_GetSlice(st, 1, len);
            if (rest == NULL)
                goto fail;
            int r = uses(rest, used);
            Py_DECREF(rest);
            if (r < 0)
                goto fail;
        }
    }
    PyObject *out = PyList_New(0);
    if (out == NULL)
        goto fail;
    Py_ssize_t e = 0, ne = PyList_GET_SIZE(exits);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *st = PyList_GET_ITEM(stmts, i);
        if (is_str(PyTuple_GET_ITEM(st, 0), S_wr)) {
            int present = PySet_Contains(used, PyTuple_GET_ITEM(st, 1));
            if (present < 0) {
                Py_DECREF(out);
                goto fail;
            }
            if (!present && pure(PyTuple_GET_ITEM(st, 2)))
                continue;
        }
        if (e < ne && PyLong_AsSsize_t(PyList_GET_ITEM(exits, e)) == i) {
            PyObject *pos = PyLong_FromSsize_t(PyList_GET_SIZE(out));
            if (pos == NULL) {
                Py_DECREF(out);
                goto fail;
            }
            PyList_SetItem(exits, e, pos);
            e++;
        }
        if (PyList_Append(out, st) < 0) {
            Py_DECREF(out);
            goto fail;
        }
    }
    Py_DECREF(used);
    return out;
fail:
    Py_DECREF(used);
    return NULL;
}

/* -- the lifter checks' facts: statements and expressions as pyvex's ``IRStmt.expressions`` yields them -- */

typedef struct {
    PyObject *ops;   /* set of operation names */
    int memory;      /* a Store, StoreG, CAS or LoadG statement, or a Load expression */
} Facts;

static int facts_expr(const IRExpr *e, Facts *f) {
    if (e == NULL)
        return 0;
    IRExpr *args[4];
    int n = 0, op = -1;
    switch (e->tag) {
    case Iex_Unop: op = e->Iex.Unop.op; args[n++] = e->Iex.Unop.arg; break;
    case Iex_Binop: op = e->Iex.Binop.op; args[n++] = e->Iex.Binop.arg1; args[n++] = e->Iex.Binop.arg2; break;
    case Iex_Triop:
        op = e->Iex.Triop.details->op;
        args[n++] = e->Iex.Triop.details->arg1;
        args[n++] = e->Iex.Triop.details->arg2;
        args[n++] = e->Iex.Triop.details->arg3;
        break;
    case Iex_Qop:
        op = e->Iex.Qop.details->op;
        args[n++] = e->Iex.Qop.details->arg1;
        args[n++] = e->Iex.Qop.details->arg2;
        args[n++] = e->Iex.Qop.details->arg3;
        args[n++] = e->Iex.Qop.details->arg4;
        break;
    case Iex_Load: f->memory = 1; args[n++] = e->Iex.Load.addr; break;
    case Iex_ITE: args[n++] = e->Iex.ITE.cond; args[n++] = e->Iex.ITE.iffalse; args[n++] = e->Iex.ITE.iftrue; break;
    case Iex_GetI: args[n++] = e->Iex.GetI.ix; break;
    case Iex_CCall:
        for (IRExpr **a = e->Iex.CCall.args; *a != NULL; a++)
            if (facts_expr(*a, f) < 0)
                return -1;
        return 0;
    default: return 0;
    }
    if (op >= 0) {
        PyObject *name = name_of(op);
        if (name == NULL)
            return -1;
        int r = PySet_Add(f->ops, name);
        Py_DECREF(name);
        if (r < 0)
            return -1;
    }
    for (int i = 0; i < n; i++)
        if (facts_expr(args[i], f) < 0)
            return -1;
    return 0;
}

static PyObject *put_type(const IRSB *bb, const IRExpr *data) {
    if (data->tag == Iex_RdTmp) {
        IRTemp tmp = data->Iex.RdTmp.tmp;
        if ((Py_ssize_t)tmp >= bb->tyenv->types_used)
            return raise_value(Unsupported, "temporary t%u outside the type environment", tmp);
        return name_of(bb->tyenv->types[tmp]);
    }
    if (data->tag == Iex_Const)
        return const_type(data->Iex.Const.con);
    return raise_value(Unsupported, "a Put of a non-atom");
}

/* (ops, memory, puts): the facts of the whole block */
static PyObject *block_facts(const IRSB *bb) {
    Facts f = {PySet_New(NULL), 0};
    PyObject *puts = PyList_New(0);
    if (f.ops == NULL || puts == NULL)
        goto fail;
    for (Int i = 0; i < bb->stmts_used; i++) {
        const IRStmt *st = bb->stmts[i];
        const IRExpr *roots[5] = {NULL, NULL, NULL, NULL, NULL};
        switch (st->tag) {
        case Ist_NoOp: case Ist_IMark: case Ist_MBE: break;
        case Ist_AbiHint: roots[0] = st->Ist.AbiHint.base; roots[1] = st->Ist.AbiHint.nia; break;
        case Ist_Put: {
            roots[0] = st->Ist.Put.data;
            PyObject *ty = put_type(bb, st->Ist.Put.data);
            if (ty == NULL)
                goto fail;
            PyObject *pair = Py_BuildValue("(iN)", st->Ist.Put.offset, ty);
            if (pair == NULL || PyList_Append(puts, pair) < 0) {
                Py_XDECREF(pair);
                goto fail;
            }
            Py_DECREF(pair);
            break;
        }
        case Ist_PutI: roots[0] = st->Ist.PutI.details->ix; roots[1] = st->Ist.PutI.details->data; break;
        case Ist_WrTmp: roots[0] = st->Ist.WrTmp.data; break;
        case Ist_Store: f.memory = 1; roots[0] = st->Ist.Store.addr; roots[1] = st->Ist.Store.data; break;
        case Ist_StoreG:
            f.memory = 1;
            roots[0] = st->Ist.StoreG.details->addr;
            roots[1] = st->Ist.StoreG.details->data;
            roots[2] = st->Ist.StoreG.details->guard;
            break;
        case Ist_LoadG:
            f.memory = 1;
            roots[0] = st->Ist.LoadG.details->addr;
            roots[1] = st->Ist.LoadG.details->alt;
            roots[2] = st->Ist.LoadG.details->guard;
            break;
        case Ist_CAS:
            f.memory = 1;
            roots[0] = st->Ist.CAS.details->addr;
            roots[1] = st->Ist.CAS.details->dataLo;
            roots[2] = st->Ist.CAS.details->dataHi;
            roots[3] = st->Ist.CAS.details->expdLo;
            roots[4] = st->Ist.CAS.details->expdHi;
            break;
        case Ist_LLSC: roots[0] = st->Ist.LLSC.addr; roots[1] = st->Ist.LLSC.storedata; break;
        case Ist_Dirty: roots[0] = st->Ist.Dirty.details->guard; roots[1] = st->Ist.Dirty.details->mAddr; break;
        case Ist_Exit: roots[0] = st->Ist.Exit.guard; break;
        default:
            raise_value(Unsupported, "IRStmt tag %#x", st->tag);
            goto fail;
        }
        for (int k = 0; k < 5; k++)
            if (facts_expr(roots[k], &f) < 0)
                goto fail;
    }
    return Py_BuildValue("(NON)", f.ops, f.memory ? Py_True : Py_False, puts);
fail:
    Py_XDECREF(f.ops);
    Py_XDECREF(puts);
    return NULL;
}

static int append_steal(PyObject *list, PyObject *item) {
    if (item == NULL)
        return -1;
    int r = PyList_Append(list, item);
    Py_DECREF(item);
    return r;
}

/* -- what pyvex would refuse to convert: any such block is left to pyvex whole ----------------------- */

static int known(int value) {
    PyObject *s = name_of(value);
    if (s == NULL)
        return -1;
    Py_DECREF(s);
    return 0;
}

static int check_const(const IRConst *c) {
    if (c == NULL || c->tag < Ico_U1 || c->tag > Ico_V256)
        return raise_value(Unsupported, "IRConst tag"), -1;
    return 0;
}

static int check_expr(const IRExpr *e) {
    if (e == NULL)
        return 0;
    switch (e->tag) {
    case Iex_Binder: case Iex_VECRET: case Iex_GSPTR: case Iex_RdTmp: return 0;
    case Iex_Get: return known(e->Iex.Get.ty);
    case Iex_GetI: return check_expr(e->Iex.GetI.ix) < 0 || known(e->Iex.GetI.descr->elemTy) < 0 ? -1 : 0;
    case Iex_Const: return check_const(e->Iex.Const.con);
    case Iex_Unop: return known(e->Iex.Unop.op) < 0 || check_expr(e->Iex.Unop.arg) < 0 ? -1 : 0;
    case Iex_Binop:
        return known(e->Iex.Binop.op) < 0 || check_expr(e->Iex.Binop.arg1) < 0 || check_expr(e->Iex.Binop.arg2) < 0
                   ? -1 : 0;
    case Iex_Triop: {
        const IRTriop *d = e->Iex.Triop.details;
        return known(d->op) < 0 || check_expr(d->arg1) < 0 || check_expr(d->arg2) < 0 || check_expr(d->arg3) < 0
                   ? -1 : 0;
    }
    case Iex_Qop: {
        const IRQop *d = e->Iex.Qop.details;
        return known(d->op) < 0 || check_expr(d->arg1) < 0 || check_expr(d->arg2) < 0 || check_expr(d->arg3) < 0 ||
                       check_expr(d->arg4) < 0 ? -1 : 0;
    }
    case Iex_Load:
        return known(e->Iex.Load.end) < 0 || known(e->Iex.Load.ty) < 0 || check_expr(e->Iex.Load.addr) < 0 ? -1 : 0;
    case Iex_ITE:
        return check_expr(e->Iex.ITE.cond) < 0 || check_expr(e->Iex.ITE.iftrue) < 0 ||
                       check_expr(e->Iex.ITE.iffalse) < 0 ? -1 : 0;
    case Iex_CCall:
        if (known(e->Iex.CCall.retty) < 0)
            return -1;
        for (IRExpr **a = e->Iex.CCall.args; *a != NULL; a++)
            if (check_expr(*a) < 0)
                return -1;
        return 0;
    default:
        raise_value(Unsupported, "IRExpr tag %#x", e->tag);
        return -1;
    }
}

/* Every tag and enum value of the block has a pyvex name (pyvex's conversion would not fail); the block's
   IMarks, as (address, length), appended to ``imarks``. */
static int check_block(const IRSB *bb, PyObject *imarks) {
    for (Int i = 0; i < bb->tyenv->types_used; i++)
        if (known(bb->tyenv->types[i]) < 0)
            return -1;
    if (known(bb->jumpkind) < 0 || check_expr(bb->next) < 0)
        return -1;
    for (Int i = 0; i < bb->stmts_used; i++) {
        const IRStmt *st = bb->stmts[i];
        int r = 0;
        switch (st->tag) {
        case Ist_NoOp: break;
        case Ist_IMark:
            r = append_steal(imarks, Py_BuildValue("(KI)", (unsigned long long)st->Ist.IMark.addr,
                                                   (unsigned)st->Ist.IMark.len)) < 0;
            break;
        case Ist_AbiHint: r = check_expr(st->Ist.AbiHint.base) < 0 || check_expr(st->Ist.AbiHint.nia) < 0; break;
        case Ist_Put: r = check_expr(st->Ist.Put.data) < 0; break;
        case Ist_PutI:
            r = known(st->Ist.PutI.details->descr->elemTy) < 0 || check_expr(st->Ist.PutI.details->ix) < 0 ||
                check_expr(st->Ist.PutI.details->data) < 0;
            break;
        case Ist_WrTmp: r = check_expr(st->Ist.WrTmp.data) < 0; break;
        case Ist_Store:
            r = known(st->Ist.Store.end) < 0 || check_expr(st->Ist.Store.addr) < 0 ||
                check_expr(st->Ist.Store.data) < 0;
            break;
        case Ist_StoreG: {
            const IRStoreG *d = st->Ist.StoreG.details;
            r = known(d->end) < 0 || check_expr(d->addr) < 0 || check_expr(d->data) < 0 || check_expr(d->guard) < 0;
            break;
        }
        case Ist_LoadG: {
            const IRLoadG *d = st->Ist.LoadG.details;
            r = known(d->end) < 0 || known(d->cvt) < 0 || check_expr(d->addr) < 0 || check_expr(d->alt) < 0 ||
                check_expr(d->guard) < 0;
            break;
        }
        case Ist_CAS: {
            const IRCAS *d = st->Ist.CAS.details;
            r = known(d->end) < 0 || check_expr(d->addr) < 0 || check_expr(d->dataLo) < 0 ||
                check_expr(d->dataHi) < 0 || check_expr(d->expdLo) < 0 || check_expr(d->expdHi) < 0;
            break;
        }
        case Ist_LLSC:
            r = known(st->Ist.LLSC.end) < 0 || check_expr(st->Ist.LLSC.addr) < 0 ||
                check_expr(st->Ist.LLSC.storedata) < 0;
            break;
        case Ist_Dirty: {
            const IRDirty *d = st->Ist.Dirty.details;
            r = check_expr(d->guard) < 0 || check_expr(d->mAddr) < 0 || known(d->mFx) < 0;
            for (int k = 0; !r && k < 20 && d->args[k] != NULL; k++)
                r = check_expr(d->args[k]) < 0;
            break;
        }
        case Ist_MBE: r = known(st->Ist.MBE.event) < 0; break;
        case Ist_Exit: r = check_const(st->Ist.Exit.dst) < 0 || known(st->Ist.Exit.jk) < 0 ||
                           check_expr(st->Ist.Exit.guard) < 0; break;
        default:
            raise_value(Unsupported, "IRStmt tag %#x", st->tag);
            return -1;
        }
        if (r)
            return -1;
    }
    return 0;
}

/* -- the walk ------------------------------------------------------------------------------------------ */

static int note_exit(PyObject *exits, PyObject *stmts) {
    PyObject *pos = PyLong_FromSsize_t(PyList_GET_SIZE(stmts));
    return append_steal(exits, pos);
}

/* One statement into ``out``.  Returns 0, or -1 with the Python error set. */
static int walk_stmt(const IRStmt *st, Temps *t, PyObject *constant, PyObject *out, PyObject *exits) {
    switch (st->tag) {
    case Ist_IMark: case Ist_NoOp: case Ist_AbiHint: return 0;
    case Ist_WrTmp: {
        const IRExpr *data = st->Ist.WrTmp.data;
        IRTemp tmp = st->Ist.WrTmp.tmp;
        if (constant != Py_None && data->tag == Iex_Load && data->Iex.Load.ty == Ity_I64 &&
            data->Iex.Load.addr->tag == Iex_Const) {
            PyObject *addr = const_value(data->Iex.Load.addr->Iex.Const.con);
            if (addr == NULL)
                return -1;
            PyObject *value = PyObject_CallOneArg(constant, addr);
            Py_DECREF(addr);
            if (value == NULL)
                return -1;
            if (value != Py_None) {
                if ((Py_ssize_t)tmp >= t->ntemps) {
                    Py_DECREF(value);
                    PyErr_Format(Unsupported, "temporary t%u outside the type environment", tmp);
                    return -1;
                }
                Py_XDECREF(t->folded[tmp]);
                t->folded[tmp] = value;
                t->folded_at[tmp] = 1;
                t->any_folded = 1;
                return 0;
            }
            Py_DECREF(value);
        }
        if (t->any_folded && reads_folded(data, t)) {
            raise_value(NotApplicable, "a folded jump qword used as data");
            return -1;
        }
        PyObject *c = canon_expr(data, t);
        if (c == NULL)
            return -1;
        Py_ssize_t n = define(t, tmp);
        if (n < 0) {
            Py_DECREF(c);
            return -1;
        }
        PyObject *num = PyLong_FromSsize_t(n);
        if (num == NULL) {
            Py_DECREF(c);
            return -1;
        }
        Py_INCREF(S_wr);
        PyObject *items[3] = {S_wr, num, c};
        return append_steal(out, tuple_steal(3, items));
    }
    case Ist_Put: {
        PyObject *c = canon_expr(st->Ist.Put.data, t);
        if (c == NULL)
            return -1;
        if (st->Ist.Put.offset == rip_offset) {
            Py_DECREF(c); /* still must not read rip */
            return 0;
        }
        PyObject *off = PyLong_FromLong(st->Ist.Put.offset);
        if (off == NULL) {
            Py_DECREF(c);
            return -1;
        }
        Py_INCREF(S_put);
        PyObject *items[3] = {S_put, off, c};
        return append_steal(out, tuple_steal(3, items));
    }
    case Ist_Store: {
        PyObject *items[4] = {NULL, NULL, NULL, NULL};
        items[1] = name_of(st->Ist.Store.end);
        if (items[1] == NULL || (items[2] = canon_expr(st->Ist.Store.addr, t)) == NULL ||
            (items[3] = canon_expr(st->Ist.Store.data, t)) == NULL) {
            Py_XDECREF(items[1]);
            Py_XDECREF(items[2]);
            return -1;
        }
        Py_INCREF(S_st);
        items[0] = S_st;
        return append_steal(out, tuple_steal(4, items));
    }
    case Ist_StoreG: {
        const IRStoreG *d = st->Ist.StoreG.details;
        PyObject *items[5] = {NULL, NULL, NULL, NULL, NULL};
        items[1] = name_of(d->end);
        if (items[1] == NULL || (items[2] = canon_expr(d->addr, t)) == NULL ||
            (items[3] = canon_expr(d->data, t)) == NULL || (items[4] = canon_expr(d->guard, t)) == NULL) {
            for (int k = 1; k < 4; k++)
                Py_XDECREF(items[k]);
            return -1;
        }
        Py_INCREF(S_stg);
        items[0] = S_stg;
        return append_steal(out, tuple_steal(5, items));
    }
    case Ist_LoadG: {
        const IRLoadG *d = st->Ist.LoadG.details;
        PyObject *items[7] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL};
        /* canon_block canonicalises the arguments before it defines dst */
        if ((items[4] = canon_expr(d->addr, t)) == NULL || (items[5] = canon_expr(d->alt, t)) == NULL ||
            (items[6] = canon_expr(d->guard, t)) == NULL)
            goto loadg_fail;
        if ((items[1] = name_of(d->end)) == NULL || (items[2] = name_of(d->cvt)) == NULL)
            goto loadg_fail;
        Py_ssize_t n = define(t, d->dst);
        if (n < 0 || (items[3] = PyLong_FromSsize_t(n)) == NULL)
            goto loadg_fail;
        Py_INCREF(S_ldg);
        items[0] = S_ldg;
        return append_steal(out, tuple_steal(7, items));
    loadg_fail:
        for (int k = 1; k < 7; k++)
            Py_XDECREF(items[k]);
        return -1;
    }
    case Ist_CAS: {
        const IRCAS *d = st->Ist.CAS.details;
        int two = d->dataHi != NULL;
        PyObject *items[9] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
        int head = two ? 4 : 3; /* (tag, end, old...) then the arguments */
        PyObject **args = items + head;
        if ((args[0] = canon_expr(d->addr, t)) == NULL || (args[1] = canon_expr(d->expdLo, t)) == NULL ||
            (args[2] = canon_expr(d->dataLo, t)) == NULL)
            goto cas_fail;
        if (two && ((args[3] = canon_expr(d->expdHi, t)) == NULL || (args[4] = canon_expr(d->dataHi, t)) == NULL))
            goto cas_fail;
        if ((items[1] = name_of(d->end)) == NULL)
            goto cas_fail;
        Py_ssize_t lo = define(t, d->oldLo);
        if (lo < 0 || (items[2] = PyLong_FromSsize_t(lo)) == NULL)
            goto cas_fail;
        if (two) {
            Py_ssize_t hi = define(t, d->oldHi);
            if (hi < 0 || (items[3] = PyLong_FromSsize_t(hi)) == NULL)
                goto cas_fail;
        }
        items[0] = two ? S_cas2 : S_cas;
        Py_INCREF(items[0]);
        return append_steal(out, tuple_steal(head + (two ? 5 : 3), items));
    cas_fail:
        for (int k = 1; k < 9; k++)
            Py_XDECREF(items[k]);
        return -1;
    }
    case Ist_MBE: {
        PyObject *ev = name_of(st->Ist.MBE.event);
        if (ev == NULL)
            return -1;
        Py_INCREF(S_mbe);
        PyObject *items[2] = {S_mbe, ev};
        return append_steal(out, tuple_steal(2, items));
    }
    case Ist_Exit: {
        PyObject *items[4] = {NULL, NULL, NULL, NULL};
        if ((items[1] = canon_expr(st->Ist.Exit.guard, t)) == NULL ||
            (items[2] = const_value(st->Ist.Exit.dst)) == NULL || (items[3] = jumpkind(st->Ist.Exit.jk)) == NULL) {
            Py_XDECREF(items[1]);
            Py_XDECREF(items[2]);
            return -1;
        }
        Py_INCREF(S_exit);
        items[0] = S_exit;
        if (note_exit(exits, out) < 0) {
            for (int k = 0; k < 4; k++)
                Py_DECREF(items[k]);
            return -1;
        }
        return append_steal(out, tuple_steal(4, items));
    }
    case Ist_Dirty:
        raise_value(Gap, "VEX models this instruction as the dirty helper %s, outside the IR",
                    st->Ist.Dirty.details->cee->name);
        return -1;
    case Ist_PutI:
        raise_value(NotApplicable, "statement PutI");
        return -1;
    case Ist_LLSC:
        raise_value(NotApplicable, "statement LLSC");
        return -1;
    default:
        raise_value(Unsupported, "IRStmt tag %#x", st->tag);
        return -1;
    }
}

static PyObject *walk_end(const IRSB *bb, Temps *t, PyObject *out, PyObject *exits) {
    const IRExpr *nxt = bb->next;
    PyObject *jk = jumpkind(bb->jumpkind);
    if (jk == NULL)
        return NULL;
    PyObject *items[3];
    if (nxt->tag == Iex_Const) {
        items[1] = const_value(nxt->Iex.Const.con);
        items[0] = S_exit;
    } else if (nxt->tag == Iex_RdTmp && (Py_ssize_t)nxt->Iex.RdTmp.tmp < t->ntemps &&
               t->folded_at[nxt->Iex.RdTmp.tmp]) {
        items[1] = t->folded[nxt->Iex.RdTmp.tmp];
        Py_INCREF(items[1]);
        items[0] = S_exit;
    } else {
        items[1] = canon_expr(nxt, t);
        items[0] = S_next;
    }
    if (items[1] == NULL) {
        Py_DECREF(jk);
        return NULL;
    }
    if (items[0] == S_exit && note_exit(exits, out) < 0) {
        Py_DECREF(items[1]);
        Py_DECREF(jk);
        return NULL;
    }
    Py_INCREF(items[0]);
    items[2] = jk;
    return tuple_steal(3, items);
}

static PyObject *walk(PyObject *self, PyObject *args) {
    unsigned long long address;
    PyObject *constant;
    int want_facts;
    if (!PyArg_ParseTuple(args, "KOp", &address, &constant, &want_facts))
        return NULL;
    if (enum_dict == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "relocverify.proof.irsb_walk.setup() was not called");
        return NULL;
    }
    const IRSB *bb = (const IRSB *)(uintptr_t)address;
    if (bb->jumpkind == Ijk_NoDecode)
        Py_RETURN_NONE; /* pyvex.lift tries its other lifters on such a block: the caller lifts through pyvex */
    Temps t;
    t.ntemps = bb->tyenv->types_used;
    t.defined = 0;
    t.any_folded = 0;
    t.canon = PyMem_Malloc(sizeof(Py_ssize_t) * (t.ntemps + 1));
    t.folded = PyMem_Calloc(t.ntemps + 1, sizeof(PyObject *));
    t.folded_at = PyMem_Calloc(t.ntemps + 1, 1);
    PyObject *out = PyList_New(0), *exits = PyList_New(0), *imarks = PyList_New(0), *result = NULL, *facts = NULL;
    if (t.canon == NULL || t.folded == NULL || t.folded_at == NULL || out == NULL || exits == NULL || imarks == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < t.ntemps; i++)
        t.canon[i] = -1;
    if (check_block(bb, imarks) < 0)
        goto done;
    if (want_facts) {
        facts = block_facts(bb);
        if (facts == NULL)
            goto done; /* Unsupported or an error: nothing is returned */
    } else {
        facts = Py_None;
        Py_INCREF(facts);
    }
    PyObject *error = NULL;
    for (Int i = 0; i < bb->stmts_used; i++) {
        if (walk_stmt(bb->stmts[i], &t, constant, out, exits) < 0)
            goto failed;
    }
    PyObject *end = walk_end(bb, &t, out, exits);
    if (end == NULL)
        goto failed;
    if (append_steal(out, end) < 0)
        goto done;
    PyObject *kept = drop_dead(out, exits);
    if (kept == NULL)
        goto done;
    result = Py_BuildValue("(NOONO)", kept, exits, Py_None, facts, imarks);
    facts = NULL;
    goto done;
failed:
    if (PyErr_ExceptionMatches(Unsupported) || !(PyErr_ExceptionMatches(NotApplicable) ||
                                                 PyErr_ExceptionMatches(Gap) ||
                                                 PyErr_ExceptionMatches(PyExc_KeyError)))
        goto done; /* the caller lifts through pyvex (Unsupported) or sees the error itself */
    {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        Py_XDECREF(type);
        Py_XDECREF(tb);
        error = value;
        result = Py_BuildValue("(OONNO)", out, exits, error, facts, imarks);
        facts = NULL;
    }
done:
    if (t.folded != NULL)
        for (Py_ssize_t i = 0; i < t.ntemps; i++)
            Py_XDECREF(t.folded[i]);
    PyMem_Free(t.canon);
    PyMem_Free(t.folded);
    PyMem_Free(t.folded_at);
    Py_XDECREF(out);
    Py_XDECREF(exits);
    Py_XDECREF(imarks);
    Py_XDECREF(facts);
    if (result == NULL && PyErr_ExceptionMatches(Unsupported)) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return result;
}

static PyObject *intern(const char *s) {
    PyObject *o = PyUnicode_InternFromString(s);
    return o;
}

static PyObject *setup(PyObject *self, PyObject *args) {
    PyObject *names, *na, *gap;
    int rip;
    if (!PyArg_ParseTuple(args, "O!iOO", &PyDict_Type, &names, &rip, &na, &gap))
        return NULL;
    Py_XSETREF(enum_dict, Py_NewRef(names));
    Py_XSETREF(NotApplicable, Py_NewRef(na));
    Py_XSETREF(Gap, Py_NewRef(gap));
    rip_offset = rip;
    for (int v = ENUM_BASE; v < ENUM_LIMIT; v++) {
        PyObject *key = PyLong_FromLong(v);
        if (key == NULL)
            return NULL;
        PyObject *s = PyDict_GetItemWithError(names, key);
        Py_DECREF(key);
        if (s == NULL && PyErr_Occurred())
            return NULL;
        if (s != NULL && !PyUnicode_Check(s)) {
            PyErr_SetString(PyExc_TypeError, "enum names must be strings");
            return NULL;
        }
        if (s != NULL) {
            Py_INCREF(s);
            PyUnicode_InternInPlace(&s);
        }
        Py_XSETREF(enum_name[v - ENUM_BASE], s);
    }
    static const char *ity[] = {"Ity_I1", "Ity_I8", "Ity_I16", "Ity_I32", "Ity_I64", "Ity_F32", "Ity_F32",
                                "Ity_F64", "Ity_F64", "Ity_V128", "Ity_V256"};
    for (int k = 0; k < 11; k++)
        Py_XSETREF(S_ity[k], intern(ity[k]));
    struct { PyObject **slot; const char *text; } words[] = {
        {&S_t, "t"}, {&S_c, "c"}, {&S_get, "get"}, {&S_ld, "ld"}, {&S_ite, "ite"}, {&S_ccall, "ccall"},
        {&S_wr, "wr"}, {&S_put, "put"}, {&S_st, "st"}, {&S_stg, "stg"}, {&S_ldg, "ldg"}, {&S_cas, "cas"},
        {&S_cas2, "cas2"}, {&S_mbe, "mbe"}, {&S_exit, "exit"}, {&S_next, "next"}, {&S_boring, "Ijk_Boring"}};
    for (size_t k = 0; k < sizeof words / sizeof words[0]; k++) {
        Py_XSETREF(*words[k].slot, intern(words[k].text));
        if (*words[k].slot == NULL)
            return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS,
     "setup(enum names by value, rip's guest offset, NotApplicable, Gap): the tables the walk names things by"},
    {"walk", walk, METH_VARARGS,
     "walk(irsb address, constant or None, facts?) -> (statements, exit positions, error or None, facts or None,"
     " IMarks), or None for a block only pyvex can read"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "irsb_walk",
                                    "A VEX IRSB read in canon_block's canonical form, natively.", -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_irsb_walk(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Unsupported = PyErr_NewException("relocverify.proof.irsb_walk.Unsupported", NULL, NULL);
#ifndef RV_SOURCE_SHA256
#define RV_SOURCE_SHA256 "unknown"
#endif
    if (Unsupported == NULL || PyModule_AddObjectRef(m, "Unsupported", Unsupported) < 0 ||
        PyModule_AddStringConstant(m, "SOURCE_SHA256", RV_SOURCE_SHA256) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
