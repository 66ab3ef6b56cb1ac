// Built instead of cuda/forward.cu, cuda/backward.cu and cuda/sharded.cu when the CUDA kernels are not compiled
// (a CPU-only torch, no nvcc, or POLYNORM_FORCE_CPU=1): CUDA tensors get a clear error rather
// than the dispatcher's generic "could not run" message, the private ops' too.
#include "polynorm.h"

#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>

namespace polynorm {
namespace {

[[noreturn]] void not_built(const char* op) {
  TORCH_CHECK(false, op,
              ": the CUDA kernels were not built into this installation of polynorm (it was built without "
              "nvcc, with a CPU-only torch, or with POLYNORM_FORCE_CPU=1). Reinstall with a CUDA build of torch "
              "and nvcc on PATH or CUDA_HOME set: pip install -e . --no-build-isolation");
}

std::tuple<at::Tensor, at::Tensor> forward_not_built(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                     double) {
  not_built("polynorm.forward");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_not_built(const at::Tensor&, const at::Tensor&,
                                                                  const at::Tensor&, const at::Tensor&) {
  not_built("polynorm.backward");
}

std::tuple<at::Tensor, at::Tensor> mul_forward_not_built(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                         const at::Tensor&, double) {
  not_built("polynorm.mul_forward");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> mul_backward_not_built(const at::Tensor&,
                                                                                  const at::Tensor&,
                                                                                  const at::Tensor&,
                                                                                  const at::Tensor&,
                                                                                  const at::Tensor&,
                                                                                  const at::Tensor&) {
  not_built("polynorm.mul_backward");
}

std::tuple<at::Tensor, at::Tensor> grouped_forward_not_built(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                             const at::Tensor&, double) {
  not_built("polynorm.grouped_forward");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> grouped_backward_not_built(const at::Tensor&, const at::Tensor&,
                                                                          const at::Tensor&, const at::Tensor&,
                                                                          const at::Tensor&) {
  not_built("polynorm.grouped_backward");
}

// The private ops with an explicit launch configuration (ops.cpp): the same error.
std::tuple<at::Tensor, at::Tensor> forward_config_not_built(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                            double, const std::string&, bool) {
  not_built("polynorm._forward_config");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_config_not_built(const at::Tensor&, const at::Tensor&,
                                                                         const at::Tensor&, const at::Tensor&,
                                                                         const std::string&, bool) {
  not_built("polynorm._backward_config");
}

std::tuple<at::Tensor, at::Tensor> mul_forward_config_not_built(const at::Tensor&, const at::Tensor&,
                                                                const at::Tensor&, const at::Tensor&, double,
                                                                const std::string&, bool) {
  not_built("polynorm._mul_forward_config");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> mul_backward_config_not_built(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const std::string&, bool) {
  not_built("polynorm._mul_backward_config");
}

std::tuple<at::Tensor, at::Tensor> grouped_forward_config_not_built(const at::Tensor&, const at::Tensor&,
                                                                    const at::Tensor&, const at::Tensor&, double,
                                                                    const std::string&, bool) {
  not_built("polynorm._grouped_forward_config");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> grouped_backward_config_not_built(const at::Tensor&,
                                                                                 const at::Tensor&,
                                                                                 const at::Tensor&,
                                                                                 const at::Tensor&,
                                                                                 const at::Tensor&,
                                                                                 const std::string&, bool) {
  not_built("polynorm._grouped_backward_config");
}

at::Tensor sharded_forward_stats_not_built(const at::Tensor&) { not_built("polynorm.sharded_forward_stats"); }

std::tuple<at::Tensor, at::Tensor> sharded_forward_apply_not_built(const at::Tensor&, const std::optional<at::Tensor>&,
                                                                   const at::Tensor&, const at::Tensor&,
                                                                   const at::Tensor&, int64_t, double) {
  not_built("polynorm.sharded_forward_apply");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sharded_backward_stats_not_built(const at::Tensor&, const at::Tensor&,
                                                                                const std::optional<at::Tensor>&,
                                                                                const at::Tensor&) {
  not_built("polynorm.sharded_backward_stats");
}

std::tuple<at::Tensor, at::Tensor> sharded_backward_apply_not_built(const at::Tensor&, const at::Tensor&,
                                                                    const std::optional<at::Tensor>&,
                                                                    const at::Tensor&, const at::Tensor&,
                                                                    const at::Tensor&, const at::Tensor&, int64_t) {
  not_built("polynorm.sharded_backward_apply");
}

}  // namespace

TORCH_LIBRARY_IMPL(polynorm, CUDA, m) {
  m.impl("forward", &forward_not_built);
  m.impl("backward", &backward_not_built);
  m.impl("mul_forward", &mul_forward_not_built);
  m.impl("mul_backward", &mul_backward_not_built);
  m.impl("grouped_forward", &grouped_forward_not_built);
  m.impl("grouped_backward", &grouped_backward_not_built);
  m.impl("_forward_config", &forward_config_not_built);
  m.impl("_backward_config", &backward_config_not_built);
  m.impl("_mul_forward_config", &mul_forward_config_not_built);
  m.impl("_mul_backward_config", &mul_backward_config_not_built);
  m.impl("_grouped_forward_config", &grouped_forward_config_not_built);
  m.impl("_grouped_backward_config", &grouped_backward_config_not_built);
  m.impl("sharded_forward_stats", &sharded_forward_stats_not_built);
  m.impl("sharded_forward_apply", &sharded_forward_apply_not_built);
  m.impl("sharded_backward_stats", &sharded_backward_stats_not_built);
  m.impl("sharded_backward_apply", &sharded_backward_apply_not_built);
}

}  // namespace polynorm
