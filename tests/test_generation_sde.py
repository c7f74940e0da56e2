"""The stochastic steps against the math: ODE limit, reference formulas, Gaussian densities, KL, marginals;
and the sampler's and the trainer's steps against the public functions that the math tests check."""

import math

import numpy as np
import pytest
import torch
from accelerate import Accelerator
from diffusers import DDIMScheduler, FlowMatchEulerDiscreteScheduler

from vlm_rewards.generation.config import GRPOConfig, SamplerSettings
from vlm_rewards.generation.grpo import ppo_clip_loss
from vlm_rewards.generation.models import build_tiny_generator, predict
from vlm_rewards.generation.sampling import sample_rollout
from vlm_rewards.generation.sde import (
    ddim_step_with_logprob,
    flow_step_distribution,
    gaussian_log_prob,
    gaussian_mean_kl,
    sde_step_with_logprob,
    step_with_logprob,
)
from vlm_rewards.generation.train import add_lora, build_generator, step_loss

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def flow_scheduler(steps: int = 10, shift: float = 3.0) -> FlowMatchEulerDiscreteScheduler:
    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    scheduler.set_timesteps(steps)
    return scheduler


def numpy_gaussian_log_prob(value, mean, std) -> np.ndarray:
    """log N(value; mean, std²) in float64, averaged over non-batch dimensions."""
    value, mean, std = (np.asarray(x, dtype=np.float64) for x in (value, mean, std))
    density = -((value - mean) ** 2) / (2 * std**2) - np.log(std) - 0.5 * np.log(2 * np.pi)
    return density.reshape(len(density), -1).mean(axis=1)


@pytest.mark.parametrize("family", ["flow", "flux"])
def test_noise_level_zero_reproduces_the_euler_ode_sampler_exactly(family):
    generator = build_tiny_generator(family, shift=3.0)
    prompts = ["a red circle", "a blue square"]
    embeddings = generator.encode_prompts(prompts)
    start = torch.randn(2, *generator.latent_shape, generator=torch.Generator().manual_seed(0))
    ours, theirs = start.clone(), start.clone()
    scheduler = flow_scheduler(6)
    with torch.no_grad():
        for timestep in scheduler.timesteps:
            velocity = predict(generator.denoiser, family, ours, timestep, embeddings)
            ours, log_prob, _, std_dev_t = sde_step_with_logprob(scheduler, velocity, timestep, ours, noise_level=0.0)
            assert torch.all(std_dev_t == 0) and torch.all(log_prob == 0)
        reference = flow_scheduler(6)
        for timestep in reference.timesteps:
            velocity = predict(generator.denoiser, family, theirs, timestep, embeddings)
            theirs = reference.step(velocity, timestep, theirs).prev_sample
    assert torch.equal(ours, theirs)
    # the rollout sampler at noise level 0, whatever its window, is the same ODE sampler
    settings = SamplerSettings(num_steps=6, noise_level=0.0, window_size=2)
    rollout = sample_rollout(generator, prompts, settings, seed=0)
    np.testing.assert_array_equal(rollout.images, generator.decode(theirs))


@pytest.mark.parametrize("step_index", [0, 4, 9])  # 0: σ = 1, replaced by sigmas[1] in the denominator
def test_flow_sde_step_matches_the_reference_formula(step_index):
    scheduler, noise_level = flow_scheduler(10), 0.7
    rng = np.random.default_rng(step_index)
    sample, velocity, given = (rng.standard_normal((3, 4, 2, 2)).astype(np.float32) for _ in range(3))
    timestep = scheduler.timesteps[step_index]
    _, log_prob, mean, std_dev_t = sde_step_with_logprob(
        scheduler, torch.from_numpy(velocity), timestep, torch.from_numpy(sample), noise_level, torch.from_numpy(given)
    )
    sigmas = scheduler.sigmas.numpy().astype(np.float64)
    sigma, sigma_next = sigmas[step_index], sigmas[step_index + 1]
    dt = sigma_next - sigma
    expected_std_t = noise_level * math.sqrt(sigma / (1 - (sigmas[1] if sigma == 1 else sigma)))
    expected_mean = (
        sample * (1 + expected_std_t**2 * dt / (2 * sigma))
        + velocity * (1 + expected_std_t**2 * (1 - sigma) / (2 * sigma)) * dt
    )
    expected_log_prob = numpy_gaussian_log_prob(given, expected_mean, expected_std_t * math.sqrt(-dt))
    np.testing.assert_allclose(std_dev_t.flatten().numpy(), expected_std_t, rtol=1e-6)
    np.testing.assert_allclose(mean.numpy(), expected_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(log_prob.numpy(), expected_log_prob, rtol=1e-5, atol=1e-5)


def test_flow_sde_sampled_step_has_the_declared_distribution():
    scheduler = flow_scheduler(10)
    sample, velocity = torch.randn(1, 1, 100, 100).expand(2, -1, -1, -1), torch.randn(2, 1, 100, 100)
    prev, log_prob, mean, _ = sde_step_with_logprob(
        scheduler, velocity, scheduler.timesteps[3], sample, generator=torch.Generator().manual_seed(0)
    )
    step = flow_step_distribution(scheduler, velocity, scheduler.timesteps[3], sample)
    standardized = (prev - mean) / step.std
    assert abs(standardized.mean()) < 0.02 and abs(standardized.std() - 1) < 0.02
    torch.testing.assert_close(log_prob, gaussian_log_prob(prev, mean, step.std))


def test_cps_step_is_a_gaussian_around_the_coefficient_preserving_mean():
    scheduler = flow_scheduler(10)
    sample, velocity, given = torch.randn(3, 2, 4, 4), torch.randn(3, 2, 4, 4), torch.randn(3, 2, 4, 4)
    timestep = scheduler.timesteps[2]
    sigma, sigma_next = scheduler.sigmas[2].item(), scheduler.sigmas[3].item()
    _, log_prob, mean, std = sde_step_with_logprob(scheduler, velocity, timestep, sample, 0.7, given, method="cps")
    expected_std = sigma_next * math.sin(0.7 * math.pi / 2)
    clean, noise = sample - sigma * velocity, sample + (1 - sigma) * velocity
    expected_mean = clean * (1 - sigma_next) + noise * math.sqrt(sigma_next**2 - expected_std**2)
    torch.testing.assert_close(mean, expected_mean)
    np.testing.assert_allclose(std.flatten().numpy(), expected_std, rtol=1e-6)
    np.testing.assert_allclose(log_prob.numpy(), numpy_gaussian_log_prob(given, expected_mean, expected_std), rtol=1e-5)
    euler = scheduler.step(velocity, timestep, sample).prev_sample
    scheduler._step_index = None
    _, _, ode_mean, _ = sde_step_with_logprob(scheduler, velocity, timestep, sample, 0.0, method="cps")
    torch.testing.assert_close(ode_mean, euler)  # a = 0 is the Euler step up to round-off


@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction"])
def test_ddim_eta_step_log_prob_equals_the_direct_gaussian_density(prediction_type):
    scheduler = DDIMScheduler(clip_sample=False, set_alpha_to_one=False, prediction_type=prediction_type)
    scheduler.set_timesteps(10)
    sample, output, noise = torch.randn(3, 4, 4, 4), torch.randn(3, 4, 4, 4), torch.randn(3, 4, 4, 4)
    timestep, eta = scheduler.timesteps[4], 1.0
    expected = scheduler.step(output, timestep, sample, eta=eta, variance_noise=noise).prev_sample
    alphas = scheduler.alphas_cumprod.numpy().astype(np.float64)
    t, t_prev = int(timestep), int(timestep) - 100
    a_t, a_prev = alphas[t], alphas[t_prev]
    std = eta * math.sqrt((1 - a_prev) / (1 - a_t) * (1 - a_t / a_prev))
    mean = expected.numpy().astype(np.float64) - std * noise.numpy()  # diffusers' sample = mean + std·noise
    prev, log_prob, our_mean, our_std = ddim_step_with_logprob(scheduler, output, timestep, sample, eta, expected)
    np.testing.assert_allclose(our_std.flatten().numpy(), std, rtol=1e-5)
    np.testing.assert_allclose(our_mean.numpy(), mean, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(log_prob.numpy(), numpy_gaussian_log_prob(expected, mean, std), rtol=1e-4, atol=1e-4)
    _, _, deterministic, _ = ddim_step_with_logprob(scheduler, output, timestep, sample, eta=0.0)
    torch.testing.assert_close(deterministic, scheduler.step(output, timestep, sample, eta=0.0).prev_sample)


def test_kl_term_equals_the_gaussian_formula_and_a_monte_carlo_estimate():
    torch.manual_seed(0)
    mean, reference_mean, std = torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4), torch.full((2, 1, 1, 1), 0.6)
    kl = gaussian_mean_kl(mean, reference_mean, std)
    m, r, s = mean.double().numpy(), reference_mean.double().numpy(), 0.6
    closed_form = np.log(s / s) + (s**2 + (m - r) ** 2) / (2 * s**2) - 0.5  # KL(N(m, s²) ‖ N(r, s²)) per element
    np.testing.assert_allclose(kl.numpy(), closed_form.reshape(2, -1).mean(axis=1), rtol=1e-5)
    draws = mean + std * torch.randn(20000, *mean.shape)  # x' ~ policy, then E[log p − log q]
    log_ratio = gaussian_log_prob(draws.flatten(0, 1), mean.repeat(20000, 1, 1, 1), std.repeat(20000, 1, 1, 1)) - (
        gaussian_log_prob(draws.flatten(0, 1), reference_mean.repeat(20000, 1, 1, 1), std.repeat(20000, 1, 1, 1))
    )
    monte_carlo = log_ratio.reshape(20000, 2).double().mean(0)
    np.testing.assert_allclose(monte_carlo.numpy(), kl.numpy(), rtol=0.02)


# ----------------------------------------------------------------------------- the steps that train

STEP_CASES = {
    "flow-sde": ({"family": "flow"}, {"method": "sde", "noise_level": 0.7}),
    "flow-cps": ({"family": "flow"}, {"method": "cps", "noise_level": 0.5}),
    "ddim": ({"family": "ddim"}, {"noise_level": 1.0}),
}
PROMPTS = ["a red circle"] * 2 + ["a blue square"] * 2


def step_case_config(tmp_path, case: str) -> GRPOConfig:
    model, sampling = STEP_CASES[case]
    sampling = {"num_steps": 4, **sampling}
    return GRPOConfig.model_validate({"output_dir": str(tmp_path), "model": model, "sampling": sampling})


def public_log_probs(generator, denoiser, rollout, sampling: SamplerSettings) -> torch.Tensor:
    """(B, K): each recorded step's log-prob recomputed by `sde_step_with_logprob` or `ddim_step_with_logprob`."""
    embeddings = generator.encode_prompts(rollout.prompts)
    log_probs = []
    for k in range(rollout.latents.shape[1]):
        latents, timesteps, given = rollout.latents[:, k], rollout.timesteps[:, k], rollout.next_latents[:, k]
        with torch.no_grad():
            output = predict(denoiser, generator.family, latents, timesteps, embeddings)
        if generator.family == "ddim":
            step = ddim_step_with_logprob(generator.scheduler, output, timesteps, latents, sampling.noise_level, given)
        else:
            step = sde_step_with_logprob(
                generator.scheduler, output, timesteps, latents, sampling.noise_level, given, method=sampling.method
            )
        log_probs.append(step[1])
    return torch.stack(log_probs, dim=1)


@pytest.mark.parametrize("case", sorted(STEP_CASES))
def test_the_rollout_sampler_records_the_public_steps(tmp_path, case):
    config = step_case_config(tmp_path, case)
    generator = build_generator(config.model)
    rollout = sample_rollout(generator, PROMPTS, config.sampling, seed=0)
    assert rollout.log_probs.shape == (4, config.sampling.steps_per_trajectory)
    expected = public_log_probs(generator, generator.denoiser, rollout, config.sampling)
    torch.testing.assert_close(rollout.log_probs, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("case", sorted(STEP_CASES))
def test_the_trainer_scores_the_public_steps(tmp_path, case):
    config = step_case_config(tmp_path, case)
    generator = build_generator(config.model)
    generator.denoiser = add_lora(generator.denoiser, config.model).eval()
    rollout = sample_rollout(generator, PROMPTS, config.sampling, seed=0)
    with torch.no_grad():  # the policy moves away from the one that sampled, so ratios are not 1
        for name, parameter in generator.denoiser.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.1, generator=torch.Generator().manual_seed(0))
    log_probs = public_log_probs(generator, generator.denoiser, rollout, config.sampling)
    advantages, train = torch.linspace(-1, 1, len(PROMPTS)), config.train
    for k in range(rollout.latents.shape[1]):
        loss, logs = step_loss(Accelerator(cpu=True), generator, generator.denoiser, rollout, k, advantages, config)
        expected, _ = ppo_clip_loss(
            log_probs[:, k], rollout.log_probs[:, k], advantages, train.clip_range, train.advantage_clip
        )
        assert logs["ratio_max_deviation"] > train.clip_range  # the loss depends on the policy's log-probs
        torch.testing.assert_close(loss.detach(), expected, rtol=1e-6, atol=0)


def test_each_public_step_refuses_the_other_scheduler():
    ddim, flow, sample = DDIMScheduler(), flow_scheduler(10), torch.randn(2, 1, 4, 4)
    ddim.set_timesteps(10)
    with pytest.raises(TypeError, match="sde_step_with_logprob: scheduler DDIMScheduler"):
        sde_step_with_logprob(ddim, sample, ddim.timesteps[0], sample)
    with pytest.raises(TypeError, match="ddim_step_with_logprob: scheduler FlowMatchEulerDiscreteScheduler"):
        ddim_step_with_logprob(flow, sample, flow.timesteps[0], sample)
    with pytest.raises(ValueError, match="method 'cps' is for flow-matching schedulers"):
        step_with_logprob(ddim, sample, ddim.timesteps[0], sample, 1.0, "cps")


# ----------------------------------------------------------------------------- 1-D Gaussian mixture

WEIGHTS = torch.tensor([0.3, 0.7], dtype=torch.float64)
MEANS = torch.tensor([-1.5, 1.0], dtype=torch.float64)
STDS = torch.tensor([0.3, 0.5], dtype=torch.float64)


def mixture_velocity(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """The exact velocity E[ε − x0 | x_σ = x] for x_σ = (1 − σ)x0 + σε, x0 ~ the mixture."""
    variance = (1 - sigma) ** 2 * STDS**2 + sigma**2
    residual = x.double()[:, None] - (1 - sigma) * MEANS
    posterior = torch.softmax(torch.log(WEIGHTS) - 0.5 * residual**2 / variance - 0.5 * torch.log(variance), dim=-1)
    clean = MEANS + (1 - sigma) * STDS**2 / variance * residual
    noise = sigma / variance * residual
    return (posterior * (noise - clean)).sum(-1).float()


def mixture_cdf(x: torch.Tensor, sigma: float) -> torch.Tensor:
    std = torch.sqrt((1 - sigma) ** 2 * STDS**2 + sigma**2)
    return (WEIGHTS * 0.5 * (1 + torch.erf((x.double()[:, None] - (1 - sigma) * MEANS) / (math.sqrt(2) * std)))).sum(-1)


def ks_distance(samples: torch.Tensor, sigma: float) -> float:
    ordered, _ = torch.sort(samples)
    empirical = torch.arange(1, len(ordered) + 1, dtype=torch.float64) / len(ordered)
    return (empirical - mixture_cdf(ordered, sigma)).abs().max().item()


# CPS re-injects a fixed share sin²(aπ/2) of the noise at every step whatever the step size, so it is
# no discretisation of a marginal-preserving SDE: with the exact (posterior-mean) velocity its
# marginals drift at large a (KS ≈ 0.08 at a = 0.8, not shrinking with more steps). Small a is close
# in distribution (the final std is still ~3% low at a = 0.3).
@pytest.mark.parametrize(("method", "noise_level"), [("sde", 0.8), ("cps", 0.3)])
def test_sde_sampler_keeps_the_true_marginals_of_a_gaussian_mixture(method, noise_level):
    """With the exact velocity, intermediate and final marginals match the mixture's."""
    scheduler, rng = flow_scheduler(40, shift=1.0), torch.Generator().manual_seed(0)
    x = torch.randn(20000, 1, generator=rng)
    distances = []
    for index, timestep in enumerate(scheduler.timesteps):
        sigma = scheduler.sigmas[index].item()
        velocity = mixture_velocity(x[:, 0], sigma)[:, None]
        x, _, _, _ = sde_step_with_logprob(scheduler, velocity, timestep, x, noise_level, generator=rng, method=method)
        if index % 10 == 9:
            distances.append(ks_distance(x[:, 0], scheduler.sigmas[index + 1].item()))
    # ~0.01 is sampling noise at this N; a wrong drift or noise scale is off by 0.05 or more
    assert max(distances) < 0.025, distances
