/* streamnb/_buffers.h: taking and releasing several buffer arguments at once, for the
 * optional C modules (streamnb/_kernels.c, streamnb/features/_speedups.c). Include after
 * Python.h. */
#ifndef STREAMNB_BUFFERS_H
#define STREAMNB_BUFFERS_H

/* Buffers of args[which[i]] into views[i], i < n (C-contiguous; writable where
 * writable[i]); -1 with an exception set, and none held, if one cannot be had. */
static int
get_buffers(PyObject *const *args, int n, const int *which, const int *writable, Py_buffer *views)
{
    for (int i = 0; i < n; i++) {
        int flags = PyBUF_C_CONTIGUOUS | (writable[i] ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(args[which[i]], &views[i], flags) < 0) {
            while (i-- > 0) {
                PyBuffer_Release(&views[i]);
            }
            return -1;
        }
    }
    return 0;
}

static void
release_buffers(int n, Py_buffer *views)
{
    for (int i = 0; i < n; i++) {
        PyBuffer_Release(&views[i]);
    }
}

#endif
