"""Where the GPU time of one call goes: torch.profiler kernel table for one engine variant.

    python benchmarks/profile_kernels.py --workload libero-pi0 --levers <levers without cuda_graph>
"""
import argparse
import os

import torch
from torch.profiler import ProfilerActivity, profile

from vlaperf.engine import Engine
from vlaperf.inputs import random_noise, random_observation
from vlaperf.models.pi0 import build_model
from vlaperf.workloads import get_workload

p = argparse.ArgumentParser()
p.add_argument("--workload", default="libero-pi0")
p.add_argument("--levers", default="for_loop,skip_masked_images,trim_prompt_padding,static_kv_cache,sdpa,fuse_projections")
p.add_argument("--rows", type=int, default=30)
args = p.parse_args()
w = get_workload(args.workload)
model = build_model(w.preset, "cuda")
engine = Engine(model, args.levers)
obs = random_observation(w, model.config, "cuda")
noise = random_noise(w, model.config, "cuda")
for _ in range(3):
    engine.sample_actions(obs, noise, w.steps)
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    engine.sample_actions(obs, noise, w.steps)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=70))
out = os.environ.get("OUT")
if out:
    prof.export_chrome_trace(os.path.join(out, f"trace_{args.workload}.json"))
