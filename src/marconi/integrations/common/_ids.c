/* Token ids as native int32 bytes: the compiled twin of prefix_delta.int32_bytes_python.
 *
 * An engine hands the adaptive shadow a finished request's ids as a Python list; the shadow needs
 * them as int32 (an array in process, bytes on the replay process's wire). struct.pack does it at
 * ~5.6 ns an id (25 us for the 4,400 new ids of a bench request, on the scheduler thread); this loop
 * at ~1.5 ns. Same bytes, same exceptions (types and messages) as the Python specification:
 * tests/test_int32_bytes.py holds the two to each other.
 *
 * int32_bytes(seq, start=0) -> bytes of seq[start:], for a list or tuple (``start`` spares the caller
 * a slice: copying a list's tail touches every id object once more, ~4 ns an id once they are out of
 * the CPU's caches, as a finished request's are):
 *   TypeError  "token ids must be a list or tuple, got <type>" for another container;
 *   TypeError  "token id <repr> at <i> is not an integer" (neither int nor __index__; i indexes seq);
 *   OverflowError "token id <value> at <i> is outside int32";
 *   ValueError "start must be >= 0, got <start>" (a start past the end gives b"", as a slice).
 * Negative ids pass (the reader's check refuses them, naming the id), as struct's 'i' does.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static int out_of_range(PyObject *value, Py_ssize_t at) {
    PyErr_Format(PyExc_OverflowError, "token id %S at %zd is outside int32", value, at);
    return -1;
}

/* An exact int of at most one digit (|x| < 2**PyLong_SHIFT, 2**30 or 2**15: within int32) read in place:
 * 1 with *v set, else 0 (then the general path). PyLong_AsLongAndOverflow's call and digit loop
 * were half of the ~40 instructions an id cost (callgrind, the overhead bench's adaptive run). */
static inline int compact_value(PyObject *x, long *v) {
#if PY_VERSION_HEX >= 0x030C0000
    if (!PyUnstable_Long_IsCompact((PyLongObject *)x)) return 0;
    Py_ssize_t c = PyUnstable_Long_CompactValue((PyLongObject *)x);
    if (c < INT32_MIN || c > INT32_MAX) return 0;     /* the general path names it */
    *v = (long)c;
    return 1;
#else
    Py_ssize_t size = Py_SIZE(x);
    if (size < -1 || size > 1) return 0;
    *v = size == 0 ? 0 : size * (long)((PyLongObject *)x)->ob_digit[0];
    return 1;
#endif
}

static int fill(PyObject *seq, int32_t *out, Py_ssize_t start, Py_ssize_t n) {
    for (Py_ssize_t i = start; i < n; i++) {
        if (PySequence_Fast_GET_SIZE(seq) != n) {     /* an __index__ below changed the list */
            PyErr_SetString(PyExc_RuntimeError, "token ids changed size while being packed");
            return -1;
        }
        PyObject *x = PySequence_Fast_GET_ITEM(seq, i);
        int overflow = 0;
        long v;
        if (PyLong_CheckExact(x)) {                    /* no Python code runs: the list cannot change */
            if (compact_value(x, &v)) {                /* one digit: every id under 2**30 */
                out[i - start] = (int32_t)v;
                continue;
            }
            v = PyLong_AsLongAndOverflow(x, &overflow);
            if (overflow || v < INT32_MIN || v > INT32_MAX) return out_of_range(x, i);
        } else {
            Py_INCREF(x);                              /* its __index__ may drop the list's reference */
            PyObject *ix = PyNumber_Index(x);          /* bool, numpy integers: what struct's 'i' takes */
            if (!ix) {
                if (PyErr_ExceptionMatches(PyExc_TypeError)) {
                    PyErr_Clear();
                    PyErr_Format(PyExc_TypeError, "token id %R at %zd is not an integer", x, i);
                }
                Py_DECREF(x);
                return -1;
            }
            Py_DECREF(x);
            v = PyLong_AsLongAndOverflow(ix, &overflow);
            if (overflow || v < INT32_MIN || v > INT32_MAX) {
                out_of_range(ix, i);
                Py_DECREF(ix);
                return -1;
            }
            Py_DECREF(ix);
        }
        out[i - start] = (int32_t)v;
    }
    return 0;
}

static PyObject *int32_bytes(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError, "int32_bytes() takes 1 or 2 arguments (seq, start=0), got %zd", nargs);
        return NULL;
    }
    PyObject *seq = args[0];
    Py_ssize_t start = 0;
    if (nargs == 2) {
        start = PyNumber_AsSsize_t(args[1], PyExc_OverflowError);
        if (start == -1 && PyErr_Occurred()) return NULL;
        if (start < 0) {
            PyErr_Format(PyExc_ValueError, "start must be >= 0, got %zd", start);
            return NULL;
        }
    }
    if (!PyList_Check(seq) && !PyTuple_Check(seq)) {
        PyObject *name = PyType_GetName(Py_TYPE(seq));      /* the short name, as type(x).__name__ */
        if (name) {
            PyErr_Format(PyExc_TypeError, "token ids must be a list or tuple, got %U", name);
            Py_DECREF(name);
        }
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (start > n) start = n;
    PyObject *b = PyBytes_FromStringAndSize(NULL, (n - start) * (Py_ssize_t)sizeof(int32_t));
    if (!b) return NULL;
    if (fill(seq, (int32_t *)PyBytes_AS_STRING(b), start, n) < 0) { Py_DECREF(b); return NULL; }
    return b;
}

static PyMethodDef methods[] = {
    {"int32_bytes", (PyCFunction)(void (*)(void))int32_bytes, METH_FASTCALL,
     "int32_bytes(seq, start=0): token ids seq[start:] (a list or tuple) as native int32 bytes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ids", "Token ids as int32 bytes.", -1, methods};

PyMODINIT_FUNC PyInit__ids(void) { return PyModule_Create(&module); }
