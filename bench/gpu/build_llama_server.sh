#!/bin/bash
# llama-server (CUDA, Hopper) from the carried llama.cpp tree (.peer/llama.cpp.tgz), built once per
# machine into /root/sbs/llama.cpp/build/bin (where ../shared/peers/gpu_side_by_side.sh builds it);
# ~5 min on 16 cores. From the repo root on the lent GPU machine:  bash bench/gpu/build_llama_server.sh
set -u
W=/root/sbs; R=$PWD; B=$W/llama.cpp/build/bin
mkdir -p $W
if [ ! -x $B/llama-server ]; then
  (cd $W && rm -rf llama.cpp && tar xzf $R/.peer/llama.cpp.tgz && cd llama.cpp && \
   cmake -S . -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
     -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
     -DCMAKE_BUILD_TYPE=Release && cmake --build build -j16 --target llama-server) > $W/server_build.log 2>&1 \
    || { tail -30 $W/server_build.log; exit 1; }
fi
echo "llama-server: $B/llama-server"
