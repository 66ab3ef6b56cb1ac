#!/usr/bin/env bash
# CMAKE_CUDA_COMPILER_LAUNCHER: runs the compile command it is given ("$@") and, every 20 s until
# it ends, prints which source it compiles, for which GPU code, and for how long: an nvcc object
# of the CUDA kernels takes minutes, and make prints nothing else meanwhile. Exits with the
# compiler's status.
src="" archs="" prev=""
for arg in "$@"; do
  [ "$prev" = "-c" ] && src="$arg"
  case "$arg" in *arch=compute_*,code=*) archs="$archs ${arg##*code=}" ;; esac
  prev="$arg"
done
archs=$(echo "$archs" | tr -d '[]"' | tr ' ,' '\n\n' | sed '/^$/d' | sort -u | sort -t_ -k2,2n -k1,1r \
  | sed 's/^\(compute_.*\)$/\1 (PTX)/' | paste -sd, - | sed 's/,/, /g')
case "$src" in */csrc/*) src="csrc/${src##*/csrc/}" ;; esac
"$@" &
pid=$!
start=$SECONDS
next=20
while kill -0 "$pid" 2> /dev/null; do
  sleep 1
  if [ $((SECONDS - start)) -ge "$next" ] && kill -0 "$pid" 2> /dev/null; then
    echo "polynorm: compiling $src for ${archs:-the default architecture} ($((SECONDS - start)) s)" >&2
    next=$((next + 20))
  fi
done
wait "$pid"
