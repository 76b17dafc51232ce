#!/bin/sh
# Build the prototype SnakeBeta custom-op library. ORT_INC: a directory with onnxruntime_c_api.h
# (API >= 17; e.g. from github.com/yalue/onnxruntime_go or the onnxruntime release archive).
set -e
here=$(dirname "$0")
out=${1:-/work/perf/libqtts_snake.so}
gcc -O3 -mavx2 -mfma -fPIC -shared -fno-math-errno -I"${ORT_INC:-/work/perf/ortinc}" \
    "$here/snake_op.c" -o "$out"
echo "$out"
