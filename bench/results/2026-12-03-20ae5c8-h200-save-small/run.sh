#!/usr/bin/env bash
# Temporary device script (not committed): gpu tests, save (new 4+16 GiB, old 4 GiB), small old/new.
set -uo pipefail
export CPATH=$PWD/.carry/include
R=/tmp/res; mkdir -p $R $OUT
(STEPS="none" WITH_PYTHON=ON bash scripts/gpu-verify $R/gv0 > $R/gv0.console 2>&1) &
gv=$!
rm -rf /tmp/old-src && mkdir -p /tmp/old-src && tar -xzf .carry/old-8d0f343.tar.gz -C /tmp/old-src
pybind=$(python3 -m pybind11 --cmakedir 2>/dev/null || true)
cmake -S /tmp/old-src -B /tmp/exp-old -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_BUILD_PYTHON=ON -DFERRY_BUILD_TESTS=OFF \
  -DPYTHON_EXECUTABLE="$(command -v python3)" ${pybind:+-Dpybind11_DIR=$pybind} > /tmp/exp-old.log 2>&1
cmake --build /tmp/exp-old -j 8 >> /tmp/exp-old.log 2>&1 || tail -20 /tmp/exp-old.log
wait $gv
echo "builds done: $(grep build: $R/gv0/summary.md)"
STEPS="gpu-tests save small" SAVE_SIZES="4,16" STEP_TIMEOUT=300 bash scripts/gpu-verify $R/gv > $R/gv.console 2>&1
echo "gpu-verify done rc=$?"
grep -E 'gpu-tests|Failed|took' $R/gv/summary.md
grep -E '^\| 4GiB|^\| 16GiB' $R/gv/save.txt
PYTHONPATH=/tmp/old-src/python PYTHONUNBUFFERED=1 FERRY_BENCH_DIR=/tmp/ferry-save-old timeout 200 python3 bench/save_bench.py $R/old-save \
  --ferry-cli /tmp/exp-old/tools/ferry --sizes 4 > $R/old-save.txt 2>&1
rm -rf /tmp/ferry-save-old
echo "old (8d0f343) save:"; grep -E '^\| 4GiB' $R/old-save.txt
for r in 1 2 3; do
  for v in old new; do
    b=/tmp/exp-old/bench/ferry_small_bench; [ $v = new ] && b=/tmp/ferry-gpu-build/bench/ferry_small_bench
    $b --file $PWD/exp-small.bin --threads 8 --gpu no --seconds 1 > $R/small-$v-$r.jsonl 2> $R/small-$v-$r.txt
    echo "$v round $r: $(grep -E '8 thread' $R/small-$v-$r.txt | grep -v '64 KiB' | sed 's/ \+/ /g' | tr '\n' ';')"
  done
done
rm -f exp-small.bin
tar -czf $OUT/results.tgz -C $R .
