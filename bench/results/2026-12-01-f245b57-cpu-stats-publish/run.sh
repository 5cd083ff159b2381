#!/bin/bash
# Interleaved: the same source tree (f245b57 + the working tree) without issue 15 (base), with it
# (publish, the default), and with it but FERRY_STATS_PUBLISH=0 (off).
export FERRY_STATS_DIR=/tmp/h15m/shm
cd RUN_DIR
for i in 1 2 3 4 5 6; do
  ../base/ferry_small_bench --file /tmp/h15-small.bin > base-$i.jsonl 2> base-$i.txt
  ../new/ferry_small_bench --file /tmp/h15-small.bin > publish-$i.jsonl 2> publish-$i.txt
  FERRY_STATS_PUBLISH=0 ../new/ferry_small_bench --file /tmp/h15-small.bin > off-$i.jsonl 2> off-$i.txt
  ../base/stats_record_cost read /tmp/h15-read.bin >> cost-base.jsonl
  ../new/stats_record_cost read /tmp/h15-read.bin >> cost-publish.jsonl
  FERRY_STATS_PUBLISH=0 ../new/stats_record_cost read /tmp/h15-read.bin >> cost-off.jsonl
  ../base/stats_record_cost >> cost-base.jsonl
  ../new/stats_record_cost >> cost-publish.jsonl
  FERRY_STATS_PUBLISH=0 ../new/stats_record_cost >> cost-off.jsonl
done
uptime > uptime.txt
echo finished > done
