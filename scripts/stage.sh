# Sourced by .ci/run, scripts/setup, scripts/test and scripts/reliability: times CI's stages.
# `stage_begin NAME` ... `stage_end NAME` prints "== stage NAME: N s (CPU M s)": the wall time,
# and the CPU time of the processes this shell waited for meanwhile, which varies less than the
# wall time on a machine shared with other work (docs/ci.md). Stages may overlap (each has its
# own clocks), but then the CPU time of one counts in the other.
declare -A ferry_stage_t0=() ferry_stage_cpu0=()
ferry_cpu_seconds() { # cutime + cstime of this shell (clock ticks of 1/100 s on Linux)
  awk '{ printf "%d", ($(NF - 36) + $(NF - 35)) / 100 }' "/proc/$$/stat"
}
stage_begin() {
  ferry_stage_t0[$1]=$SECONDS
  ferry_stage_cpu0[$1]=$(ferry_cpu_seconds)
}
stage_end() {
  echo "== stage $1: $((SECONDS - ${ferry_stage_t0[$1]})) s" \
    "(CPU $(($(ferry_cpu_seconds) - ${ferry_stage_cpu0[$1]})) s)"
}
