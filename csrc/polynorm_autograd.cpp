// Autograd for polynorm::forward, in C++: the forward saves x, weight and the rstd cache;
// the backward calls polynorm::backward and rounds each parameter's gradient to its dtype. One kernel for every device (it dispatches to
// the CPU or CUDA op below it). In C++ rather than torch.library.register_autograd
// because the Python wrapper costs tens of microseconds of host time a call, as long as
// the CUDA backward itself at mid sizes (bench/NOTES.md). The double backward stays
// refused by polynorm/_common.py, which gives polynorm::backward an autograd kernel that
// raises.
#include "polynorm.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <vector>

namespace polynorm {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::tuple<at::Tensor, at::Tensor> call_forward(const at::Tensor& x, const at::Tensor& weight,
                                                const at::Tensor& bias, double eps) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("polynorm::forward", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&, double)>();
  return op.call(x, weight, bias, eps);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> call_backward(const at::Tensor& grad_y, const at::Tensor& x,
                                                             const at::Tensor& weight, const at::Tensor& rstd) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("polynorm::backward", "")
                             .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
                                 const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&)>();
  return op.call(grad_y, x, weight, rstd);
}

class PolyNormFunction : public torch::autograd::Function<PolyNormFunction> {
 public:
  // copy_x: x is an inference tensor (made under torch.inference_mode()) and this call
  // records a backward. Autograd refuses to save an inference tensor (it has no version
  // counter, so a later in-place change under inference_mode could not be detected), yet
  // the weight and bias gradients need x's rows: x is copied once into a normal tensor,
  // the clone that PyTorch's own message asks for. No other call copies x.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                               const at::Tensor& bias, double eps, bool copy_x) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [y, rstd] = call_forward(x, weight, bias, eps);
    ctx->save_for_backward({copy_x ? x.clone() : x, weight, rstd});
    // polynorm::backward returns the parameter gradients in the accumulation dtype (fp32,
    // fp64 for fp64 x): each is rounded once, here, to its own parameter's dtype and shape
    // (weight: any 3 elements; bias: (1,) or ()).
    ctx->saved_data["weight_sizes"] = weight.sizes().vec();
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["bias_sizes"] = bias.sizes().vec();
    ctx->saved_data["bias_dtype"] = static_cast<int64_t>(bias.scalar_type());
    ctx->mark_non_differentiable({rstd});
    // No zeros for unused outputs: rstd never has a gradient, and materialising one was a
    // fill kernel on every backward (seen in bench/profile_steps.py). An unused y gives an
    // undefined grad_y, handled in backward.
    ctx->set_materialize_grads(false);
    return {y, rstd};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const bool need_x = ctx->needs_input_grad(0);
    const bool need_weight = ctx->needs_input_grad(1);
    const bool need_bias = ctx->needs_input_grad(2);
    if (!need_x && !need_weight && !need_bias) {
      return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    }
    if (!grads[0].defined()) {  // y did not reach the loss: every gradient is zero, left undefined
      return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    }
    const variable_list saved = ctx->get_saved_variables();
    // Without create_graph there is nothing to record: skip polynorm::backward's own
    // autograd kernel (Python, it only refuses double backward) and its host cost.
    std::optional<at::AutoDispatchBelowADInplaceOrView> below_autograd;
    if (!c10::GradMode::is_enabled()) below_autograd.emplace();
    // grads[1] (rstd's) is never used.
    auto [grad_x, grad_weight, grad_bias] = call_backward(grads[0], saved[0], saved[1], saved[2]);
    const auto weight_dtype = static_cast<at::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    const auto bias_dtype = static_cast<at::ScalarType>(ctx->saved_data["bias_dtype"].toInt());
    return {
        need_x ? grad_x : at::Tensor(),
        need_weight ? grad_weight.to(weight_dtype).reshape(ctx->saved_data["weight_sizes"].toIntVector())
                    : at::Tensor(),
        need_bias ? grad_bias.to(bias_dtype).reshape(ctx->saved_data["bias_sizes"].toIntVector()) : at::Tensor(),
        at::Tensor(),
        at::Tensor(),
    };
  }
};

std::tuple<at::Tensor, at::Tensor> forward_autograd(const at::Tensor& x, const at::Tensor& weight,
                                                    const at::Tensor& bias, double eps) {
  // None (an undefined tensor) would fail inside autograd, unnamed: the kernels' message
  // first. The other checks stay in the kernels and fake kernels, which see the real or
  // symbolic shapes (this code is traced through with symbolic ones).
  TORCH_CHECK(x.defined(), "polynorm.forward: expected x to be a Tensor, got None");
  TORCH_CHECK(weight.defined(), "polynorm.forward: expected weight to be a Tensor, got None");
  TORCH_CHECK(bias.defined(), "polynorm.forward: expected bias to be a Tensor, got None");
  // Function::apply saves for backward only when grad mode is on and an input requires grad.
  const bool records = c10::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad() || bias.requires_grad());
  const variable_list out = PolyNormFunction::apply(x, weight, bias, eps, records && x.is_inference());
  return {out[0], out[1]};
}

}  // namespace

TORCH_LIBRARY_IMPL(polynorm, Autograd, m) { m.impl("forward", &forward_autograd); }

}  // namespace polynorm
