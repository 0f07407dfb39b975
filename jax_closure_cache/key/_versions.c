/* A dict's version tag, for the generated matchers' global checks.

A generated matcher (key/matchers.py) compares every global a walked
function of a library reads with the object the key holds: about forty
dict lookups on the hit of ``jax.jit(jax.grad(loss))``. CPython tags each
dict with a version that changes on every change to it (PEP 509:
``ma_version_tag``, taken from a counter of the interpreter's, so a value
is never seen on two states of one dict). Where the checks of one dict passed at a version,
they pass again while the dict still has it, and the matcher skips them.

``version(d)`` returns the tag of the dict ``d`` as an int;
``namespace_version(t)`` that of a run-time class's namespace dict (for
``key/code_plan.library_class``, whose answer holds while it is unchanged).
The module is
built only where the field exists (CPython 3.11 to 3.13); the Python side
checks at import that the tag moves when a value is replaced, and
otherwise makes every check every time (``key/versions.py``).
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if PY_VERSION_HEX >= 0x030E0000 || defined(Py_GIL_DISABLED)
#error "no dict version tag on this CPython: the extension is optional"
#endif

#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif

static PyObject *version(PyObject *module, PyObject *d) {
  if (!PyDict_CheckExact(d)) {
    PyErr_SetString(PyExc_TypeError, "version: a dict expected");
    return NULL;
  }
  return PyLong_FromUnsignedLongLong(((PyDictObject *)d)->ma_version_tag);
}

static PyObject *namespace_version(PyObject *module, PyObject *t) {
  /* A class made at run time keeps its namespace in a dict of its own
     (tp_dict), which setting or deleting a class attribute changes. */
  if (!PyType_Check(t) ||
      !(((PyTypeObject *)t)->tp_flags & Py_TPFLAGS_HEAPTYPE)) {
    PyErr_SetString(PyExc_TypeError,
                    "namespace_version: a class made at run time expected");
    return NULL;
  }
  PyObject *d = ((PyTypeObject *)t)->tp_dict;
  if (d == NULL || !PyDict_CheckExact(d)) {
    PyErr_SetString(PyExc_TypeError, "namespace_version: no namespace dict");
    return NULL;
  }
  return PyLong_FromUnsignedLongLong(((PyDictObject *)d)->ma_version_tag);
}

static PyMethodDef versions_methods[] = {
    {"version", version, METH_O,
     "version(d): the version tag of dict d, which changes with every "
     "change to d."},
    {"namespace_version", namespace_version, METH_O,
     "namespace_version(t): the version tag of the namespace dict of t, a "
     "class made at run time, which changes with every change to it."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef versions_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "jax_closure_cache.key._versions",
    .m_doc = "Dict version tags for the generated matchers.",
    .m_size = 0,
    .m_methods = versions_methods};

PyMODINIT_FUNC PyInit__versions(void) { return PyModuleDef_Init(&versions_module); }
