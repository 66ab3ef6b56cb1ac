// The Python module polynorm._C. It has no functions: importing it loads this shared
// library, whose static TORCH_LIBRARY blocks register the polynorm ops. The CMake
// build leaves this file out and is loaded with torch.ops.load_library instead.
#include <Python.h>

extern "C" {
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
}
