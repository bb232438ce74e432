/* Buffers the engine's extensions (row_pack.c, jump_walk.c) read their arguments through: ``get`` takes one
   (a bytes object or an array) and checks it holds whole items of ``itemsize`` bytes; ``release`` gives back
   those taken, once each.  Included after <Python.h>; part of each including extension's source digest
   (``extensions.build_digest``). */

#ifndef RELOCVERIFY_BUFFERS_H
#define RELOCVERIFY_BUFFERS_H

typedef struct {
    Py_buffer b;
    int held;
} Buf;

static int get(PyObject *o, Buf *buf, Py_ssize_t itemsize, const char *what) {
    if (PyObject_GetBuffer(o, &buf->b, PyBUF_SIMPLE) < 0)
        return -1;
    buf->held = 1;
    if (buf->b.len % itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes is not a whole number of %zd-byte items", what, buf->b.len,
                     itemsize);
        return -1;
    }
    return 0;
}

static void release(Buf *bufs, int n) {
    for (int i = 0; i < n; i++)
        if (bufs[i].held)
            PyBuffer_Release(&bufs[i].b);
}

#endif
