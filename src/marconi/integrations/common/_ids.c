/* Token ids as native int32 bytes: the compiled twin of prefix_delta.int32_bytes_python.
 *
 * An engine hands the adaptive shadow a finished request's ids as a Python list; the shadow needs
 * them as int32 (an array in process, bytes on the replay process's wire). struct.pack does it at
 * ~5.6 ns an id (25 us for the 4,400 new ids of a bench request, on the scheduler thread); this loop
 * at ~1.5 ns. Same bytes, same exceptions (types and messages) as the Python specification:
 * tests/test_int32_bytes.py holds the two to each other.
 *
 * int32_bytes(seq) -> bytes, for a list or tuple:
 *   TypeError  "token ids must be a list or tuple, got <type>" for another container;
 *   TypeError  "token id <repr> at <i> is not an integer" (neither int nor __index__);
 *   OverflowError "token id <value> at <i> is outside int32".
 * Negative ids pass (the reader's check refuses them, naming the id), as struct's 'i' does.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static int out_of_range(PyObject *value, Py_ssize_t at) {
    PyErr_Format(PyExc_OverflowError, "token id %S at %zd is outside int32", value, at);
    return -1;
}

static int fill(PyObject *seq, int32_t *out, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PySequence_Fast_GET_SIZE(seq) != n) {     /* an __index__ below changed the list */
            PyErr_SetString(PyExc_RuntimeError, "token ids changed size while being packed");
            return -1;
        }
        PyObject *x = PySequence_Fast_GET_ITEM(seq, i);
        int overflow = 0;
        long v;
        if (PyLong_CheckExact(x)) {                    /* no Python code runs: the list cannot change */
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
        out[i] = (int32_t)v;
    }
    return 0;
}

static PyObject *int32_bytes(PyObject *Py_UNUSED(module), PyObject *seq) {
    if (!PyList_Check(seq) && !PyTuple_Check(seq)) {
        PyObject *name = PyType_GetName(Py_TYPE(seq));      /* the short name, as type(x).__name__ */
        if (name) {
            PyErr_Format(PyExc_TypeError, "token ids must be a list or tuple, got %U", name);
            Py_DECREF(name);
        }
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *b = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int32_t));
    if (!b) return NULL;
    if (fill(seq, (int32_t *)PyBytes_AS_STRING(b), n) < 0) { Py_DECREF(b); return NULL; }
    return b;
}

static PyMethodDef methods[] = {
    {"int32_bytes", int32_bytes, METH_O, "Token ids (a list or tuple) as native int32 bytes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ids", "Token ids as int32 bytes.", -1, methods};

PyMODINIT_FUNC PyInit__ids(void) { return PyModule_Create(&module); }
