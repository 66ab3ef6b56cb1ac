// Autograd for polynorm::forward and polynorm::mul_forward, in C++: the forward saves x (and
// mul), the parameters and the rstd cache; the backward calls polynorm::backward
// (mul_backward) and rounds each parameter's gradient to its dtype. One kernel for every
// device (it dispatches to the CPU or CUDA op below it). In C++ rather than
// torch.library.register_autograd because the Python wrapper adds host time to every call, as
// much as the CUDA backward itself takes at mid sizes (bench/host_overhead.py measures it).
// The double backward stays refused by polynorm/ops.py, which gives polynorm::backward and
// mul_backward autograd kernels that raise.
#include "polynorm.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <optional>
#include <string>
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

std::tuple<at::Tensor, at::Tensor> call_mul_forward(const at::Tensor& x, const at::Tensor& mul, const at::Tensor& weight,
                                                    const at::Tensor& bias, double eps) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("polynorm::mul_forward", "")
                             .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                       const at::Tensor&, const at::Tensor&, double)>();
  return op.call(x, mul, weight, bias, eps);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> call_mul_backward(const at::Tensor& grad_out,
                                                                             const at::Tensor& x,
                                                                             const at::Tensor& mul,
                                                                             const at::Tensor& weight,
                                                                             const at::Tensor& bias,
                                                                             const at::Tensor& rstd) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("polynorm::mul_backward", "")
          .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const at::Tensor&)>();
  return op.call(grad_out, x, mul, weight, bias, rstd);
}

// The backward ops return the parameter gradients in the accumulation dtype (fp32, fp64 for
// fp64 x): each is rounded once, in backward, to its own parameter's dtype and shape
// (weight: any 3 elements; bias: (1,) or ()). The forward records both here.
void save_param_meta(AutogradContext* ctx, const at::Tensor& weight, const at::Tensor& bias) {
  ctx->saved_data["weight_sizes"] = weight.sizes().vec();
  ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
  ctx->saved_data["bias_sizes"] = bias.sizes().vec();
  ctx->saved_data["bias_dtype"] = static_cast<int64_t>(bias.scalar_type());
}

// grad (the accumulation dtype) rounded to the parameter `name`'s dtype and shape, or an
// undefined tensor when that parameter needs no gradient.
at::Tensor param_grad(AutogradContext* ctx, const std::string& name, bool needed, const at::Tensor& grad) {
  if (!needed) return at::Tensor();
  const auto dtype = static_cast<at::ScalarType>(ctx->saved_data[name + "_dtype"].toInt());
  return grad.to(dtype).reshape(ctx->saved_data[name + "_sizes"].toIntVector());
}

// Without create_graph there is nothing to record: the backward skips the backward op's own
// autograd kernel (Python, it only refuses double backward) and its host cost.
void below_autograd_unless_create_graph(std::optional<at::AutoDispatchBelowADInplaceOrView>& guard) {
  if (!c10::GradMode::is_enabled()) guard.emplace();
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
    save_param_meta(ctx, weight, bias);
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
    std::optional<at::AutoDispatchBelowADInplaceOrView> below_autograd;
    below_autograd_unless_create_graph(below_autograd);
    // grads[1] (rstd's) is never used.
    auto [grad_x, grad_weight, grad_bias] = call_backward(grads[0], saved[0], saved[1], saved[2]);
    return {
        need_x ? grad_x : at::Tensor(),
        param_grad(ctx, "weight", need_weight, grad_weight),
        param_grad(ctx, "bias", need_bias, grad_bias),
        at::Tensor(),
        at::Tensor(),
    };
  }
};

// The fused PolyNorm x mul, out = poly_norm(x) * mul: as PolyNormFunction, with mul saved
// too (g = grad_out * mul drives PolyNorm's backward) and the bias (grad_mul = grad_out * y
// recomputes y from x and rstd).
class PolyNormMulFunction : public torch::autograd::Function<PolyNormMulFunction> {
 public:
  // copy_x, copy_mul: that input is an inference tensor and this call records a backward;
  // it is copied once, as in PolyNormFunction. No other call copies either.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& mul,
                               const at::Tensor& weight, const at::Tensor& bias, double eps, bool copy_x,
                               bool copy_mul) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [out, rstd] = call_mul_forward(x, mul, weight, bias, eps);
    ctx->save_for_backward({copy_x ? x.clone() : x, copy_mul ? mul.clone() : mul, weight, bias, rstd});
    save_param_meta(ctx, weight, bias);
    ctx->mark_non_differentiable({rstd});
    ctx->set_materialize_grads(false);  // as in PolyNormFunction
    return {out, rstd};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const bool need_x = ctx->needs_input_grad(0);
    const bool need_mul = ctx->needs_input_grad(1);
    const bool need_weight = ctx->needs_input_grad(2);
    const bool need_bias = ctx->needs_input_grad(3);
    variable_list input_grads(7);  // x, mul, weight, bias; eps, copy_x, copy_mul have none
    // Nothing needs a gradient, or out did not reach the loss (every gradient zero, left undefined).
    if (!(need_x || need_mul || need_weight || need_bias) || !grads[0].defined()) return input_grads;
    const variable_list saved = ctx->get_saved_variables();
    std::optional<at::AutoDispatchBelowADInplaceOrView> below_autograd;
    below_autograd_unless_create_graph(below_autograd);
    auto [grad_x, grad_mul, grad_weight, grad_bias] =
        call_mul_backward(grads[0], saved[0], saved[1], saved[2], saved[3], saved[4]);
    input_grads[0] = need_x ? grad_x : at::Tensor();
    input_grads[1] = need_mul ? grad_mul : at::Tensor();
    input_grads[2] = param_grad(ctx, "weight", need_weight, grad_weight);
    input_grads[3] = param_grad(ctx, "bias", need_bias, grad_bias);
    return input_grads;
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

std::tuple<at::Tensor, at::Tensor> mul_forward_autograd(const at::Tensor& x, const at::Tensor& mul,
                                                        const at::Tensor& weight, const at::Tensor& bias, double eps) {
  // As forward_autograd: None fails here, named; the other checks stay in the kernels.
  TORCH_CHECK(x.defined(), "polynorm.mul_forward: expected x to be a Tensor, got None");
  TORCH_CHECK(mul.defined(), "polynorm.mul_forward: expected mul to be a Tensor, got None");
  TORCH_CHECK(weight.defined(), "polynorm.mul_forward: expected weight to be a Tensor, got None");
  TORCH_CHECK(bias.defined(), "polynorm.mul_forward: expected bias to be a Tensor, got None");
  const bool records = c10::GradMode::is_enabled() &&
                       (x.requires_grad() || mul.requires_grad() || weight.requires_grad() || bias.requires_grad());
  const variable_list out = PolyNormMulFunction::apply(x, mul, weight, bias, eps, records && x.is_inference(),
                                                       records && mul.is_inference());
  return {out[0], out[1]};
}

}  // namespace

TORCH_LIBRARY_IMPL(polynorm, Autograd, m) {
  m.impl("forward", &forward_autograd);
  m.impl("mul_forward", &mul_forward_autograd);
}

}  // namespace polynorm
