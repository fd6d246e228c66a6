"""Do timing events recorded inside a CUDA graph time the graph's segments? (session 30)

Four segments of 5, 10, 15 and 20 bf16 4096-cubed matmuls captured in one graph, with an
external timing event (`torch.cuda.Event(enable_timing=True, external=True)`) recorded between
them during the capture. After each replay the events' elapsed times should grow with the
segments' matmul counts, and the events before and after the replay (outside the graph)
should bracket them. `vlaperf breakdown` of a graphed variant rests on this.

    python3 benchmarks/graph_event_probe.py
"""
import torch

from vlaperf.timing import require_cuda


def segments(x: torch.Tensor, events: list | None) -> torch.Tensor:
    """Four segments of 5, 10, 15 and 20 matmuls; with `events`, a timing event before each and one at the end."""
    y = x
    for i in range(4):
        if events is not None:
            events.append(torch.cuda.Event(enable_timing=True, external=True))  # external: a node of the graph
            events[-1].record()
        for _ in range(5 * (i + 1)):
            y = y @ x
    if events is not None:
        events.append(torch.cuda.Event(enable_timing=True, external=True))
        events[-1].record()
    return y


def main() -> None:
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture
        segments(x, None)
    torch.cuda.current_stream().wait_stream(side)
    graph, events = torch.cuda.CUDAGraph(), []
    with torch.cuda.graph(graph):
        segments(x, events)
    for _ in range(3):
        before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        before.record()
        graph.replay()
        after.record()
        after.synchronize()
        print("span", before.elapsed_time(after),
              "stages", [round(events[i].elapsed_time(events[i + 1]), 4) for i in range(4)],
              "start->first", round(before.elapsed_time(events[0]), 4), "last->end", round(events[-1].elapsed_time(after), 4))


if __name__ == "__main__":
    require_cuda(__file__)
    main()
