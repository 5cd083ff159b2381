import json,statistics,sys
d=sys.argv[1]
cases=('4 KiB host, 1 thread(s)','4 KiB host, 2 thread(s)','64 KiB host, 1 thread(s)','64 KiB host, 2 thread(s)')
rows={}
for v in ['base','publish','off']:
    for i in range(1,7):
        for line in open(f'{d}/{v}-{i}.jsonl'):
            j=json.loads(line)
            c=j['case']
            if c in cases:
                rows.setdefault((c,v),[]).append((j['ferry_us'], j['raw_us'], j['ferry_us']/j['raw_us']))
            if c=='4KiB during a 256MiB read':
                rows.setdefault(('p99',v),[]).append(j['p99_ms'])
print("ferry_small_bench, 6 interleaved runs each: median [min-max] of ferry/pread latency ratio, ferry us")
for c in cases:
    for v in ['base','publish','off']:
        r=rows[(c,v)]
        rat=[x[2] for x in r]
        print(f"  {c:26s} {v:8s} ferry/pread {statistics.median(rat):.3f} [{min(rat):.3f}-{max(rat):.3f}]  ferry_us {statistics.median(x[0] for x in r):.3f}")
for v in ['base','publish','off']:
    print(f"  p99 of a 4 KiB read during a 256 MiB read, {v}: median {statistics.median(rows[('p99',v)]):.4f} ms")
print("stats_record_cost, 6 runs each (fastest of 2000 batches)")
for v in ['base','publish','off']:
    rec=[];rd=[]
    for line in open(f'{d}/cost-{v}.jsonl'):
        j=json.loads(line)
        if j['case']=='record_small_request': rec.append(j['min_ns'])
        else: rd.append((j['ferry_min_ns'],j['pread_min_ns']))
    over=[f-p for f,p in rd]; ratio=[f/p for f,p in rd]
    print(f"  {v:8s} record_small_request {statistics.median(rec):.2f} ns [{min(rec):.2f}-{max(rec):.2f}]; 4 KiB read: ferry {statistics.median(f for f,_ in rd):.0f} ns, pread {statistics.median(p for _,p in rd):.0f} ns, ferry-pread {statistics.median(over):.1f} ns [{min(over):.1f}-{max(over):.1f}], ferry/pread {statistics.median(ratio):.4f} [{min(ratio):.4f}-{max(ratio):.4f}]")
