"""``python3 -m polynorm``: a short demo of the ops on the available device.

Runs PolyNorm forward and backward with the default backend (the CUDA kernels on a GPU,
the C++ kernel on the CPU) on random bf16 and fp32 activations with fp32 parameters,
and prints each result's relative L2 error against the float64 oracle next to the
error of the fp32-upcast eager reference.
"""

import torch

import polynorm
from polynorm import reference


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main() -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    M, H = (4096, 4096) if device == "cuda" else (256, 1024)
    print(f"polynorm {polynorm.__version__}: PolyNorm on {device}, x of shape ({M}, {H})")
    print(f"{'dtype':>9} {'output':>6} {'polynorm':>10} {'fp32 eager':>10}")
    gen = torch.Generator(device=device).manual_seed(0)
    ok = True
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(M, H, device=device, generator=gen).to(dtype)
        g = torch.randn(M, H, device=device, generator=gen).to(dtype)
        module = polynorm.PolyNorm(device=device)
        with torch.no_grad():
            module.weight.copy_(torch.tensor([0.3, -0.4, 0.9]))
            module.bias.fill_(0.1)
        results = {}
        for name, fn, xin, cd in (
            ("polynorm", module, x, None),
            ("eager", lambda t: reference.poly_norm(t, module.weight, module.bias, module.eps), x, None),
            ("oracle", lambda t: reference.poly_norm(t, module.weight, module.bias, module.eps, compute_dtype=torch.float64), x.double(), None),
        ):
            xi = xin.detach().clone().requires_grad_()
            module.zero_grad()
            y = fn(xi)
            y.backward(g.to(y.dtype))
            results[name] = (y.detach(), xi.grad, module.weight.grad.clone())
        for i, out in enumerate(("y", "dx", "dw")):
            err = _rel(results["polynorm"][i], results["oracle"][i])
            err_eager = _rel(results["eager"][i], results["oracle"][i])
            ok &= err <= 1.05 * err_eager + 1e-6
            print(f"{str(dtype)[6:]:>9} {out:>6} {err:10.2e} {err_eager:10.2e}")
    print("agrees with the float64 oracle" if ok else "DISAGREES with the float64 oracle")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
