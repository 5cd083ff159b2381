import os, sys, time, numpy as np, ferry
path = "/tmp/scat.bin"; io = 4096; n = 60000
if not os.path.exists(path): np.random.default_rng(1).integers(0,256,256<<20,dtype=np.uint8).tofile(path)
src = np.random.default_rng(2).integers(0,256,n*io,dtype=np.uint8)
rng = np.random.default_rng(3)
res = {}
for rnd in range(6):
    for thr in ("1", "2"):
        os.sync()
        slots = rng.permutation((256<<20)//io)[:n]
        ranges = np.stack([slots*io, np.full(n, io), np.arange(n)*io], axis=1).astype(np.int64)
        with ferry.open(path, "r+", host_nthreads=thr) as f:
            t = time.perf_counter(); f.write_ranges(src, ranges); dt = time.perf_counter() - t
            w = f.last_route.workers
        res.setdefault(thr, []).append(n/dt)
        fd = os.open(path, os.O_WRONLY); t = time.perf_counter()
        for s in slots[:20000]: os.pwrite(fd, src[:io], int(s)*io)
        raw = 20000/(time.perf_counter()-t); os.close(fd)
        res.setdefault("raw", []).append(raw)
        print(f"round {rnd} writers={w} ({thr} asked): {n/dt:,.0f} ranges/s; pwrite loop after: {raw:,.0f}/s", flush=True)
for k, v in res.items(): print(k, "median", f"{np.median(v):,.0f}")
