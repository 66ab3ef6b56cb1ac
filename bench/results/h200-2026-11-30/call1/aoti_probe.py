"""AOTI crash probe: compile packages, then load each in fresh child processes in several orders."""
import os, subprocess, sys, tempfile, faulthandler
faulthandler.enable()
import torch
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

CHILD = r'''
import faulthandler, sys; faulthandler.enable()
import torch
mode, path, device = sys.argv[1], sys.argv[2], sys.argv[3]
x = torch.randn(3, 17, 16, device=device)
if mode == "plain":
    m = torch._inductor.aoti_load_package(path); print("plain ran", m(x).shape)
elif mode == "import_first":
    import polynorm
    m = torch._inductor.aoti_load_package(path); print("import_first ran", m(x).shape)
elif mode == "import_first_noload":
    import polynorm
    print("imported only")
elif mode == "fail_then_import":
    try:
        torch._inductor.aoti_load_package(path)(x); print("WITHOUT_IMPORT ran")
    except RuntimeError as e:
        print("WITHOUT_IMPORT:", str(e).split(chr(10))[0][:200])
    import polynorm
    m = torch._inductor.aoti_load_package(path); print("after import ran", m(x).shape)
elif mode == "import_first_then_exit_clean":
    import polynorm
    m = torch._inductor.aoti_load_package(path); print("ran", m(x).shape); del m
    import os; sys.stdout.flush(); os._exit(0)
'''

def build(device, with_polynorm, tmp):
    import polynorm
    torch.manual_seed(0)
    layers = [nn.Linear(16, 64)]
    if with_polynorm:
        layers.append(polynorm.PolyNorm())
    layers.append(nn.Linear(64, 16))
    block = nn.Sequential(*layers).to(device)
    x = torch.randn(2, 5, 16, device=device)
    dims = {0: torch.export.Dim("batch", min=1, max=4096), 1: torch.export.Dim("seq", min=1, max=4096)}
    ep = torch.export.export(block, (x,), dynamic_shapes=(dims,))
    name = f"{device}_{'pn' if with_polynorm else 'plain'}.pt2"
    return torch._inductor.aoti_compile_and_package(ep, package_path=os.path.join(tmp, name))

def main():
    tmp = tempfile.mkdtemp()
    devices = sys.argv[1:] or ["cpu"]
    for device in devices:
        for with_pn in (False, True):
            path = build(device, with_pn, tmp)
            modes = ["plain", "import_first"] if not with_pn else ["import_first_noload", "import_first", "fail_then_import", "import_first_then_exit_clean"]
            for mode in modes:
                r = subprocess.run([sys.executable, "-c", CHILD, mode, path, device], cwd=ROOT, capture_output=True, text=True, timeout=300)
                print(f"[{device} {'polynorm' if with_pn else 'plain'} {mode}] rc={r.returncode} out={r.stdout.strip()[-300:]!r}")
                if r.returncode != 0:
                    print("  stderr tail:", r.stderr.strip()[-3000:])
                if r.returncode < 0:
                    import shutil
                    gdb = shutil.which("cuda-gdb") or "/usr/local/cuda/bin/cuda-gdb"
                    g = subprocess.run([gdb, "-batch", "-ex", "run", "-ex", "bt 40", "--args", sys.executable, "-c", CHILD, mode, path, device],
                                       cwd=ROOT, capture_output=True, text=True, timeout=200)
                    print("  GDB:", g.stdout[-5000:], g.stderr[-1000:])
            print(flush=True)
    print("PATHS", tmp)

if __name__ == "__main__":
    main()
