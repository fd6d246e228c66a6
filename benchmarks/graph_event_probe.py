"""Do timing events recorded inside a CUDA graph time the graph's segments? (session 30)

Four segments of 5, 10, 15 and 20 bf16 4096-cubed matmuls captured in one graph, with an
external timing event (`torch.cuda.Event(enable_timing=True, external=True)`) recorded between
them during the capture. After each replay the events' elapsed times should grow with the
segments' matmul counts, and the events before and after the replay (outside the graph)
should bracket them. `vlaperf breakdown` of a graphed variant rests on this.

    python3 benchmarks/graph_event_probe.py
"""
import torch, time
x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
def fn(events):
    y = x
    for i in range(4):
        if events is not None:
            ev = torch.cuda.Event(enable_timing=True, external=True); ev.record(); events.append(ev)
        for _ in range(5 * (i + 1)):
            y = y @ x
    if events is not None:
        ev = torch.cuda.Event(enable_timing=True, external=True); ev.record(); events.append(ev)
    return y
s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    fn(None)
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph(); events = []
with torch.cuda.graph(g):
    out = fn(events)
for r in range(3):
    a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
    a.record(); g.replay(); b.record(); b.synchronize()
    print("span", a.elapsed_time(b), "stages", [round(events[i].elapsed_time(events[i+1]), 4) for i in range(4)],
          "start->first", round(a.elapsed_time(events[0]), 4), "last->end", round(events[-1].elapsed_time(b), 4))
# expected: stages ~ 5,10,15,20 x one matmul (~0.18 ms at 4096^3)
