# What the compile legs (cuda, rocm, xpu) share; sourced by them from the
# repository root, never run as a leg itself.

# leg_begin NAME OUT: the leg's name for its messages, and a fresh OUT/obj;
# sets leg, out and started.
leg_begin() {
  leg=$1
  out=$2
  started=$SECONDS
  rm -rf "$out"
  mkdir -p "$out/obj"
}

# The object file of a csrc/ source, under $out/obj.
obj() {
  local rel=${1#csrc/}
  echo "$out/obj/${rel//\//__}.o"
}

# The *.cc / *.cpp under csrc/ that include a header matching the extended
# regular expression $1 (a path ending: 'gpu_runtime\.h|cuda_runtime\.h').
sources_including() {
  grep -rlE --include='*.cc' --include='*.cpp' \
    "^[[:space:]]*#[[:space:]]*include[[:space:]]*[<\"]([^\">]*/)?($1)[\">]" csrc | LC_ALL=C sort
}

# Every *.cu under csrc/ (one source serves CUDA and HIP) into the array
# kernel_sources; fails the leg when there is none.
find_kernel_sources() {
  mapfile -t kernel_sources < <(find csrc -type f -name '*.cu' | LC_ALL=C sort)
  if [ "${#kernel_sources[@]}" -eq 0 ]; then
    echo "$leg: no .cu source under csrc/" >&2
    exit 1
  fi
}

# The CPU backend of the kernels (the sources tools/build_ops.py takes besides
# the Paddle registrations) into the array cpu_sources.
find_cpu_sources() {
  mapfile -t cpu_sources < <(find csrc/ops/cpu csrc/ops/common -maxdepth 1 -type f -name '*.cc' | LC_ALL=C sort)
}

# The device probe (csrc/tools/device_probe.cc) checks the GPU kernels against
# the CPU ones: compiles the CPU backend (the sources tools/build_ops.py takes
# besides the Paddle registrations) with g++ and the flags given, and sets
# probe_objs to everything the probe links: itself, the kernels, the CPU backend.
compile_probe_objects() {
  local src
  find_cpu_sources
  for src in "${cpu_sources[@]}"; do
    echo "g++ (probe) $src"
    g++ "$@" -c "$src" -o "$(obj "$src")"
  done
  probe_objs=("$(obj csrc/tools/device_probe.cc)")
  for src in "${kernel_sources[@]}" "${cpu_sources[@]}"; do probe_objs+=("$(obj "$src")"); done
}

# leg_end WHAT: the leg's closing line, "== NAME: ok, WHAT, N s".
leg_end() {
  echo "== $leg: ok, $1, $((SECONDS - started)) s"
}
