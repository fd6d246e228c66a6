"""vlaperf's engine inside LeRobot's policy object (vlaperf.compare.accelerate).

On the CPU without LeRobot, a stand-in with LeRobot's shape (a policy with a `config` and a core `model` whose
modules carry transformers-style configs and whose `sample_actions` takes LeRobot's positional inputs) checks the
plumbing: the accelerated call equals the stand-in's own, each new input shape is checked once, a failing check
answers with an error, not actions. Where LeRobot 0.6 imports (Python >= 3.12), the `slow` tests do the same with
LeRobot's own reduced pi0 and pi0.5 through its `predict_action_chunk` and `select_action`.
"""

from types import SimpleNamespace

import pytest
import torch

from vlaperf.compare import accelerate as acc
from vlaperf.compare import lerobot as lr
from vlaperf.inputs import IMAGE_SLOTS, Observation, random_observation
from vlaperf.models.pi0 import RTC_SCHEDULES, Guidance, Pi0Model, get_config, init_random_, rtc_prefix_weights, rtc_step_weights
from vlaperf.workloads import get_workload

needs_lerobot = pytest.mark.skipif(not lr.lerobot_available(), reason=lr.LEROBOT_MISSING)
STEPS = 3  # the stand-in policy's num_inference_steps


def _hf_gemma(g):
    return SimpleNamespace(hidden_size=g.width, num_hidden_layers=g.depth, intermediate_size=g.mlp_dim,
                           num_attention_heads=g.num_heads, num_key_value_heads=g.num_kv_heads, head_dim=g.head_dim,
                           vocab_size=g.vocab_size, rms_norm_eps=g.eps, rope_parameters={"rope_theta": g.rope_base})


class _Core(Pi0Model):
    """LeRobot's core model at the tiny size: openpi's module names, transformers-style configs on PaliGemma and
    the expert, LeRobot's `sample_noise`, and a `sample_actions` with LeRobot's positional inputs that runs vlaperf's
    reference (plus `offset`, and `guided_offset` on a guided call). `calls` counts its calls, `noise_draws` its noise
    draws."""

    def __init__(self, cfg, offset=0.0):
        super().__init__(cfg)
        self.offset, self.calls, self.noise_draws = offset, 0, 0
        self.guided_offset = 0.0
        self.rtc_config = self.rtc_processor = None  # LeRobot's RTC, set by the policy
        v = cfg.vision
        self.paligemma_with_expert.paligemma.config = SimpleNamespace(
            text_config=_hf_gemma(cfg.backbone),
            vision_config=SimpleNamespace(hidden_size=v.width, num_hidden_layers=v.depth, intermediate_size=v.mlp_dim,
                                          num_attention_heads=v.num_heads, patch_size=v.patch_size,
                                          image_size=v.image_size, layer_norm_eps=v.eps))
        self.paligemma_with_expert.gemma_expert.config = _hf_gemma(cfg.expert)

    def sample_noise(self, shape, device):
        self.noise_draws += 1
        return torch.normal(0.0, 1.0, size=shape, dtype=torch.float32, device=device)

    @torch.no_grad()
    def sample_actions(self, images, img_masks, lang_tokens, lang_masks, *state, noise=None, num_steps=None,
                       inference_delay=None, prev_chunk_left_over=None, execution_horizon=None):
        assert len(state) == (0 if self.config.pi05 else 1)  # pi0.5's state is in its prompt
        self.calls += 1
        B = lang_tokens.shape[0]
        H, A = self.config.action_horizon, self.config.action_dim
        obs = Observation(torch.stack(images, 1), torch.stack(img_masks, 1), lang_tokens, lang_masks,
                          state[0] if state else torch.zeros(B, A))
        if noise is None:
            noise = self.sample_noise((B, H, A), obs.state.device)
        steps = STEPS if num_steps is None else num_steps
        guidance = None
        if self.rtc_config is not None and self.rtc_config.enabled and prev_chunk_left_over is not None:
            # LeRobot's RTC: the leftover zero-padded to the chunk, its prefix weights, the paper's step weights
            if prev_chunk_left_over.dim() == 2:  # LeRobot adds the batch axis
                prev_chunk_left_over = prev_chunk_left_over[None]
            T, used = prev_chunk_left_over.shape[1], prev_chunk_left_over.shape[2]
            target = torch.zeros(B, H, A)
            target[:, :T, :used] = prev_chunk_left_over
            horizon = min(execution_horizon or self.rtc_config.execution_horizon, T)
            guidance = Guidance(target, self.rtc_processor.get_prefix_weights(inference_delay, horizon, H),
                                rtc_step_weights(steps, self.rtc_config.max_guidance_weight))
        return Pi0Model.sample_actions(self, obs, noise, steps, guidance) + self.offset + \
            (self.guided_offset if guidance is not None else 0.0)


def _prefix_weights(start, end, total):
    """LeRobot's linear RTC schedule, as the stand-in's rtc_processor: 1 up to the delay, down to 0 by the horizon."""
    w = torch.zeros(total)
    w[:start] = 1.0
    for i in range(start, end):
        w[i] = (end - i) / (end - start + 1)
    return w


class _Policy(torch.nn.Module):
    """LeRobot's PI0Policy / PI05Policy at the tiny size: `config` holds the fields the accelerator reads;
    `predict_action_chunk` takes the batch LeRobot's processors hand it and calls the core as LeRobot's does: the
    present cameras mapped from [0, 1] to [-1, 1] and marked valid, the absent ones padded after them as masked
    images of -1."""

    name = "pi0"  # LeRobot's policy classes name their type (PI05Policy: "pi05")

    def __init__(self, pi05=False, offset=0.0, rtc=None, **config):
        super().__init__()
        cfg = get_config("tiny", pi05=pi05)
        self.model = _Core(cfg, offset)
        self.model.rtc_config, self.model.rtc_processor = rtc, SimpleNamespace(get_prefix_weights=_prefix_weights)
        init_random_(self.model, 0)
        self.model.eval()
        R = cfg.vision.image_size
        self.config = SimpleNamespace(max_state_dim=cfg.action_dim, max_action_dim=cfg.action_dim,
                                      chunk_size=cfg.action_horizon, tokenizer_max_length=cfg.max_token_len,
                                      image_resolution=(R, R), num_inference_steps=STEPS, dtype="float32", rtc_config=rtc)
        vars(self.config).update(config)

    def init_rtc_processor(self):  # LeRobot's: the processor reads the policy's rtc_config
        self.model.rtc_config = self.config.rtc_config

    def predict_action_chunk(self, batch, **kwargs):
        self.eval()  # as LeRobot's, on every call
        cameras = [f"observation.images.{slot}" for slot in IMAGE_SLOTS]
        images = [batch[k] * 2 - 1 for k in cameras if k in batch]
        B = images[0].shape[0]
        masks = [torch.ones(B, dtype=torch.bool) for _ in images]
        for _ in range(len(cameras) - len(images)):
            images.append(-torch.ones_like(images[0]))
            masks.append(torch.zeros(B, dtype=torch.bool))
        args = (images, masks, batch["observation.language.tokens"], batch["observation.language.attention_mask"])
        if not self.model.config.pi05:
            args += (batch["observation.state"],)
        return self.model.sample_actions(*args, **kwargs)


def _inputs(valid=None, seed=0):
    """The batch LeRobot's predict_action_chunk takes for tiny's random observation (`valid`: which cameras)."""
    obs = random_observation(get_workload("tiny"), get_config("tiny"), seed=seed)
    if valid is not None:
        obs.image_mask[:] = torch.tensor(valid)
        obs.host_image_valid = tuple(valid)
    return lr.predict_batch(obs)


@pytest.mark.parametrize("pi05", [False, True], ids=["pi0", "pi05"])
def test_accelerated_policy_gives_its_own_actions_and_checks_each_shape_once(pi05):
    policy = _Policy(pi05=pi05)
    torch.manual_seed(7)
    theirs = policy.predict_action_chunk(_inputs())
    fast = acc.accelerate_lerobot(policy, levers="exact")
    assert fast.levers == "for_loop+skip_masked_images+trim_prompt_padding+static_kv_cache+sdpa+fuse_projections"
    # the fused projections are held once: vlaperf's reference copies of them are freed
    assert fast.model.reference_released and fast.released_bytes > 0
    torch.manual_seed(7)  # no noise given: LeRobot's own sample_noise draws it, so the seed gives the same draw
    ours = policy.predict_action_chunk(_inputs())
    assert policy.model.noise_draws == 2  # one draw a call, the accelerator's, handed to the check's LeRobot call
    assert ours.dtype == torch.float32 and ours.shape == theirs.shape
    assert ((ours - theirs).norm() / theirs.norm()).item() < 1e-5
    wl = get_workload("tiny")
    [check] = fast.checks
    assert check["passed"] and check["rel_l2"] < 1e-5 and check["tolerance"] == 1e-4
    assert (check["batch"], check["image_slots"], check["images_valid"]) == (wl.batch, 3, list(wl.image_valid))
    assert (check["prompt_len"], check["prompt_slots"], check["num_steps"]) == (max(wl.prompt_valid), 16, 3)
    calls = policy.model.calls
    torch.manual_seed(7)
    again = policy.predict_action_chunk(_inputs())
    assert policy.model.calls == calls and len(fast.checks) == 1  # a checked shape runs the engine alone
    assert torch.equal(again, ours)
    policy.predict_action_chunk(_inputs(valid=[True, False, False]))  # another camera empty: a new shape, checked
    policy.predict_action_chunk(_inputs(), num_steps=2)  # another step count: checked too
    assert policy.model.calls == calls + 2
    assert [c["images_valid"] for c in fast.checks[1:]] == [[True, False, False], list(wl.image_valid)]
    assert [c["num_steps"] for c in fast.checks] == [3, 3, 2]


def test_explicit_noise_is_used_and_no_noise_is_drawn():
    policy = _Policy()
    fast = acc.accelerate_lerobot(policy, levers="exact", check=False)
    cfg = policy.model.config
    noise = torch.randn(1, cfg.action_horizon, cfg.action_dim)
    ours = policy.predict_action_chunk(_inputs(), noise=noise)
    assert policy.model.noise_draws == 0 and policy.model.calls == 0 and fast.checks == []
    obs_inputs = _inputs()
    fast.restore()
    theirs = policy.predict_action_chunk(obs_inputs, noise=noise)
    assert ((ours - theirs).norm() / theirs.norm()).item() < 1e-5


def test_a_shape_that_fails_its_check_answers_with_an_error_every_time():
    policy = _Policy(offset=1.0)  # the stand-in's actions are off by 1: vlaperf's are not equivalent to them
    fast = acc.accelerate_lerobot(policy, levers="exact")
    for attempt in (1, 2):  # not remembered as passed: checked (and refused) again
        with pytest.raises(acc.NotEquivalent, match=r"not equivalent to LeRobot's sample_actions for this input "
                                                      r"shape: rel L2 .* > tolerance 0.0001"):
            policy.predict_action_chunk(_inputs())
        assert len(fast.checks) == attempt and not fast.checks[-1]["passed"]
    unchecked = _Policy(offset=1.0)
    acc.accelerate_lerobot(unchecked, levers="exact", check=False)
    unchecked.predict_action_chunk(_inputs())  # check=False: the user's choice, no LeRobot call
    assert unchecked.model.calls == 0


def test_restore_gives_the_call_back_to_lerobot_and_accelerating_twice_is_refused():
    policy = _Policy()
    fast = acc.accelerate_lerobot(policy, levers="exact")
    with pytest.raises(ValueError, match="already accelerated; call restore"):
        acc.accelerate_lerobot(policy, levers="exact")
    fast.restore()
    assert "sample_actions" not in vars(policy.model)
    policy.predict_action_chunk(_inputs())
    assert policy.model.calls == 1 and fast.checks == []
    fast.restore()  # a second restore leaves LeRobot's method alone
    again = acc.accelerate_lerobot(policy, levers="exact")
    other = _Policy()
    other_fast = acc.accelerate_lerobot(other, levers="exact")
    fast.restore()  # an old accelerator's restore does not undo the policy's new one
    assert vars(policy.model)["sample_actions"] == again.sample_actions
    with pytest.raises(ValueError, match="already accelerated; call restore"):
        fast.install()  # nor does its install replace it
    other_fast.restore()


def test_the_policys_eval_walks_its_modules_only_after_a_train(monkeypatch):
    """LeRobot's predict calls eval() first, every call (3.8 ms of module walking for the full pi0 on an H100's host):
    accelerated, it walks only where something was switched to training mode since; restore() puts LeRobot's back."""
    walked = []
    train = torch.nn.Module.train
    monkeypatch.setattr(torch.nn.Module, "train", lambda self, mode=True: (walked.append(self), train(self, mode))[1])
    policy = _Policy()  # built in training mode, as any nn.Module
    fast = acc.accelerate_lerobot(policy, levers="exact")
    walked.clear()
    policy.predict_action_chunk(_inputs())
    assert walked and not policy.training  # the first call's eval() walks
    walked.clear()
    policy.predict_action_chunk(_inputs())
    assert policy.eval() is policy and walked == []  # in eval mode already: nothing to walk
    policy.train()
    walked.clear()
    policy.predict_action_chunk(_inputs())
    assert walked and not any(m.training for m in policy.modules())  # the whole tree back in eval mode
    policy.model.train()  # the core alone
    policy.eval()
    assert not any(m.training for m in policy.modules())
    other = _Policy()
    other_fast = acc.accelerate_lerobot(other, levers="exact")
    other_fast.restore()
    assert vars(policy)["eval"] == fast._eval and "eval" not in vars(other)  # each accelerator its own policy's
    fast.restore()
    assert "eval" not in vars(policy)
    walked.clear()
    policy.eval()
    assert walked  # LeRobot's (torch's) eval again
    fast.install()
    assert vars(policy)["eval"] == fast._eval
    fast.restore()


def test_a_step_kernel_fault_reaches_the_caller_instead_of_actions(monkeypatch):
    """`megakernel`'s barrier timeout (GPU only) is read after every engine call, checked shapes and later ones."""
    policy = _Policy()
    fast = acc.accelerate_lerobot(policy, levers="exact")
    faults = []

    def fault():
        faults.append(1)
        if len(faults) > 1:
            raise RuntimeError("megakernel: a grid barrier of the step kernel timed out")

    monkeypatch.setattr(fast.engine, "raise_on_kernel_fault", fault)
    policy.predict_action_chunk(_inputs())  # the checked first call reads the flag too
    with pytest.raises(RuntimeError, match="grid barrier"):
        policy.predict_action_chunk(_inputs())
    assert len(faults) == 2


def _rtc(enabled=True, debug=False):
    return SimpleNamespace(enabled=enabled, execution_horizon=6, max_guidance_weight=5.0, debug=debug,
                           prefix_attention_schedule="linear")


def _leftover(B=1, T=7, A=5, seed=3):
    """The previous chunk's unexecuted actions: shorter than the chunk, in fewer dimensions than the padded ones."""
    return torch.randn(B, T, A, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("pi05", [False, True], ids=["pi0", "pi05"])
def test_real_time_chunking_is_guided_as_lerobots_own_call(pi05):
    policy = _Policy(pi05=pi05, rtc=_rtc())
    noise = torch.randn(1, 10, 8, generator=torch.Generator().manual_seed(0))
    rtc = dict(inference_delay=2, prev_chunk_left_over=_leftover(), execution_horizon=5)
    theirs = policy.predict_action_chunk(_inputs(), noise=noise, **rtc)
    plain = policy.predict_action_chunk(_inputs(), noise=noise)
    assert ((theirs - plain).norm() / plain.norm()).item() > 0.05  # the guidance moves the chunk
    fast = acc.accelerate_lerobot(policy, levers="exact")
    ours = policy.predict_action_chunk(_inputs(), noise=noise, **rtc)
    assert ((ours - theirs).norm() / theirs.norm()).item() < 1e-5
    assert [c["guided"] for c in fast.checks] == [True] and fast.checks[0]["passed"]
    # another delay and leftover: the same shapes, no new check, LeRobot's own answer for those values
    rtc2 = dict(inference_delay=1, prev_chunk_left_over=_leftover(T=4, seed=4), execution_horizon=None)
    ours2 = policy.predict_action_chunk(_inputs(), noise=noise, **rtc2)
    assert len(fast.checks) == 1
    fast.restore()
    theirs2 = policy.predict_action_chunk(_inputs(), noise=noise, **rtc2)
    fast.install()
    assert ((ours2 - theirs2).norm() / theirs2.norm()).item() < 1e-5
    # a leftover without its batch axis, and the config's guidance weight changed between calls: LeRobot's answer
    policy.config.rtc_config.max_guidance_weight = 2.0
    rtc3 = dict(inference_delay=1, prev_chunk_left_over=_leftover(T=4, seed=4)[0], execution_horizon=None)
    ours3 = policy.predict_action_chunk(_inputs(), noise=noise, **rtc3)
    fast.restore()
    theirs3 = policy.predict_action_chunk(_inputs(), noise=noise, **rtc3)
    fast.install()
    assert ((ours3 - theirs3).norm() / theirs3.norm()).item() < 1e-5 and not torch.equal(theirs3, theirs2)
    # the first chunk of an episode has no leftover: unguided, as LeRobot, and a shape of its own to check
    first = policy.predict_action_chunk(_inputs(), noise=noise, inference_delay=2, prev_chunk_left_over=None)
    assert ((first - plain).norm() / plain.norm()).item() < 1e-5
    assert [c["guided"] for c in fast.checks] == [True, False]


def test_rtc_arguments_without_rtc_in_the_config_are_ignored_as_lerobot_ignores_them():
    policy = _Policy(rtc=_rtc(enabled=False))
    noise = torch.randn(1, 10, 8)
    plain = policy.predict_action_chunk(_inputs(), noise=noise)
    acc.accelerate_lerobot(policy, levers="exact")
    ours = policy.predict_action_chunk(_inputs(), noise=noise, inference_delay=2, prev_chunk_left_over=_leftover())
    assert ((ours - plain).norm() / plain.norm()).item() < 1e-5


def test_rtc_debug_tracking_and_bad_rtc_arguments_are_refused():
    with pytest.raises(ValueError, match=r"policy.config.rtc_config.debug: RTC's debug tracking"):
        acc.accelerate_lerobot(_Policy(rtc=_rtc(debug=True)), levers="exact")
    policy = _Policy(rtc=_rtc())
    acc.accelerate_lerobot(policy, levers="exact")
    with pytest.raises(ValueError, match=r"prev_chunk_left_over: expected a tensor \(B=1 or 1, T <= 10, A <= 8\) or "
                                         r"\(T, A\), got \(1, 11, 5\)"):
        policy.predict_action_chunk(_inputs(), inference_delay=2, prev_chunk_left_over=_leftover(T=11))
    with pytest.raises(ValueError, match=r"prev_chunk_left_over: expected a tensor .* got list"):
        policy.predict_action_chunk(_inputs(), inference_delay=2, prev_chunk_left_over=[[0.0] * 5])
    with pytest.raises(ValueError, match=r"inference_delay: expected an integer >= 0 with prev_chunk_left_over, got None"):
        policy.predict_action_chunk(_inputs(), prev_chunk_left_over=_leftover())
    with pytest.raises(TypeError, match=r"unexpected arguments \['temperature'\]"):
        policy.predict_action_chunk(_inputs(), temperature=0.5)


def test_bad_inputs_are_named():
    policy = _Policy()
    acc.accelerate_lerobot(policy, levers="exact")
    batch = _inputs()
    left = torch.zeros_like(batch["observation.language.attention_mask"])
    left[:, -3:] = True
    with pytest.raises(ValueError, match=r"lang_masks \(openpi: tokenized_prompt_mask\): a prompt has padding before a valid token"):
        policy.predict_action_chunk({**batch, "observation.language.attention_mask": left})
    with pytest.raises(ValueError, match=r"obs.state: expected a float tensor \(B, 8\)"):
        policy.predict_action_chunk({**batch, "observation.state": batch["observation.state"][:, :5]})
    images = [batch["observation.images.base_0_rgb"]] * 3
    masks = [torch.ones(1, dtype=torch.bool)] * 2
    tokens, token_mask = batch["observation.language.tokens"], batch["observation.language.attention_mask"]
    with pytest.raises(ValueError, match="images / img_masks: 3 images and 2 masks"):
        policy.model.sample_actions(images, masks, tokens, token_mask, batch["observation.state"])
    with pytest.raises(TypeError, match="pi0's `state`"):
        policy.model.sample_actions(images, masks + masks[:1], tokens, token_mask)
    with pytest.raises(TypeError, match="8 positional arguments, expected at most 7"):
        policy.model.sample_actions(images, masks + masks[:1], tokens, token_mask, batch["observation.state"], None, 3, 0)


@pytest.mark.parametrize("field,value,message", [
    ("max_state_dim", 32, r"policy.config.max_state_dim: 32, expected the max_action_dim \(8\)"),
    ("dtype", "float16", r"policy.config.dtype: 'float16', expected 'bfloat16' or 'float32'"),
    ("image_resolution", (224, 224), r"policy.config.image_resolution: \(224, 224\), expected the SigLIP tower's "
                                     r"square 56 x 56"),
])
def test_a_policy_config_vlaperf_cannot_build_is_named(field, value, message):
    with pytest.raises(ValueError, match=message):
        acc.accelerate_lerobot(_Policy(**{field: value}), levers="exact")


def test_not_a_lerobot_policy_is_a_type_error():
    with pytest.raises(TypeError, match=r"policy: expected LeRobot's PI0Policy or PI05Policy .* got Linear"):
        acc.accelerate_lerobot(torch.nn.Linear(2, 2))


def test_model_config_read_from_the_modules_configs():
    policy = _Policy(pi05=True)
    got = lr.lerobot_model_config(policy)
    want = get_config("tiny", pi05=True)
    assert (got.name, got.pi05) == ("lerobot-pi05", True)
    assert (got.vision, got.backbone, got.expert) == (want.vision, want.backbone, want.expert)
    assert (got.action_dim, got.action_horizon, got.max_token_len) == (8, 10, 16)
    text = policy.model.paligemma_with_expert.paligemma.config.text_config
    del text.rope_parameters
    text.rope_theta = 500.0  # transformers 4 keeps the base here
    assert lr.lerobot_model_config(policy).backbone.rope_base == 500.0


# ------------------------------------------------------------ with LeRobot (CPU)


def _lerobot_policy(pi05: bool, dtype=torch.float32):
    """LeRobot's own reduced pi0 / pi0.5 (CPU) with input features: two of three cameras in the batch."""
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.utils.constants import ACTION, OBS_STATE

    cfg = lr.matching_config(get_workload("libero-pi05" if pi05 else "libero-pi0"), lr.Reduced())
    policy = lr.build_lerobot(cfg, "cpu", dtype, steps=3, reduced=True)
    lr.randomize_lerobot_(policy, 0)
    camera = PolicyFeature(FeatureType.VISUAL, (3, 224, 224))
    policy.config.input_features = {f"observation.images.{name}": camera for name in
                                    ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")}
    policy.config.input_features[OBS_STATE] = PolicyFeature(FeatureType.STATE, (8,))
    policy.config.output_features = {ACTION: PolicyFeature(FeatureType.ACTION, (7,))}
    policy.config.n_action_steps = 5
    return policy


def _lerobot_batch(seed=0):
    from lerobot.utils.constants import OBS_LANGUAGE_ATTENTION_MASK, OBS_LANGUAGE_TOKENS, OBS_STATE

    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(1, 48, dtype=torch.bool)
    mask[:, :12] = True
    return {"observation.images.base_0_rgb": torch.rand(1, 3, 256, 256, generator=g),  # LeRobot resizes it
            "observation.images.left_wrist_0_rgb": torch.rand(1, 3, 224, 224, generator=g),
            OBS_STATE: torch.rand(1, 8, generator=g),
            OBS_LANGUAGE_TOKENS: torch.randint(1, 1000, (1, 48), generator=g) * mask,
            OBS_LANGUAGE_ATTENTION_MASK: mask}


@needs_lerobot
@pytest.mark.slow
@pytest.mark.parametrize("pi05", [False, True], ids=["pi0", "pi05"])
def test_lerobot_policy_accelerated_through_its_own_predict_and_select(pi05):
    policy = _lerobot_policy(pi05)
    batch = _lerobot_batch()
    torch.manual_seed(1)
    theirs = policy.predict_action_chunk(batch)
    fast = acc.accelerate_lerobot(policy)  # "best" on the CPU: the exact levers
    torch.manual_seed(1)
    ours = policy.predict_action_chunk(batch)
    assert ours.shape == theirs.shape == (1, policy.config.chunk_size, 7)
    assert ((ours - theirs).norm() / theirs.norm()).item() < 1e-4
    [check] = fast.checks
    assert check["passed"] and check["images_valid"] == [True, True, False] and check["prompt_len"] == 12
    policy.reset()
    first = policy.select_action(batch)  # LeRobot's queue: one chunk, n_action_steps of it
    assert first.shape == (1, 7) and len(policy._action_queue) == 4 and len(fast.checks) == 1
    fast.restore()
    torch.manual_seed(1)
    assert torch.equal(policy.predict_action_chunk(batch), theirs)  # LeRobot's own call, bit for bit


@needs_lerobot
@pytest.mark.slow
@pytest.mark.parametrize("pi05", [False, True], ids=["pi0", "pi05"])
def test_lerobot_real_time_chunking_accelerated(pi05):
    """LeRobot's own RTC (its RTCConfig and RTCProcessor, the linear schedule) through predict_action_chunk with
    the previous chunk's leftover, as LeRobot's RTC loop passes it: vlaperf's guided engine against LeRobot's own
    guided call, where the guidance moves the chunk far beyond the tolerance."""
    from lerobot.policies.rtc.configuration_rtc import RTCConfig

    policy = _lerobot_policy(pi05)
    policy.config.rtc_config = RTCConfig(enabled=True, execution_horizon=6, max_guidance_weight=5.0)
    policy.init_rtc_processor()
    batch = _lerobot_batch()
    rtc = dict(inference_delay=2, prev_chunk_left_over=_leftover(T=policy.config.chunk_size - 3, A=7),
               execution_horizon=6)
    torch.manual_seed(1)
    theirs = policy.predict_action_chunk(batch, **rtc)
    torch.manual_seed(1)
    plain = policy.predict_action_chunk(batch)
    assert ((theirs - plain).norm() / plain.norm()).item() > 0.1
    fast = acc.accelerate_lerobot(policy)
    torch.manual_seed(1)
    ours = policy.predict_action_chunk(batch, **rtc)
    assert ((ours - theirs).norm() / theirs.norm()).item() < 1e-4
    [check] = fast.checks
    assert check["guided"] and check["passed"]


@needs_lerobot
def test_rtc_prefix_weights_are_lerobots():
    """vlaperf's own prefix weights (its server's real-time chunking) against LeRobot's RTCProcessor, every schedule,
    delays and execution horizons around and past the chunk."""
    from lerobot.configs.types import RTCAttentionSchedule
    from lerobot.policies.rtc.configuration_rtc import RTCConfig
    from lerobot.policies.rtc.modeling_rtc import RTCProcessor

    for schedule in RTC_SCHEDULES:
        processor = RTCProcessor(RTCConfig(prefix_attention_schedule=RTCAttentionSchedule[schedule.upper()]))
        for delay in range(0, 13, 3):
            for horizon in (1, 4, 10, 12, 20):
                theirs = processor.get_prefix_weights(delay, horizon, 10).float()
                ours = rtc_prefix_weights(delay, horizon, 10, schedule)
                assert torch.allclose(ours, theirs, atol=1e-6), (schedule, delay, horizon)


@needs_lerobot
@pytest.mark.slow
def test_lerobot_policy_in_bfloat16_accelerated_within_the_bfloat16_tolerance():
    """LeRobot as shipped under bfloat16 keeps SigLIP in float32; vlaperf's engine runs openpi's layout."""
    policy = _lerobot_policy(pi05=False, dtype=torch.bfloat16)
    fast = acc.accelerate_lerobot(policy)
    assert fast.model.dtype == torch.bfloat16
    actions = policy.predict_action_chunk(_lerobot_batch())
    [check] = fast.checks
    assert actions.dtype == torch.float32 and check["passed"] and check["tolerance"] == 3e-2


@needs_lerobot
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_full_size_lerobot_policy_accelerated_with_best_on_the_gpu():
    """libero-pi0 at full size in bfloat16 as LeRobot builds it, accelerated with `best` (one CUDA graph, compile, the
    hand-written kernels): the first call compiles, captures and passes its check; the next replays the graph."""
    wl = get_workload("libero-pi0")
    cfg = lr.matching_config(wl)
    policy = lr.build_lerobot(cfg, "cuda", torch.bfloat16)
    lr.randomize_lerobot_(policy, 0)
    obs = random_observation(wl, cfg, "cuda")
    lr.set_predict_features(policy, obs)
    batch = lr.predict_batch(obs)
    torch.manual_seed(1)
    theirs = policy.predict_action_chunk(batch)
    fast = acc.accelerate_lerobot(policy)
    assert "cuda_graph" in fast.levers and fast.released_bytes > 0
    torch.manual_seed(1)
    ours = policy.predict_action_chunk(batch)
    [check] = fast.checks
    assert check["passed"] and check["images_valid"] == list(wl.image_valid), check
    assert ((ours - theirs).norm() / theirs.norm()).item() < 3e-2
    torch.manual_seed(1)
    again = policy.predict_action_chunk(batch)  # the graph, replayed: no second check
    assert ((again - ours).norm() / ours.norm()).item() < 1e-3 and len(fast.checks) == 1
    policy.reset()
    assert policy.select_action(batch).shape == (1, cfg.action_dim)


@needs_lerobot
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_full_size_lerobot_real_time_chunking_with_best_on_the_gpu():
    """libero-pi0 at full size in bfloat16 with LeRobot's RTC on: the guided call through `best`'s CUDA graph,
    checked once; a second leftover and delay replay that graph and still give LeRobot's own guided actions."""
    from lerobot.policies.rtc.configuration_rtc import RTCConfig

    wl = get_workload("libero-pi0")
    cfg = lr.matching_config(wl)
    policy = lr.build_lerobot(cfg, "cuda", torch.bfloat16)
    lr.randomize_lerobot_(policy, 0)
    policy.config.rtc_config = RTCConfig(enabled=True, execution_horizon=20, max_guidance_weight=10.0)
    policy.init_rtc_processor()
    obs = random_observation(wl, cfg, "cuda")
    lr.set_predict_features(policy, obs)
    batch = lr.predict_batch(obs)
    calls = [dict(inference_delay=4, prev_chunk_left_over=_leftover(T=40, A=7).cuda(), execution_horizon=20),
             dict(inference_delay=7, prev_chunk_left_over=_leftover(T=30, A=7, seed=8).cuda(), execution_horizon=25)]
    theirs = []
    for rtc in calls:
        torch.manual_seed(1)
        theirs.append(policy.predict_action_chunk(batch, **rtc))
    fast = acc.accelerate_lerobot(policy)
    for rtc, want in zip(calls, theirs):
        torch.manual_seed(1)
        ours = policy.predict_action_chunk(batch, **rtc)
        assert ((ours - want).norm() / want.norm()).item() < 3e-2
    [check] = fast.checks
    assert check["guided"] and check["passed"], check
    assert fast.engine.graphs.captures == 1


# ------------------------------------------------------------ `vlaperf compare --accelerate`


@pytest.fixture
def compare_stand_in(monkeypatch):
    """compare_lerobot with the stand-in policy in LeRobot's place (its features need no setting)."""
    monkeypatch.setattr(lr, "import_lerobot", lambda pi05: SimpleNamespace())
    monkeypatch.setattr(lr, "lerobot_version", lambda: None)
    monkeypatch.setattr(lr, "matching_config", lambda wl, reduced=None: get_config("tiny"))
    monkeypatch.setattr(lr, "build_lerobot", lambda cfg, device, dtype, steps=10, reduced=False: _Policy())
    monkeypatch.setattr(lr, "set_predict_features", lambda policy, obs: None)
    monkeypatch.setattr(lr, "_rtc_config_class", lambda: lambda enabled: SimpleNamespace(
        enabled=enabled, execution_horizon=6, max_guidance_weight=5.0, prefix_attention_schedule="linear", debug=False))


def test_time_lerobot_times_lerobots_predict_as_shipped_and_accelerated(compare_stand_in):
    run = lr.compare_lerobot("tiny", device="cpu", steps=STEPS, reduced=True, levers="exact")
    before = run.policy.model.calls
    timing = lr.time_lerobot(run, warmup=1, iters=2, lerobot_compile=None, progress=False, accelerated=True)
    assert list(timing["summary"]) == ["lerobot", "vlaperf_reference", "vlaperf_exact", "lerobot_predict",
                                       "vlaperf_in_lerobot_predict"]
    assert timing["settled"] == ["vlaperf_exact", "vlaperf_in_lerobot_predict"]  # the rows that are not eager
    a = timing["accelerated"]
    assert a["levers"] == run.engine.name
    assert a["vs_lerobot_predict"]["passed"] and a["vs_lerobot_predict"]["rel_l2"] < 1e-5
    assert a["vs_lerobot_core"]["rel_l2"] < 1e-6  # the batch round trip ([0, 1] frames, padded camera) loses nothing
    [check] = a["checks"]
    assert check["passed"] and check["images_valid"] == list(get_workload("tiny").image_valid)
    assert set(a["first_call_s"]) == {"lerobot_predict", "vlaperf_in_lerobot_predict"}
    # LeRobot's core ran 3 times for `lerobot` and 3 for `lerobot_predict` (a first call, then 2 rounds), once for
    # the shipped predict's output and once for the accelerator's check: never in an accelerated call
    assert run.policy.model.calls - before == 8
    assert "sample_actions" not in vars(run.policy.model)  # LeRobot's own call again after the timing


def test_time_lerobot_times_lerobots_rtc_as_shipped_and_accelerated(compare_stand_in):
    run = lr.compare_lerobot("tiny", device="cpu", steps=STEPS, reduced=True, levers="exact")
    timing = lr.time_lerobot(run, warmup=1, iters=2, lerobot_compile=None, progress=False, accelerated=True, rtc=True)
    assert list(timing["summary"])[-2:] == ["lerobot_predict_rtc", "vlaperf_in_lerobot_predict_rtc"]
    assert timing["settled"] == ["vlaperf_exact", "vlaperf_in_lerobot_predict", "vlaperf_in_lerobot_predict_rtc"]
    r = timing["accelerated"]["rtc"]
    assert r["vs_lerobot_predict_rtc"]["passed"] and r["vs_lerobot_predict_rtc"]["rel_l2"] < 1e-5
    assert r["guidance_moves"] > 0.05  # the guided rows are guided
    assert (r["inference_delay"], r["leftover_len"], r["execution_horizon"]) == (3, 5, 6)
    assert [c["guided"] for c in timing["accelerated"]["checks"]] == [False, True]
    assert not run.policy.config.rtc_config.enabled  # RTC on inside its own rows only
    assert "sample_actions" not in vars(run.policy.model)


def test_time_lerobot_records_the_accelerators_refusal_and_times_the_other_rows(compare_stand_in):
    """The accelerator's check refusing the accelerated row's set-up call is a finding, not a crash: the row is left
    out, the refusal recorded with its check's numbers, and the rows already set up (LeRobot's, vlaperf's core)
    timed. No RTC row after a refused plain row: the accelerator already failed on this observation."""
    run = lr.compare_lerobot("tiny", device="cpu", steps=STEPS, reduced=True, levers="exact")
    assert run.result["passed"]
    run.policy.model.offset = 1.0  # LeRobot's core now answers 1 off: only the accelerator's check sees it
    timing = lr.time_lerobot(run, warmup=1, iters=2, lerobot_compile=None, progress=False, accelerated=True, rtc=True)
    assert list(timing["summary"]) == ["lerobot", "vlaperf_reference", "vlaperf_exact", "lerobot_predict"]
    assert timing["settled"] == ["vlaperf_exact"]
    a = timing["accelerated"]
    refused = a["refused"]
    assert refused["row"] == "vlaperf_in_lerobot_predict"
    assert refused["message"].startswith(f"vlaperf's {run.engine.name} is not equivalent to LeRobot's sample_actions "
                                         "for this input shape: rel L2 ")
    check = refused["check"]
    assert check is a["checks"][-1] and not check["passed"] and not check["guided"]
    assert check["rel_l2"] > check["tolerance"] and check["max_abs"] > 0.5
    assert "vs_lerobot_predict" not in a and "rtc" not in a  # nothing of the refused row to compare
    assert a["vs_lerobot_core"]["rel_l2"] > 0  # LeRobot's own predict was measured against its core
    assert set(a["first_call_s"]) == {"lerobot_predict"}
    assert "sample_actions" not in vars(run.policy.model) and not run.policy.config.rtc_config


def test_time_lerobot_records_a_refused_guided_row_after_the_plain_ones(compare_stand_in):
    run = lr.compare_lerobot("tiny", device="cpu", steps=STEPS, reduced=True, levers="exact")
    run.policy.model.guided_offset = 1.0  # LeRobot's guided calls answer 1 off, its plain ones as vlaperf's
    timing = lr.time_lerobot(run, warmup=1, iters=2, lerobot_compile=None, progress=False, accelerated=True, rtc=True)
    assert list(timing["summary"])[-3:] == ["lerobot_predict", "vlaperf_in_lerobot_predict", "lerobot_predict_rtc"]
    a = timing["accelerated"]
    assert a["refused"]["row"] == "vlaperf_in_lerobot_predict_rtc" and a["refused"]["check"]["guided"]
    assert [c["passed"] for c in a["checks"]] == [True, False]
    assert a["vs_lerobot_predict"]["passed"]  # the plain row was compared and timed
    rtc = a["rtc"]
    assert "vs_lerobot_predict_rtc" not in rtc and rtc["guidance_moves"] > 0.05  # LeRobot's guided row answered
    assert not run.policy.config.rtc_config.enabled and "sample_actions" not in vars(run.policy.model)


def test_time_lerobot_accelerated_needs_an_engine(compare_stand_in):
    run = lr.compare_lerobot("tiny", device="cpu", steps=1, reduced=True, levers=None)
    with pytest.raises(ValueError, match="no vlaperf engine to accelerate"):
        lr.time_lerobot(run, warmup=1, iters=1, lerobot_compile=None, progress=False, accelerated=True)


def test_predict_batch_refuses_cameras_lerobot_cannot_place():
    obs = random_observation(get_workload("tiny"), get_config("tiny"))
    batch = lr.predict_batch(obs)
    valid = get_workload("tiny").image_valid
    assert [k for k in batch if k.startswith("observation.images.")] == \
        [f"observation.images.{IMAGE_SLOTS[s]}" for s in range(sum(valid))]
    assert torch.equal(batch["observation.images.base_0_rgb"] * 2 - 1, obs.images[:, 0])
    obs.image_mask[:] = torch.tensor([True, False, True])
    with pytest.raises(ValueError, match=r"obs.image_mask: .* has an empty slot before a present one"):
        lr.predict_batch(obs)


def _cli(argv) -> int:
    from vlaperf.cli import main

    try:
        return main(argv)
    except SystemExit as e:
        return e.code


@pytest.mark.parametrize("extra", [["--no-timing"], ["--levers", "reference"]])
def test_cli_accelerate_needs_timing_and_an_engine(extra, capsys):
    assert _cli(["compare", "--device", "cpu", "--accelerate", *extra]) == 2
    assert "--accelerate times LeRobot's policy with vlaperf's engine installed" in capsys.readouterr().err


def test_cli_rtc_needs_accelerate(capsys):
    assert _cli(["compare", "--device", "cpu", "--rtc"]) == 2
    assert "--rtc times LeRobot's real-time chunking in its predict_action_chunk: it needs --accelerate" in \
        capsys.readouterr().err


def test_cli_accelerate_writes_its_file_and_exits_1_when_the_accelerators_check_refuses(compare_stand_in, monkeypatch,
                                                                                       tmp_path, capsys):
    """The accelerator's own check refusing to answer used to end the command before --json's file was written; the
    file now holds the comparison, the timed rows and the refusal, and the CLI and the report say it; exit 1."""
    import json

    from vlaperf.report.render import render

    compare = lr.compare_lerobot

    def compare_then_drift(*args, **kwargs):
        run = compare(*args, **kwargs)
        run.policy.model.offset = 1.0  # after the comparison passed: only the accelerator's check sees it
        return run

    monkeypatch.setattr(lr, "compare_lerobot", compare_then_drift)
    out = tmp_path / "c.json"
    argv = ["compare", "--workload", "tiny", "--device", "cpu", "--accelerate", "--levers", "exact", "--warmup", "1",
            "--iters", "2", "--lerobot-compile", "none", "--no-progress", "--json", str(out)]
    assert _cli(argv) == 1
    captured = capsys.readouterr()
    assert "vlaperf compare: --accelerate: vlaperf's " in captured.err
    assert "is not equivalent to LeRobot's sample_actions for this input shape: rel L2" in captured.err
    text = " ".join(captured.out.split())
    assert f"wrote {out}" in text
    assert ("vlaperf_in_lerobot_predict NOT timed: the accelerator's check against LeRobot's sample_actions refused "
            "to answer on its first call (batch 1, cameras [True, True, False]") in text, text
    r = json.loads(out.read_text())
    assert r["compare"]["passed"] and r["compare"]["equivalence"]["exact"]["passed"]
    assert list(r["timing"]["summary"]) == ["lerobot", "vlaperf_reference", "vlaperf_exact", "lerobot_predict"]
    refused = r["timing"]["accelerated"]["refused"]
    assert refused["row"] == "vlaperf_in_lerobot_predict" and refused["message"] in captured.err
    assert not refused["check"]["passed"] and refused["check"]["rel_l2"] > refused["check"]["tolerance"]
    md = " ".join(render([out], tmp_path / "report.md").read_text().split())
    assert "skipped" not in md
    assert "vlaperf_in_lerobot_predict: the same call with vlaperf (" in md and "not compared (refused, below)" in md
    assert "vlaperf_in_lerobot_predict NOT timed: the accelerator's check against LeRobot's sample_actions" in md


def test_cli_accelerate_prints_and_writes_the_accelerated_rows(compare_stand_in, tmp_path, capsys):
    out = tmp_path / "c.json"
    argv = ["compare", "--workload", "tiny", "--device", "cpu", "--accelerate", "--levers", "exact", "--warmup", "1",
            "--iters", "2", "--lerobot-compile", "none", "--no-progress", "--json", str(out)]
    assert _cli(argv) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "│ vlaperf_in_lerobot_predict │" in text and "LeRobot's predict_action_chunk with vlaperf (" in text, text
    assert ("settled (each timed call right after an untimed call of its own, not after an eager row): vlaperf_exact, "
            "vlaperf_in_lerobot_predict") in text
    import json

    r = json.loads(out.read_text())
    assert r["timing"]["accelerated"]["vs_lerobot_predict"]["passed"]
    assert set(r["timing"]["summary"]) >= {"lerobot_predict", "vlaperf_in_lerobot_predict"}
    assert "rtc" not in r["timing"]["accelerated"]
    assert _cli(argv + ["--rtc"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "│ vlaperf_in_lerobot_predict_rtc │" in text and "With LeRobot's real-time chunking on (linear schedule" in text, text
    assert json.loads(out.read_text())["timing"]["accelerated"]["rtc"]["vs_lerobot_predict_rtc"]["passed"]
    from vlaperf.report.render import render

    md = render([tmp_path], tmp_path / "report.md").read_text()  # the report says which rows were settled
    assert ("Each timed call of vlaperf_exact, vlaperf_in_lerobot_predict, vlaperf_in_lerobot_predict_rtc came right "
            "after an untimed call of its own") in md


@needs_lerobot
@pytest.mark.slow
def test_cli_compare_accelerate_with_lerobot(tmp_path):
    import json

    out = tmp_path / "c.json"
    argv = ["compare", "--workload", "tiny", "--device", "cpu", "--accelerate", "--rtc", "--warmup", "1", "--iters",
            "2", "--lerobot-compile", "none", "--no-progress", "--json", str(out)]
    assert _cli(argv) == 0
    acc_ = json.loads(out.read_text())["timing"]["accelerated"]
    assert acc_["vs_lerobot_predict"]["passed"] and acc_["vs_lerobot_predict"]["rel_l2"] < 1e-4
    assert acc_["vs_lerobot_core"]["rel_l2"] < 1e-5  # LeRobot's pre-processing of predict_batch's frames gives the core's inputs
    assert [(c["passed"], c["guided"]) for c in acc_["checks"]] == [(True, False), (True, True)]
    rtc = acc_["rtc"]  # LeRobot's own RTCConfig defaults, its RTCProcessor
    assert rtc["vs_lerobot_predict_rtc"]["passed"] and rtc["vs_lerobot_predict_rtc"]["rel_l2"] < 1e-4
    assert rtc["guidance_moves"] > 0.05 and rtc["max_guidance_weight"] == 10.0 and rtc["schedule"] == "LINEAR"


def test_a_compiled_sampling_call_is_put_back_and_the_checks_run_eagerly():
    """LeRobot's compile_model sets `model.sample_actions` to a compiled function on the instance: the accelerator
    restores that one, and checks against the class's eager method, never waiting on a compile."""
    policy = _Policy()
    compiled_calls = []

    def compiled(*args, **kwargs):
        compiled_calls.append(1)
        return type(policy.model).sample_actions(policy.model, *args, **kwargs)

    policy.model.sample_actions = compiled
    fast = acc.accelerate_lerobot(policy, levers="exact")
    policy.predict_action_chunk(_inputs())
    assert compiled_calls == [] and policy.model.calls == 1 and fast.checks[0]["passed"]
    fast.restore()
    assert vars(policy.model)["sample_actions"] is compiled
    policy.predict_action_chunk(_inputs())
    assert compiled_calls == [1]
    fast.install()
    fast.install()  # installing twice is one install: restore still finds the compiled call under it
    fast.restore()
    assert vars(policy.model)["sample_actions"] is compiled


# ------------------------------------------------------------ openpi


class _OpenpiModel(_Core):
    """openpi's PI0Pytorch at the tiny size: its config fields (vlaperf's Pi0Config has them all), its
    `_preprocess_observation` and `sample_actions(device, observation, noise=, num_steps=)`."""

    def _preprocess_observation(self, observation, *, train=True):
        assert not train
        return (list(observation.images.values()), list(observation.image_masks.values()), observation.tokenized_prompt,
                observation.tokenized_prompt_mask, observation.state)

    def sample_actions(self, device, observation, noise=None, num_steps=10):
        images, masks, tokens, token_mask, state = self._preprocess_observation(observation, train=False)
        return _Core.sample_actions(self, images, masks, tokens, token_mask, *(() if self.config.pi05 else (state,)),
                                    noise=noise, num_steps=num_steps)


class _OpenpiPolicy:
    """openpi's Policy around a PyTorch model: `_sample_actions` bound at construction, as openpi binds it."""

    def __init__(self, model, pytorch=True):
        self._model, self._is_pytorch_model = model, pytorch
        self._sample_actions = model.sample_actions

    def infer(self, observation, noise=None):
        return self._sample_actions("cpu", observation, **({} if noise is None else {"noise": noise}))


def _openpi(pi05=False, offset=0.0):
    model = _OpenpiModel(get_config("tiny", pi05=pi05), offset)
    init_random_(model, 0)
    return model.eval()


def _openpi_observation(valid=None):
    from vlaperf.compare import to_openpi_observation

    obs = random_observation(get_workload("tiny"), get_config("tiny"))
    if valid is not None:
        obs.image_mask[:] = torch.tensor(valid)
    return to_openpi_observation(obs)


@pytest.mark.parametrize("pi05", [False, True], ids=["pi0", "pi05"])
def test_openpi_config_reads_the_sizes_from_the_models_modules(pi05):
    """A PI0Pytorch openpi built at a size no preset has (its Gemma variants patched, as a reduced test does) gets
    the config of its weights, not the preset its variant names would pick: compare_openpi then needs no config=."""
    from vlaperf.compare.openpi import compare_openpi, openpi_config

    model = _openpi(pi05)
    c = model.config
    # openpi's config names the full variants whatever sizes its modules were built at
    theirs = SimpleNamespace(paligemma_with_expert=model.paligemma_with_expert, config=SimpleNamespace(
        pi05=pi05, action_dim=c.action_dim, action_horizon=c.action_horizon, max_token_len=c.max_token_len,
        paligemma_variant="gemma_2b", action_expert_variant="gemma_300m"))
    got, want = openpi_config(theirs), get_config("tiny", pi05=pi05)
    assert got.name == "openpi-" + ("pi05" if pi05 else "pi0") and got.pi05 == pi05
    assert (got.vision, got.backbone, got.expert) == (want.vision, want.backbone, want.expert)
    assert (got.action_dim, got.action_horizon, got.max_token_len) == (want.action_dim, want.action_horizon,
                                                                         want.max_token_len)
    out = compare_openpi(model, "tiny", steps=2, levers="exact")
    assert out["passed"] and out["model"] == got.name
    assert max(m["rel_l2"] for m in out["equivalence"].values()) < 1e-5
    theirs.config.action_horizon = None
    with pytest.raises(ValueError, match=r"config has no action_horizon; pass config="):
        openpi_config(theirs)


@pytest.mark.parametrize("pi05", [False, True], ids=["pi0", "pi05"])
def test_openpi_policy_accelerated_through_its_bound_sampling_call(pi05):
    model = _openpi(pi05)
    policy = _OpenpiPolicy(model)
    noise = torch.randn(1, model.config.action_horizon, model.config.action_dim)
    theirs = policy.infer(_openpi_observation(), noise=noise)
    fast = acc.accelerate_openpi(policy, levers="exact")
    assert (fast.target, fast.attribute, fast.peer) == (policy, "_sample_actions", "openpi")
    assert fast.model.reference_released and fast.released_bytes > 0
    ours = policy.infer(_openpi_observation(), noise=noise)
    assert ((ours - theirs).norm() / theirs.norm()).item() < 1e-5
    assert [c["passed"] for c in fast.checks] == [True] and model.calls == 2  # theirs, then the check's call
    torch.manual_seed(3)
    drawn = policy.infer(_openpi_observation())  # no noise: openpi's own sample_noise, once, in the accelerator
    assert model.noise_draws == 1 and model.calls == 2
    torch.manual_seed(3)
    fast.restore()
    assert policy._sample_actions.__func__ is _OpenpiModel.sample_actions  # the bound call openpi's Policy held
    assert ((policy.infer(_openpi_observation()) - drawn).norm() / drawn.norm()).item() < 1e-5
    fast.install()
    with pytest.raises(ValueError, match="policy_or_model: already accelerated"):
        acc.accelerate_openpi(policy, levers="exact")


def test_openpi_model_accelerated_alone_and_a_failing_check_refuses():
    model = _openpi(offset=1.0)
    fast = acc.accelerate_openpi(model, levers="exact")
    assert (fast.target, fast.attribute) == (model, "sample_actions")
    with pytest.raises(acc.NotEquivalent, match="not equivalent to openpi's sample_actions for this input shape"):
        model.sample_actions("cpu", _openpi_observation())
    fast.restore()
    assert "sample_actions" not in vars(model)


def test_openpi_jax_policy_and_other_objects_are_refused():
    with pytest.raises(TypeError, match="an openpi Policy around a JAX model"):
        acc.accelerate_openpi(_OpenpiPolicy(_openpi(), pytorch=False), levers="exact")
    with pytest.raises(TypeError, match="expected openpi's Policy or its PI0Pytorch, got Linear"):
        acc.accelerate_openpi(torch.nn.Linear(2, 2))


def _openpi_importable() -> bool:
    import importlib

    try:
        for name in ("openpi.models.gemma", "openpi.models_pytorch.pi0_pytorch", "openpi.policies.policy"):
            importlib.import_module(name)
    except Exception:  # noqa: BLE001 - not importable here, whatever the reason
        return False
    return True


@pytest.mark.skipif(not _openpi_importable(), reason="openpi's PyTorch model is not importable here (openpi's src/ on "
                    "PYTHONPATH, transformers 4.53.2 with its transformers_replace files)")
@pytest.mark.slow
def test_openpis_own_policy_accelerated(monkeypatch):
    """openpi's own Policy (no transforms) around its own PI0Pytorch at a reduced size (as in test_compare_openpi):
    `infer` on a raw observation dict, before and after accelerate_openpi, and after restore."""
    import dataclasses

    import numpy as np
    import openpi.models.gemma as gemma
    from openpi.models_pytorch.pi0_pytorch import PI0Pytorch
    from openpi.policies.policy import Policy

    from vlaperf.models.pi0 import VisionConfig

    cfg = dataclasses.replace(lr.matching_config(get_workload("libero-pi0"), lr.Reduced()), vision=VisionConfig())
    sizes = {name: SimpleNamespace(width=g.width, depth=g.depth, mlp_dim=g.mlp_dim, num_heads=g.num_heads,
                                   num_kv_heads=g.num_kv_heads, head_dim=g.head_dim)
             for name, g in (("gemma_2b", cfg.backbone), ("gemma_300m", cfg.expert))}
    monkeypatch.setattr(gemma, "get_config", sizes.get)
    torch.manual_seed(0)
    model = PI0Pytorch(SimpleNamespace(pi05=False, paligemma_variant="gemma_2b", action_expert_variant="gemma_300m",
                                       dtype="float32", action_dim=32, action_horizon=50, max_token_len=48,
                                       pytorch_compile_mode=None))
    policy = Policy(model, is_pytorch=True, pytorch_device="cpu")
    rng = np.random.default_rng(0)
    tokens = np.zeros(48, np.int64)
    tokens[:12] = rng.integers(1, 1000, 12)
    cameras = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")

    def observation():  # openpi's Policy.infer input after its transforms: one sample, no batch axis
        return {"image": {k: rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for k in cameras},
                "image_mask": {k: np.bool_(k != "right_wrist_0_rgb") for k in cameras},
                "state": rng.standard_normal(32).astype(np.float32), "tokenized_prompt": tokens,
                "tokenized_prompt_mask": tokens > 0}

    obs, noise = observation(), rng.standard_normal((50, 32)).astype(np.float32)
    theirs = policy.infer(obs, noise=noise)["actions"]
    fast = acc.accelerate_openpi(policy)
    ours = policy.infer(obs, noise=noise)["actions"]
    assert ours.shape == theirs.shape == (50, 32)
    assert np.linalg.norm(ours - theirs) / np.linalg.norm(theirs) < 1e-4
    [check] = fast.checks
    assert check["passed"] and check["images_valid"] == [True, True, False] and check["prompt_len"] == 12
    fast.restore()
    assert np.array_equal(policy.infer(obs, noise=noise)["actions"], theirs)


# ------------------------------------------------------------ `vlaperf lerobot-eval`


@pytest.fixture
def eval_script(monkeypatch):
    """LeRobot's eval script replaced by a stand-in module: its `main` reads sys.argv, builds the policy with the
    module's `make_policy` (a stand-in pi0, or what `script.kind` names) and runs two chunks, as an episode would."""
    import sys
    from types import ModuleType

    script = ModuleType("lerobot.scripts.lerobot_eval")
    script.kind, script.seen = "pi0", {}

    def make_policy(cfg=None, env_cfg=None, rename_map=None):
        if script.kind == "act":
            return torch.nn.Linear(1, 1)
        return _Policy(use_amp=script.kind == "amp")

    def main():
        script.seen["argv"] = list(sys.argv)
        policy = script.make_policy(cfg="cfg", env_cfg="env")
        script.seen["policy"] = policy
        script.seen["chunks"] = [policy.predict_action_chunk(_inputs()) for _ in range(2)]

    script.make_policy = script.own_make_policy = make_policy
    script.main = main
    monkeypatch.setattr(lr, "import_lerobot", lambda pi05: None)  # LeRobot's policies "import" here
    for name in ("lerobot", "lerobot.scripts"):
        monkeypatch.setitem(sys.modules, name, ModuleType(name))
    monkeypatch.setitem(sys.modules, "lerobot.scripts.lerobot_eval", script)
    return script


def test_lerobot_eval_runs_lerobots_script_with_the_policy_accelerated(eval_script, capsys):
    import sys

    argv = list(sys.argv)
    assert _cli(["lerobot-eval", "--levers", "exact", "--", "--policy.path=lerobot/pi0_libero", "--env.type=libero"]) == 0
    assert eval_script.seen["argv"] == ["lerobot-eval", "--policy.path=lerobot/pi0_libero", "--env.type=libero"]
    policy = eval_script.seen["policy"]
    assert policy.model.calls == 1  # the first chunk's check; the second chunk ran on vlaperf's engine alone
    assert isinstance(vars(policy.model)["sample_actions"].__self__, acc.LeRobotAccelerator)
    assert eval_script.make_policy is eval_script.own_make_policy and sys.argv == argv  # both put back after the run
    out = " ".join(capsys.readouterr().out.split())
    assert "vlaperf lerobot-eval: _Policy sampled with vlaperf (for_loop+" in out
    assert "its checks against LeRobot: batch 1, cameras [True, True, False], prompt 6: rel L2" in out and "(passed)" in out


@pytest.mark.parametrize("kind,message", [
    ("act", "--policy: vlaperf accelerates LeRobot's pi0 and pi0.5 policies, not Linear"),
    ("amp", "--policy.use_amp: LeRobot would run the policy under torch.autocast"),
])
def test_lerobot_eval_refuses_a_policy_it_does_not_accelerate(eval_script, kind, message, capsys):
    eval_script.kind = kind
    assert _cli(["lerobot-eval", "--levers", "exact", "--", "--policy.path=x"]) == 2
    assert f"vlaperf lerobot-eval: error: {message}" in capsys.readouterr().err


def test_lerobot_eval_refuses_a_wrong_lever_list_before_lerobot_runs(eval_script, capsys):
    assert _cli(["lerobot-eval", "--levers", "for_loop,nope", "--", "--policy.path=x"]) == 2
    assert "unknown lever 'nope'" in capsys.readouterr().err and "argv" not in eval_script.seen


def test_lerobot_eval_names_what_its_script_lacks(eval_script, monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "lerobot.scripts.lerobot_eval", None)  # LeRobot imports; its eval script not
    assert _cli(["lerobot-eval", "--", "--policy.path=x"]) == 2
    assert ("vlaperf lerobot-eval: error: LeRobot's eval script (lerobot.scripts.lerobot_eval) is not importable "
            "here: ModuleNotFoundError") in capsys.readouterr().err


def test_lerobot_eval_without_lerobots_arguments_or_lerobot(monkeypatch, capsys):
    assert _cli(["lerobot-eval"]) == 2
    assert "give lerobot-eval's own arguments after `--`" in capsys.readouterr().err
    import sys

    monkeypatch.setitem(sys.modules, "lerobot", None)  # `import lerobot...` fails, also where LeRobot is installed
    for name in [m for m in sys.modules if m.startswith("lerobot.")]:
        monkeypatch.delitem(sys.modules, name)
    assert _cli(["lerobot-eval", "--", "--policy.path=x"]) == 2
    assert "LeRobot 0.6 is not importable here" in capsys.readouterr().err


@needs_lerobot
def test_lerobots_eval_script_builds_its_policy_with_the_make_policy_vlaperf_wraps():
    """The contract run_lerobot_eval relies on, read from the installed LeRobot: its eval script's `main`, and an
    `eval_main` that builds the policy through the module's own `make_policy` name."""
    import importlib
    import inspect

    try:
        script = importlib.import_module("lerobot.scripts.lerobot_eval")
    except ImportError as e:  # LeRobot's dataset extra (datasets, ...): the policies alone do not need it
        pytest.skip(f"LeRobot's eval script does not import here: {e}")
    assert callable(script.main) and callable(script.make_policy)
    assert "policy = make_policy(" in inspect.getsource(script.eval_main)


@needs_lerobot
@pytest.mark.slow
def test_lerobot_eval_end_to_end_in_lerobots_pusht_simulator(tmp_path, monkeypatch):
    """LeRobot's real eval script and PushT simulator (gym-pusht), a reduced pi0 with random weights, run once through
    `run_lerobot_eval` and once as LeRobot's own: the same episode, reward for reward. Two stand-ins, for what this
    machine cannot fetch: the reduced size (LeRobot's config names only the full one) and a small word-level tokenizer
    in place of PaliGemma's (on the Hub)."""
    import importlib
    import json
    import sys

    pytest.importorskip("gym_pusht")
    try:
        script = importlib.import_module("lerobot.scripts.lerobot_eval")
    except ImportError as e:
        pytest.skip(f"LeRobot's eval script does not import here: {e}")
    import lerobot.processor.tokenizer_processor as tokenizer_processor
    from lerobot.policies.pi0 import modeling_pi0
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[PAD]", "[UNK]", "push", "the", "block"])},
                                       unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, pad_token="[PAD]", unk_token="[UNK]")
    monkeypatch.setattr(tokenizer_processor.AutoTokenizer, "from_pretrained", lambda *a, **k: tokenizer)
    cfg = lr.matching_config(get_workload("libero-pi0"), lr.Reduced())
    full_size = script.make_policy

    def reduced(*args, **kwargs):
        with lr._sizes(modeling_pi0, cfg, reduced=True):
            return full_size(*args, **kwargs)

    monkeypatch.setattr(script, "make_policy", reduced)
    args = ["--policy.type=pi0", "--policy.device=cpu", "--policy.num_inference_steps=3", "--policy.n_action_steps=25",
            "--env.type=pusht", "--env.episode_length=50", "--eval.n_episodes=1", "--eval.batch_size=1", "--seed=0"]
    [fast] = acc.run_lerobot_eval([*args, f"--output_dir={tmp_path / 'vlaperf'}"])
    assert [c["passed"] for c in fast.checks] == [True] and fast.checks[0]["images_valid"] == [True]
    assert script.make_policy is reduced  # put back after the run
    monkeypatch.setattr(sys, "argv", ["lerobot-eval", *args, f"--output_dir={tmp_path / 'lerobot'}"])
    script.main()
    ours, theirs = (json.loads((tmp_path / side / "eval_info.json").read_text())["overall"]
                    for side in ("vlaperf", "lerobot"))
    assert ours["n_episodes"] == theirs["n_episodes"] == 1
    assert ours["avg_sum_reward"] == pytest.approx(theirs["avg_sum_reward"], rel=1e-6)
