#!/usr/bin/env python3
"""A model of ferry.iter_weights' pipeline on the GPU machine (bench/NOTES.md §36): the 4 GiB
Llama of iter_weights_bench.py, read by W workers that take 4 MiB tasks in order from the
requests queued; a request completes `drain` after its last task (the last copy, the stream's
sync); `turn` is the consumer thread's round trip, half to see a read done, half for a read it
then starts to begin. Calibrated to the H100 run at a78f91b (0.82x load_checkpoint at a 256 MiB
budget, 1.02x at 1 GiB), it prints what the changes of §36 should give. CPU only, no ferry:

    /usr/bin/python3 bench/iter_weights_model.py
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


def run(sizes, limit, W=8, task=4 * MiB, rate=44e9, drain=0.25e-3, turn=0.5e-3, tail_split=0):
    """Seconds for iter_weights' schedule (two batches in flight, each at most limit / 2, one
    alone when nothing is ahead) of `sizes` under `limit` (the budget less the staging)."""
    free_at = [0.0] * W
    t, todo, batches, ahead = 0.0, list(range(len(sizes))), [], 0

    def start(items, now):
        tasks = []
        for i in items:
            n = sizes[i]
            while n > 0:
                tasks.append(min(task, n))
                n -= tasks[-1]
        if tail_split and len(tasks) > W:  # the last round cut into tail_split pieces each
            tasks = tasks[:-W] + [x / tail_split for x in tasks[-W:] for _ in range(tail_split)]
        end = 0.0
        for k in tasks:
            w = min(range(W), key=lambda j: free_at[j])
            free_at[w] = max(free_at[w], now) + k / (rate / W)
            end = max(end, free_at[w])
        return end + drain

    while True:
        while todo and len(batches) < 2:
            take, need = 1, sizes[todo[0]]
            while take < len(todo) and need + sizes[todo[take]] <= limit // 2:
                need += sizes[todo[take]]
                take += 1
            if ahead and ahead + need > limit:
                break
            items = [todo.pop(0) for _ in range(take)]
            batches.append([items, start(items, t + turn / 2)])
            ahead += need
        if not batches:
            return t
        items, done = batches[0]
        t = max(t, done + turn / 2)
        ahead -= sizes[items.pop(0)]
        if not items:
            batches.pop(0)


def main():
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
