#!/usr/bin/env python3
"""A model of ferry.iter_weights' pipeline on the GPU machine (bench/NOTES.md §36): the 4 GiB
Llama of iter_weights_bench.py, read by W workers that take 4 MiB tasks in order from the
requests queued; a request completes `drain` after its last task (the last copy, the stream's
sync); `turn` is the consumer thread's round trip, half to see a read done, half for a read it
then starts to begin. Calibrated to the H100 run at a78f91b (0.82x load_checkpoint at a 256 MiB
budget, 1.02x at 1 GiB), it prints what the changes of §36 should give. CPU only, no ferry:

    /usr/bin/python3 bench/iter_weights_model.py [--designs]

--designs: what a device-side spill buffer and a streaming ring would give instead (§59).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import iter_weights_bench as bench  # noqa: E402

MiB = 1 << 20


def sizes_of(total):
    out = []
    for name, (shape, _, _) in sorted(bench.shapes(total).items()):  # the file's order
        n = 2
        for d in shape:
            n *= d
        out.append(n)
    return out


def pieces(nbytes, task):
    """A read of `nbytes` as the engine cuts it: tasks of `task` bytes, the last shorter."""
    return [min(task, nbytes - b) for b in range(0, nbytes, task)]


def schedule(free_at, tasks, now, rate):
    """Gives each task, in order, to the worker free first (`free_at`, updated: each reads at
    rate / workers); returns when the last one ends (`now` for none)."""
    end = now
    for k in tasks:
        w = min(range(len(free_at)), key=lambda j: free_at[j])
        free_at[w] = max(free_at[w], now) + k / (rate / len(free_at))
        end = max(end, free_at[w])
    return end


def run(sizes, limit, W=8, task=4 * MiB, rate=44e9, drain=0.25e-3, turn=0.5e-3, tail_split=0,
        spill=0):
    """Seconds for iter_weights' schedule (two batches in flight, each at most limit / 2, one
    alone when nothing is ahead) of `sizes` under `limit` (the budget less the staging). With
    `spill`, a batch that waits for the budget has its first `spill` bytes read at once into a
    device buffer of that size, copied into its allocation when it starts (§59)."""
    free_at = [0.0] * W
    t, todo, batches, ahead = 0.0, list(range(len(sizes))), [], 0
    spilled = {}  # the first tensor of a waiting batch: (bytes read ahead, when they land)

    def queue(nbytes, now):
        return schedule(free_at, pieces(nbytes, task), now, rate)

    def start(items, now):
        tasks = [k for i in items for k in pieces(sizes[i], task)]
        if tail_split and len(tasks) > W:  # the last round cut into tail_split pieces each
            tasks = tasks[:-W] + [x / tail_split for x in tasks[-W:] for _ in range(tail_split)]
        return schedule(free_at, tasks, now, rate) + drain

    while True:
        while todo and len(batches) < 2:
            take, need = 1, sizes[todo[0]]
            while take < len(todo) and need + sizes[todo[take]] <= limit // 2:
                need += sizes[todo[take]]
                take += 1
            if ahead and ahead + need > limit:
                if spill and todo[0] not in spilled:
                    n = min(spill, sizes[todo[0]])
                    spilled[todo[0]] = (n, queue(n, t + turn / 2))
                break
            items = [todo.pop(0) for _ in range(take)]
            pre = spilled.pop(items[0], None)
            if pre is None:
                batches.append([items, start(items, t + turn / 2)])
            else:  # the rest of the batch, then the spilled part's copy (40 us)
                rest = sum(sizes[i] for i in items) - pre[0]
                end = max(pre[1] + 40e-6, queue(rest, t + turn / 2))
                batches.append([items, end + drain])
            ahead += need
        if not batches:
            return t
        items, done = batches[0]
        t = max(t, done + turn / 2)
        ahead -= sizes[items.pop(0)]
        if not items:
            batches.pop(0)


def ring(sizes, R, W=8, task=4 * MiB, req=32 * MiB, rate=44e9, drain=0.5e-3, turn=0.8e-3,
         copy_rate=1.0e12, launch=20e-6):
    """Seconds for a design not built (§59): the file's bytes stream into a device ring of R bytes
    in requests of `req`, several in flight; a tensor's allocation is made when it is next to be
    handed out, its bytes copied out of the ring as their requests land (a ring byte is free once
    copied), then the consumer's turn."""
    starts = [0]
    for n in sizes:
        starts.append(starts[-1] + n)
    total, free_at, reqs = starts[-1], [0.0] * W, []
    issued = freed = 0
    t = 0.0

    def fill(now):
        nonlocal issued
        while issued < total and min(issued + req, total) <= freed + R:
            e = min(issued + req, total)
            reqs.append((issued, e, schedule(free_at, pieces(e - issued, task), now, rate) + drain))
            issued = e

    fill(0.0)
    for i, n in enumerate(sizes):
        e = starts[i + 1]
        while reqs and reqs[0][0] < e:  # the requests holding this tensor's bytes
            b, re_, done = reqs.pop(0)
            t = max(t, done + turn / 2) + launch
            freed = max(freed, min(re_, e))
            if re_ > e:  # it also holds later tensors' bytes: landed, kept for them
                reqs.insert(0, (e, re_, done))
            fill(t)
        t += turn / 2 + n / copy_rate
        freed = max(freed, e)
        fill(t)
    return t


def designs():
    """What §59's designs would give on the bench's 4 GiB model, by this model."""
    sizes = sizes_of(4 << 30)
    load = sum(sizes) / 44e9 + 1e-3
    for drain, turn in ((0.5e-3, 0.8e-3), (0.3e-3, 0.5e-3)):
        print(f"drain {drain * 1e3:.1f} ms, turn {turn * 1e3:.1f} ms: as built, 224 MiB ahead "
              f"{load / run(sizes, 224 * MiB, drain=drain, turn=turn):.2f}x; a spill of 32/64 MiB "
              + " / ".join(f"{load / run(sizes, (224 - s) * MiB, drain=drain, turn=turn, spill=s * MiB):.2f}x"
                           for s in (32, 64))
              + "; a ring of 64/96/128/224 MiB "
              + " / ".join(f"{load / ring(sizes, r * MiB, drain=drain, turn=turn):.2f}x"
                           for r in (64, 96, 128, 224)))


def main():
    if "--designs" in sys.argv:
        designs()
        return
    sizes = sizes_of(4 << 30)
    load = sum(sizes) / 44e9 + 1e-3  # load_checkpoint: every part in flight, one turn at the end
    print(f"{len(sizes)} tensors, {sum(sizes) / 2**30:.2f} GiB")
    for turn, drain in ((0.3e-3, 0.5e-3), (0.5e-3, 0.25e-3), (0.7e-3, 0.15e-3)):
        now = load / run(sizes, 192 * MiB, turn=turn, drain=drain)
        big = load / run(sizes, 960 * MiB, turn=turn, drain=drain)
        new = [load / run(sizes, 192 * MiB, turn=turn - cut, drain=drain, tail_split=4)
               for cut in (0.1e-3, 0.2e-3, 0.3e-3)]
        print(f"turn {turn * 1e3:.1f} ms, drain {drain * 1e3:.2f} ms: at a78f91b {now:.2f}x "
              f"(1 GiB: {big:.2f}x); §36 with the hop saving 0.1/0.2/0.3 ms: "
              + " / ".join(f"{x:.2f}x" for x in new))


if __name__ == "__main__":
    main()
