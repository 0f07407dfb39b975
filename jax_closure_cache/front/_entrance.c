/* The fast front's entrance: ``jit(fun)`` for a re-created closure, in C.

Layer three of the design (front/generated.py) makes a re-created closure's hit
one generated Python frame: the wrapper's ``__call__``. What is left above the
hand-hoisted call is making that wrapper, and the Python frame of ``jit``
itself did most of that. This module removes that frame and nothing else.

``Entrance(slow, fronts, base, fun_slot, stock_slot, row_slot, partial)`` is
a callable. Called with one positional argument ``fun`` and no keywords, where
``type(fun) is FunctionType``, ``fun.__closure__`` is non-empty and
``fronts`` (a dict: code object -> class) has a class for ``fun.__code__``
whose base is ``base``, it returns a new instance of that class with the
three slots set to ``fun``, None and None. Where ``partial`` is not None
(``functools.partial``), the same holds for ``fun`` of exactly that type
whose ``func`` is exactly a ``FunctionType`` (with or without a closure),
looked up by ``fun.func.__code__``. That is exactly what the Python
``jit`` does on that path (``wrapper.fill(object.__new__(cls), fun)``, the
one Python routine that sets a wrapper's slots). Any other call is
``slow(*args, **kwargs)``.

Invariants:

* The instance is made as ``object.__new__(cls)`` makes it (``tp_alloc``,
  then the three slots), so a class defining ``__new__`` or ``__init__`` is
  never given here: the Python side only files ``ClosureJitted``'s generated
  subclasses, and the base check stops anything else.
* The slot offsets are read from ``base``'s own member descriptors, so they
  cannot disagree with the class layout.
* It holds ``slow``, ``fronts``, ``base`` and ``partial`` strongly and
  nothing else; it
  has an instance dict for the attributes ``functools.update_wrapper``
  copies (``__doc__``, ``__wrapped__``, ...), so ``inspect.signature`` and
  ``help`` see the Python ``jit``.
*/

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

typedef struct {
  PyObject_HEAD
  PyObject *slow;
  PyObject *fronts;
  PyTypeObject *base;
  PyObject *partial;   /* functools.partial, or NULL */
  Py_ssize_t fun_offset, stock_offset, row_offset;
  PyObject *dict;
  vectorcallfunc vectorcall;
} Entrance;

static Py_ssize_t slot_offset(PyObject *descr, const char *what) {
  if (!Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
    PyErr_Format(PyExc_TypeError, "%s: a slot's member descriptor expected",
                 what);
    return -1;
  }
  PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
  if (m->type != T_OBJECT_EX || (m->flags & READONLY)) {
    PyErr_Format(PyExc_TypeError, "%s: a writable object slot expected", what);
    return -1;
  }
  return m->offset;
}

static PyObject *entrance_vectorcall(PyObject *op, PyObject *const *args,
                                     size_t nargsf, PyObject *kwnames) {
  Entrance *self = (Entrance *)op;
  if (PyVectorcall_NARGS(nargsf) == 1 &&
      (kwnames == NULL || PyTuple_GET_SIZE(kwnames) == 0)) {
    PyObject *fun = args[0];
    PyObject *code = NULL;   /* a new reference */
    if (Py_IS_TYPE(fun, &PyFunction_Type)) {
      PyObject *closure = PyFunction_GET_CLOSURE(fun);
      if (closure != NULL && PyTuple_Check(closure) &&
          PyTuple_GET_SIZE(closure) > 0)
        code = Py_NewRef(PyFunction_GET_CODE(fun));
    } else if (self->partial != NULL &&
               (PyObject *)Py_TYPE(fun) == self->partial) {
      PyObject *func = PyObject_GetAttrString(fun, "func");
      if (func == NULL)
        return NULL;
      if (Py_IS_TYPE(func, &PyFunction_Type))
        code = Py_NewRef(PyFunction_GET_CODE(func));
      Py_DECREF(func);
    }
    {
      if (code != NULL) {
        PyObject *cls = PyDict_GetItemWithError(self->fronts, code);
        Py_DECREF(code);
        if (cls == NULL && PyErr_Occurred())
          return NULL;
        if (cls != NULL && PyType_Check(cls) &&
            ((PyTypeObject *)cls)->tp_base == self->base) {
          PyTypeObject *tp = (PyTypeObject *)cls;
          /* the dict's reference is borrowed, and allocating may collect
             garbage, whose callbacks may clear the dict */
          Py_INCREF(tp);
          PyObject *w = tp->tp_alloc(tp, 0);
          Py_DECREF(tp);
          if (w == NULL)
            return NULL;
          char *p = (char *)w;
          Py_INCREF(fun);
          *(PyObject **)(p + self->fun_offset) = fun;
          Py_INCREF(Py_None);
          *(PyObject **)(p + self->stock_offset) = Py_None;
          Py_INCREF(Py_None);
          *(PyObject **)(p + self->row_offset) = Py_None;
          return w;
        }
      }
    }
  }
  return PyObject_Vectorcall(self->slow, args, nargsf, kwnames);
}

static PyObject *entrance_new(PyTypeObject *type, PyObject *args,
                              PyObject *kwds) {
  PyObject *slow, *fronts, *base, *fun_d, *stock_d, *row_d;
  PyObject *partial = Py_None;
  if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
    PyErr_SetString(PyExc_TypeError, "Entrance() takes no keyword arguments");
    return NULL;
  }
  if (!PyArg_ParseTuple(args, "OO!O!OOO|O:Entrance", &slow, &PyDict_Type,
                        &fronts, &PyType_Type, &base, &fun_d, &stock_d,
                        &row_d, &partial))
    return NULL;
  if (partial != Py_None && !PyType_Check(partial)) {
    PyErr_SetString(PyExc_TypeError, "Entrance: partial must be a type");
    return NULL;
  }
  if (!PyCallable_Check(slow)) {
    PyErr_SetString(PyExc_TypeError, "Entrance: slow must be callable");
    return NULL;
  }
  Py_ssize_t fo = slot_offset(fun_d, "fun_slot");
  Py_ssize_t so = fo < 0 ? -1 : slot_offset(stock_d, "stock_slot");
  Py_ssize_t ro = so < 0 ? -1 : slot_offset(row_d, "row_slot");
  if (ro < 0)
    return NULL;
  Entrance *self = (Entrance *)type->tp_alloc(type, 0);
  if (self == NULL)
    return NULL;
  self->slow = Py_NewRef(slow);
  self->fronts = Py_NewRef(fronts);
  self->base = (PyTypeObject *)Py_NewRef(base);
  self->partial = partial == Py_None ? NULL : Py_NewRef(partial);
  self->fun_offset = fo;
  self->stock_offset = so;
  self->row_offset = ro;
  self->vectorcall = entrance_vectorcall;
  return (PyObject *)self;
}

static int entrance_traverse(Entrance *self, visitproc visit, void *arg) {
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(self->slow);
  Py_VISIT(self->fronts);
  Py_VISIT(self->base);
  Py_VISIT(self->partial);
  Py_VISIT(self->dict);
  return 0;
}

static int entrance_clear(Entrance *self) {
  Py_CLEAR(self->slow);
  Py_CLEAR(self->fronts);
  Py_CLEAR(self->base);
  Py_CLEAR(self->partial);
  Py_CLEAR(self->dict);
  return 0;
}

static void entrance_dealloc(Entrance *self) {
  PyTypeObject *tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  entrance_clear(self);
  tp->tp_free((PyObject *)self);
  Py_DECREF(tp);
}

static PyObject *entrance_call(PyObject *self, PyObject *args,
                               PyObject *kwargs) {
  /* tp_call for callers that do not use vectorcall */
  return PyVectorcall_Call(self, args, kwargs);
}

static PyObject *entrance_descr_get(PyObject *self, PyObject *obj,
                                    PyObject *type) {
  /* bound as a method when stored on a class, as a Python function is */
  if (obj == NULL || obj == Py_None)
    return Py_NewRef(self);
  return PyMethod_New(self, obj);
}

static PyObject *entrance_get_slow(Entrance *self, void *closure) {
  return Py_NewRef(self->slow);
}

static PyObject *entrance_repr(PyObject *self) {
  /* it stands for the Python ``jit``: shown as that function */
  return PyObject_Repr(((Entrance *)self)->slow);
}

static PyObject *entrance_reduce(PyObject *self, PyObject *unused) {
  /* pickled by reference, as the function it stands for */
  return PyObject_GetAttrString(self, "__qualname__");
}

static PyMethodDef entrance_methods[] = {
    {"__reduce__", entrance_reduce, METH_NOARGS, NULL}, {NULL}};

static PyGetSetDef entrance_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {"slow", (getter)entrance_get_slow, NULL,
     "the Python callable every other call goes to", NULL},
    {NULL}};

static PyMemberDef entrance_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(Entrance, vectorcall),
     READONLY},
    {"__dictoffset__", T_PYSSIZET, offsetof(Entrance, dict), READONLY},
    {NULL}};

static PyType_Slot entrance_slots[] = {
    {Py_tp_new, entrance_new},
    {Py_tp_dealloc, entrance_dealloc},
    {Py_tp_traverse, entrance_traverse},
    {Py_tp_clear, entrance_clear},
    {Py_tp_call, entrance_call},
    {Py_tp_descr_get, entrance_descr_get},
    {Py_tp_getset, entrance_getset},
    {Py_tp_methods, entrance_methods},
    {Py_tp_repr, entrance_repr},
    {Py_tp_members, entrance_members},
    {Py_tp_doc, "jit's entrance for re-created closures (see the module)"},
    {0, NULL}};

static PyType_Spec entrance_spec = {
    .name = "jax_closure_cache.front._entrance.Entrance",
    .basicsize = sizeof(Entrance),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC |
             Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .slots = entrance_slots};

static int front_exec(PyObject *module) {
  PyObject *type = PyType_FromModuleAndSpec(module, &entrance_spec, NULL);
  if (type == NULL)
    return -1;
  int rc = PyModule_AddObjectRef(module, "Entrance", type);
  Py_DECREF(type);
  return rc;
}

/* ``leaves_known(leaves, masks, answers)``: lowering/structure.py's
``leaves_known`` (its docstring says what it answers), the same loop
without a Python frame per leaf. An entry of ``answers`` not shaped as that
table keeps them (``id -> (weak reference, (bits, reason))``) answers
False, which sends the caller to its full check. */
static PyObject *leaves_known(PyObject *module, PyObject *const *args,
                              Py_ssize_t nargs) {
  if (nargs != 3 || !PyDict_Check(args[2])) {
    PyErr_SetString(PyExc_TypeError,
                    "leaves_known(leaves, masks, answers: dict)");
    return NULL;
  }
  PyObject *leaves = PySequence_Fast(args[0], "leaves: a sequence");
  if (leaves == NULL)
    return NULL;
  PyObject *masks = PySequence_Fast(args[1], "masks: a sequence");
  if (masks == NULL) {
    Py_DECREF(leaves);
    return NULL;
  }
  Py_ssize_t n = PySequence_Fast_GET_SIZE(leaves);
  int known_all = n == PySequence_Fast_GET_SIZE(masks);
  int failed = 0;
  for (Py_ssize_t i = 0; known_all && i < n; i++) {
    PyObject *c = PySequence_Fast_GET_ITEM(leaves, i);
    PyObject *key = PyLong_FromVoidPtr(c);   /* id(c) */
    if (key == NULL) {
      failed = 1;
      break;
    }
    PyObject *known = PyDict_GetItemWithError(args[2], key);
    Py_DECREF(key);
    if (known == NULL) {
      failed = PyErr_Occurred() != NULL;
      known_all = 0;
      break;
    }
    if (!PyTuple_Check(known) || PyTuple_GET_SIZE(known) != 2 ||
        !PyWeakref_CheckRef(PyTuple_GET_ITEM(known, 0))) {
      known_all = 0;
      break;
    }
    Py_INCREF(known);
    PyObject *alive;   /* the referent, a new reference, or None */
#if PY_VERSION_HEX >= 0x030D0000
    if (PyWeakref_GetRef(PyTuple_GET_ITEM(known, 0), &alive) < 0) {
      Py_DECREF(known);
      failed = 1;
      break;
    }
    if (alive == NULL)
      alive = Py_NewRef(Py_None);
#else
    alive = Py_NewRef(PyWeakref_GET_OBJECT(PyTuple_GET_ITEM(known, 0)));
#endif
    PyObject *answer = PyTuple_GET_ITEM(known, 1);
    long bits = -1, mask = -1;
    if (alive == c && PyTuple_Check(answer) && PyTuple_GET_SIZE(answer) > 0 &&
        PyLong_Check(PyTuple_GET_ITEM(answer, 0))) {
      bits = PyLong_AsLong(PyTuple_GET_ITEM(answer, 0));
      if (!(bits == -1 && PyErr_Occurred()))
        mask = PyLong_AsLong(PySequence_Fast_GET_ITEM(masks, i));
    }
    Py_DECREF(alive);
    Py_DECREF(known);
    if ((bits == -1 || mask == -1) && PyErr_Occurred()) {
      failed = 1;
      break;
    }
    known_all = bits != -1 && (bits & mask) == 0;
  }
  Py_DECREF(leaves);
  Py_DECREF(masks);
  if (failed)
    return NULL;
  return PyBool_FromLong(known_all);
}

static PyMethodDef front_module_methods[] = {
    {"leaves_known", (PyCFunction)(void (*)(void))leaves_known,
     METH_FASTCALL, "structure.leaves_known's loop in C."},
    {NULL, NULL, 0, NULL}};

static PyModuleDef_Slot front_module_slots[] = {
    {Py_mod_exec, front_exec}, {0, NULL}};

static struct PyModuleDef front_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "jax_closure_cache.front._entrance",
    .m_doc = "The fast front's entrance in C: jit(fun) for a re-created "
             "closure without a Python frame.",
    .m_size = 0,
    .m_methods = front_module_methods,
    .m_slots = front_module_slots};

PyMODINIT_FUNC PyInit__entrance(void) { return PyModuleDef_Init(&front_module); }
