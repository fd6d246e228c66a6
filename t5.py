from common import *
import dataclasses, time, threading, numpy as np
w = get_workload("tiny")
model = build_model(w.preset)
cfg = model.config
obs, noise = random_observation(w, cfg), random_noise(w, cfg)
eng = Engine(model, "exact")
ref = model.sample_actions(obs, noise, 4)
def rep(**kw): return dataclasses.replace(obs, **kw)
d = lambda o: float((eng.sample_actions(o, noise, 4)-ref).abs().max())
tryit("host_prompt_len lies (2 vs 6 valid)", lambda: d(rep(host_prompt_len=2)))
tryit("host_prompt_len too big (16)", lambda: d(rep(host_prompt_len=16)))
tryit("host_prompt_len 100", lambda: d(rep(host_prompt_len=100)))
tryit("host_image_valid lies", lambda: d(rep(host_image_valid=(True,False,False))))
tryit("host_image_valid wrong len", lambda: d(rep(host_image_valid=(True,))))
tryit("host_* None", lambda: d(rep(host_image_valid=None, host_prompt_len=None)))
t=time.perf_counter(); eng.sample_actions(obs, noise, 4); print("4 steps", time.perf_counter()-t)
t=time.perf_counter(); eng.sample_actions(obs, noise, 40); print("40 steps", time.perf_counter()-t)
# determinism
a = eng.sample_actions(obs, noise, 4); b = eng.sample_actions(obs, noise, 4)
print("same noise deterministic:", torch.equal(a,b))
torch.manual_seed(0); a = eng.sample_actions(obs, None, 4); torch.manual_seed(0); b = eng.sample_actions(obs, None, 4)
print("same torch seed deterministic (noise=None):", torch.equal(a,b))
# changing prompt lengths / images: engine vs reference per shape
maxd = 0
for n in [1,2,3,5,8,9,15,16,0]:
    for valid in [(True,True,False),(True,False,False),(False,True,True),(True,True,True)]:
        tm = torch.zeros(1,16,dtype=torch.bool); tm[0,:n]=True
        o = rep(token_mask=tm, host_prompt_len=n, image_mask=torch.tensor([valid]), host_image_valid=valid)
        r = model.sample_actions(o, noise, 4); e = eng.sample_actions(o, noise, 4)
        maxd = max(maxd, float((r-e).abs().max()))
print("max diff over prompt lens x image masks:", maxd)
# batch mixing: B=3 varying prompts vs individually
w3 = w.with_overrides(batch=3)
o3 = random_observation(w3, cfg, seed=5); n3 = random_noise(w3, cfg, seed=5)
o3.token_mask[1, 3:] = False; o3.token_mask[2, 1:] = False
o3.host_prompt_len = 6
a3 = eng.sample_actions(o3, n3, 4)
ind = []
for i in range(3):
    oi = Observation = dataclasses.replace(o3, images=o3.images[i:i+1], image_mask=o3.image_mask[i:i+1], tokens=o3.tokens[i:i+1], token_mask=o3.token_mask[i:i+1], state=o3.state[i:i+1], host_prompt_len=int(o3.token_mask[i].sum()))
    ind.append(eng.sample_actions(oi, n3[i:i+1], 4))
print("batched vs individual:", float((a3-torch.cat(ind)).abs().max()), " ref batched vs engine:", float((model.sample_actions(o3,n3,4)-a3).abs().max()))
# threads
errs=[]; outs={}
def worker(k):
    try:
        for _ in range(10):
            outs.setdefault(k, []).append(eng.sample_actions(obs, noise, 4))
    except Exception as e: errs.append(repr(e))
ts=[threading.Thread(target=worker,args=(k,)) for k in range(2)]
[t.start() for t in ts]; [t.join() for t in ts]
print("threads errors:", errs[:2], "maxdiff:", max(float((x-ref).abs().max()) for v in outs.values() for x in v))
