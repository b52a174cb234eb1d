# Sourced by the GPU machine's scripts (tests/gpu/ab.sh, bench/dev/ncu_attn.sh): where a library packed by
# tests/gpu/pack.sh lies in .gpu-carry ($c): base, new (the build itself), or a variant's name.
libdir() { case $1 in base) echo "$c/base/lib" ;; new) echo "$c/lib" ;; *) echo "$c/variants/$1/lib" ;; esac; }
