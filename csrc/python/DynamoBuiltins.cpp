// Builtins standing in for the Python helpers that Dynamo's generated code
// calls on every call of a compiled frame (installed by
// torch_ember/compile/dynamo_builtins.py). A Python helper there costs a
// frame, entered through Dynamo's frame hook, on each call; a builtin enters
// no frame. Each does what the helper it replaces does.
#include <Python.h>
#include <pybind11/pybind11.h>

#include <utility>

namespace py = pybind11;

namespace ember {
namespace {

// torch._dynamo.graph_bytecode_inputs.store_user_object_weakrefs(*objects):
// `registry` (that module's index -> weakref dict) maps each position to a
// weak reference of this call's object. Where ember is the accelerator every
// compiled frame stores its current stream so.
py::cpp_function weakref_store(py::dict registry) {
  return py::cpp_function(
      [registry = std::move(registry)](const py::args& objects) {
        // Cleared first, as torch's does: an object that cannot have a weak
        // reference raises TypeError and leaves the registry empty.
        PyDict_Clear(registry.ptr());
        for (size_t i = 0; i < objects.size(); ++i) {
          PyObject* ref = PyWeakref_NewRef(objects[i].ptr(), nullptr);
          if (ref == nullptr) {
            PyDict_Clear(registry.ptr());
            throw py::error_already_set();
          }
          registry[py::int_(i)] = py::reinterpret_steal<py::object>(ref);
        }
      });
}

// torch._dynamo.utils.record_pregraph_bytecode_enter(): the profiler range
// torch opens around a frame's pre-graph bytecode, opened by torch's own
// function while `profiler_module._is_profiler_enabled`; otherwise None
// (torch enters a nullcontext), which the exit below passes over.
py::cpp_function pregraph_enter(py::object profiler_module,
                                py::object original) {
  return py::cpp_function([profiler_module = std::move(profiler_module),
                           original = std::move(original)]() -> py::object {
    const py::object enabled = profiler_module.attr("_is_profiler_enabled");
    if (PyObject_IsTrue(enabled.ptr()) == 1) return original();
    return py::none();
  });
}

// torch._dynamo.utils.record_pregraph_bytecode_exit(cm).
py::cpp_function pregraph_exit(py::object original) {
  return py::cpp_function(
      [original = std::move(original)](const py::object& cm) {
        if (!cm.is_none()) original(cm);
      });
}

}  // namespace

void bind_dynamo_builtins(py::module& m) {
  m.def(
      "_dynamo_weakref_store", &weakref_store, py::arg("registry"),
      "A builtin doing store_user_object_weakrefs(*objects) into `registry`.");
  m.def("_dynamo_pregraph_enter", &pregraph_enter, py::arg("profiler_module"),
        py::arg("original"),
        "A builtin doing record_pregraph_bytecode_enter(): `original()` while "
        "the profiler is enabled, else None.");
  m.def("_dynamo_pregraph_exit", &pregraph_exit, py::arg("original"),
        "A builtin doing record_pregraph_bytecode_exit(cm): `original(cm)` "
        "unless cm is None.");
}

}  // namespace ember
