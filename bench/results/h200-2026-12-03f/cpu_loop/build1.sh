#!/bin/bash
# usage: build1.sh DIR -> DIR.cubin DIR.log DIR.sass
T=/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/torch/include
B=/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/nvidia/cu13/bin
cp "${TU:-tu.cu}" "$1/tu.cu"
/usr/local/cuda/bin/nvcc -O3 -lineinfo -gencode arch=compute_90,code=sm_90 -std=c++20 --expt-relaxed-constexpr -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__ -DTORCH_API_INCLUDE_EXTENSION_H -D_GLIBCXX_USE_CXX11_ABI=1 -I $1 -I $T -I $T/torch/csrc/api/include -cubin -Xptxas=-v -o $1.cubin $1/tu.cu > $1.log 2>&1 || { tail -20 $1.log; exit 1; }
$B/nvdisasm -gi -c $1.cubin > $1.sass
