# Sourced by .ci/run, scripts/setup, scripts/test and scripts/reliability: times CI's stages.
# `stage_begin NAME` ... `stage_end NAME` prints "== stage NAME: N s" (wall seconds), so that a CI
# log shows where its time goes (docs/ci.md). Stages may overlap; each has its own clock.
declare -A ferry_stage_t0=()
stage_begin() { ferry_stage_t0[$1]=$SECONDS; }
stage_end() { echo "== stage $1: $((SECONDS - ${ferry_stage_t0[$1]})) s"; }
