"""The engine's GPU paths on a CUDA device, tiny in bfloat16: what the CPU cannot run for real (Triton's kernels
compiled for the GPU, not interpreted; CUDA graphs; the step kernel). Skipped without CUDA. The speed of these paths
is measured by the benchmarks on the H200, not here."""

import pytest
import torch

from vlaperf.check import REL_L2_TOLERANCE, check_equivalence
from vlaperf.engine import Engine
from vlaperf.engine.levers import GRAPH_GPU
from vlaperf.models.pi0 import build_model, get_config
from vlaperf.workloads import get_workload

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

GRAPH = ",".join(GRAPH_GPU)
VARIANTS = {
    "graph": "graph",  # the exact levers in one CUDA graph
    "kernels": GRAPH + ",triton_kernels",  # the layer kernels, the split-key attention and RoPE + cache write
    "step_kernel": GRAPH + ",triton_kernels,megakernel",  # the whole denoise step in one persistent kernel
}


@pytest.mark.parametrize("pi05", [False, True], ids=["pi0", "pi05"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_gpu_variants_match_the_reference_in_bfloat16(variant, pi05):
    model = build_model(get_config("tiny", pi05=pi05), "cuda", torch.bfloat16, seed=0)
    result = check_equivalence(model, Engine(model, VARIANTS[variant]), get_workload("tiny"))
    assert result["passed"] and result["tolerance"] == REL_L2_TOLERANCE[torch.bfloat16], result


def test_a_graph_is_captured_once_per_prompt_bucket_and_replayed():
    """Prompts of other lengths in the same bucket replay the captured graph; the actions are the reference's."""
    import dataclasses

    from vlaperf.inputs import random_noise, random_observation

    model = build_model("tiny", "cuda", torch.bfloat16, seed=0)
    engine = Engine(model, VARIANTS["step_kernel"])
    w = get_workload("tiny")
    for valid in (5, 6, 7, 8):  # one bucket of 8 kept tokens
        wv = dataclasses.replace(w, prompt_valid=(valid,))
        obs, noise = random_observation(wv, model.config, "cuda", seed=valid), random_noise(wv, model.config, "cuda")
        out, ref = engine.sample_actions(obs, noise, w.steps), model.sample_actions(obs, noise, w.steps)
        rel = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        assert rel <= REL_L2_TOLERANCE[torch.bfloat16], (valid, rel)
    assert engine.graphs.captures == 1


def test_on_the_gpu_a_moved_model_and_a_left_padded_prompt_are_refused():
    """The two checks that read the model's device and the prompt mask, where the mask is read back from the GPU."""
    import dataclasses

    from vlaperf.inputs import random_noise, random_observation

    w = get_workload("tiny")
    model = build_model("tiny", "cuda", torch.bfloat16, seed=0)
    obs, noise = random_observation(w, model.config, "cuda", seed=0), random_noise(w, model.config, "cuda")
    left = dataclasses.replace(obs, tokens=obs.tokens.flip(1), token_mask=obs.token_mask.flip(1), host_prompt_len=None)
    with pytest.raises(ValueError, match="obs.token_mask: sample 0 has padding before a valid token"):
        Engine(model, GRAPH).sample_actions(left, noise, w.steps)
    engine = Engine(model, "for_loop,fuse_projections")
    model.to("cpu")
    with pytest.raises(RuntimeError, match=r"the model was cast or moved since this engine was built \(now "
                                           r"torch.bfloat16 on cpu, the engine's copies torch.bfloat16 on cuda:0\)"):
        engine.sample_actions(obs.to("cpu"), noise.cpu(), w.steps)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_a_graph_on_another_gpu_than_the_current_one_is_the_references():
    """An engine on cuda:1 with cuda:0 current captures and replays its graph on cuda:1 (a capture on the current
    device's stream recorded an empty graph, whose replays returned the capture call's actions), and a first call
    under torch.inference_mode() leaves later plain calls working (the graphs' input buffers are plain tensors)."""
    from vlaperf.inputs import random_noise, random_observation

    assert torch.cuda.current_device() == 0
    model = build_model("tiny", "cuda:1", torch.bfloat16, seed=0)
    engine = Engine(model, "graph")
    w = get_workload("tiny")
    for seed, inference in ((1, True), (2, False), (3, False)):
        obs = random_observation(w, model.config, "cuda:1", seed=seed)
        noise = random_noise(w, model.config, "cuda:1", seed=seed)
        with torch.inference_mode(inference):
            out = engine.sample_actions(obs, noise, w.steps)
        ref = model.sample_actions(obs, noise, w.steps)
        rel = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        assert out.device == torch.device("cuda:1") and rel <= REL_L2_TOLERANCE[torch.bfloat16], (seed, rel)
    assert engine.graphs.captures == 1
