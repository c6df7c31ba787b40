# binding.gyp for building faiss-node from its npm sources against the system
# libfaiss (Debian 12: libfaiss-dev 1.7.3, static libfaiss.a only).
# scripts/build-faiss-node.sh copies this file and faiss_compat.h into
# node_modules/faiss-node/ and runs node-gyp there; upstream ships no
# binding.gyp (it builds with cmake-js + a git clone of faiss).
{
  "targets": [
    {
      "target_name": "faiss-node",
      "sources": ["ragguard-build/faiss.cc"],
      "include_dirs": [
        "<!(node -p \"require('node-addon-api').include_dir\")",
        "<(module_root_dir)/ragguard-build"
      ],
      "defines": ["NAPI_VERSION=6", "NAPI_CPP_EXCEPTIONS"],
      "cflags!": ["-fno-exceptions"],
      "cflags_cc!": ["-fno-exceptions", "-fno-rtti", "-std=gnu++17", "-std=gnu++14", "-std=c++14"],
      "cflags_cc": [
        "-std=c++17",
        "-fexceptions",
        "-frtti",
        "-fopenmp",
        "-O3",
        "-Wno-unused-but-set-variable",
        "-include", "<(module_root_dir)/ragguard-build/faiss_compat.h"
      ],
      "libraries": ["-lfaiss", "-fopenmp", "-llapack", "-lblas"],
      "ldflags": ["-fopenmp"]
    }
  ]
}
