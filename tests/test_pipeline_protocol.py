"""The pipeline's evaluation protocol (tuning and test seeds, IQM with bootstrap CIs, censoring), its rounds
as stages, and the oracle condition."""

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
import yaml

from vlm_rewards.robotics.config import PipelineConfig, RewardWrapperConfig
from vlm_rewards.robotics.pipeline import Pipeline
from vlm_rewards.robotics.report import (
    bootstrap_ci,
    check_test_seeds,
    iqm,
    protocol_statistics,
    run_outcome,
    select_candidate,
)
from vlm_rewards.robotics.reward_wrapper import RewardStreams


def write_run(folder, seed, rates, every=100, budget=None):
    """An RL run folder as `vlmr rl` leaves it: config.yaml and eval.jsonl."""
    folder.mkdir(parents=True)
    budget = budget or every * len(rates)
    (folder / "config.yaml").write_text(yaml.safe_dump({"seed": seed, "total_timesteps": budget}))
    rows = [{"timesteps": every * (i + 1), "success_rate": rate} for i, rate in enumerate(rates)]
    (folder / "eval.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


# ---------------------------------------------------------------------- statistics


def test_iqm_is_the_mean_of_the_middle_half():
    # 8 runs: the 2 lowest and the 2 highest are cut, the mean of 0.2, 0.4, 0.6, 1.0 is left
    assert iqm(np.array([1.0, 0.0, 0.4, 1.0, 0.2, 1.0, 0.6, 0.0])) == pytest.approx(0.55)
    # 5 runs: int(0.25 * 5) = 1 cut at each end
    assert iqm(np.array([0.0, 0.9, 0.5, 0.7, 1.0])) == pytest.approx((0.5 + 0.7 + 0.9) / 3)


def test_bootstrap_ci_matches_a_hand_computation_and_contains_the_iqm():
    # two runs, 0 and 1: a resample is {0, 0}, {0, 1} or {1, 1} (p = 1/4, 1/2, 1/4), IQM = mean 0, 0.5 or 1,
    # so the 2.5th and 97.5th percentiles are 0 and 1
    assert bootstrap_ci([0.0, 1.0]) == (0.0, 1.0)
    values = np.array([0.1, 0.35, 0.4, 0.55, 0.6, 0.8, 0.95])
    low, high = bootstrap_ci(values)
    assert low <= iqm(values) <= high and values.min() <= low < high <= values.max()
    rng = np.random.default_rng(1)  # the percentile bootstrap written out
    resampled = values[rng.integers(0, len(values), (20_000, len(values)))]
    hand = np.percentile(scipy.stats.trim_mean(resampled, 0.25, axis=1), [2.5, 97.5])
    np.testing.assert_allclose([low, high], hand, atol=0.03)
    assert bootstrap_ci(values) == (low, high)  # seeded: the report is reproducible
    assert bootstrap_ci([1.0, 1.0, 1.0]) == (1.0, 1.0)  # every run alike: no spread


def test_steps_to_80_of_a_run_that_never_gets_there_is_censored_at_its_budget(tmp_path):
    runs = [
        write_run(tmp_path / "seed0", 0, [0.0, 0.8, 1.0, 1.0]),  # 80 % at step 200
        write_run(tmp_path / "seed1", 1, [0.0, 0.2, 0.5, 0.9]),  # 400
        write_run(tmp_path / "seed2", 2, [0.0, 0.2, 0.5, 0.7]),  # never: censored at 400
        write_run(tmp_path / "seed3", 3, [0.9, 1.0, 1.0, 1.0]),  # 100
        write_run(tmp_path / "seed4", 4, [0.0, 0.0, 0.0, 0.0]),  # never: censored at 400
    ]
    statistics = protocol_statistics(runs)
    assert statistics["seeds"] == [0, 1, 2, 3, 4]
    assert [run["steps_to_80"] for run in statistics["runs"]] == [200, 400, 400, 100, 400]
    assert statistics["censored"] == 2
    # IQM of 5 runs: the middle 3 of the sorted values
    assert statistics["steps_to_80"]["iqm"] == pytest.approx((200 + 400 + 400) / 3)
    assert statistics["final_success"]["iqm"] == pytest.approx((0.7 + 0.9 + 1.0) / 3)
    for key in ("steps_to_80", "final_success"):
        low, high = statistics[key]["ci"]
        assert low <= statistics[key]["iqm"] <= high
    unfinished = write_run(tmp_path / "short", 5, [0.0, 0.5], budget=400)
    with pytest.raises(ValueError, match="unfinished RL run .*step 200, budget 400"):
        run_outcome(unfinished)


def test_the_report_refuses_unequal_test_seeds_and_test_seeds_that_tuned(tmp_path):
    rates = [0.0, 1.0]
    test = {
        "dense": [write_run(tmp_path / "dense0", 0, rates), write_run(tmp_path / "dense1", 1, rates)],
        "learned": [write_run(tmp_path / "learned0", 0, rates), write_run(tmp_path / "learned1", 1, rates)],
    }
    tuning = [write_run(tmp_path / "x10_seed7", 7, rates)]
    assert check_test_seeds(test, tuning) == [0, 1]
    with pytest.raises(ValueError, match="same test seeds.*'sparse': \\[0\\]"):
        check_test_seeds({**test, "sparse": [write_run(tmp_path / "sparse0", 0, rates)]}, tuning)
    with pytest.raises(ValueError, match="x20_seed1.*ran on test seeds \\[0, 1\\]"):
        check_test_seeds(test, [*tuning, write_run(tmp_path / "x20_seed1", 1, rates)])


def test_the_best_candidate_by_the_stated_rule_ties_to_the_first_listed(tmp_path):
    runs = {
        "fast": [write_run(tmp_path / "fast", 7, [0.8, 0.9, 0.9])],  # mean 0.867, final 0.9
        "slow": [write_run(tmp_path / "slow", 7, [0.0, 0.5, 1.0])],  # mean 0.5, final 1.0
        "same": [write_run(tmp_path / "same", 7, [0.8, 0.9, 0.9])],
    }
    assert select_candidate(runs, "mean_success")[0] == "fast"
    chosen, scores = select_candidate(runs, "final_success")
    assert chosen == "slow" and scores == {"fast": 0.9, "slow": 1.0, "same": 0.9}


# ---------------------------------------------------------------------- seed bookkeeping in the config

TUNED = {
    "candidates": {"x10": {"reward": {"wrapper": {"scale": 10.0}}}, "x20": {"reward": {"wrapper": {"scale": 20.0}}}}
}


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"tuning": TUNED, "tuning_seeds": [5, 6], "test_seeds": [0, 6]}, r"tuning_seeds and test_seeds share \[6\]"),
        ({"tuning": TUNED, "tuning_seeds": [5, 6, 7]}, r"1 to 2 tuning_seeds .* got \[5, 6, 7\]"),
        ({"tuning": TUNED, "tuning_seeds": []}, "1 to 2 tuning_seeds"),
        ({"tuning_seeds": [5]}, r"tuning_seeds \[5\] without tuning.candidates"),
        ({"test_seeds": [0, 1, 1]}, r"test_seeds \[0, 1, 1\] repeats a seed"),
        ({"test_seeds": []}, "with no test_seeds"),
        ({"rounds": [{"seeds": [1, 9]}], "test_seeds": [0, 1]}, r"rounds\[0\].seeds and test_seeds share \[1\]"),
        ({"tuning": {**TUNED, "condition": "goal_image"}, "tuning_seeds": [5]}, "condition 'goal_image' is not one"),
        ({"tuning": {"candidates": {"x": {"sac": {"lr": 1}}}}, "tuning_seeds": [5]}, r"tuning.candidates.x: .*sac.lr"),
        ({"rounds": [{"progress_rm": {"optim": {"stpes": 3}}}]}, r"rounds\[0\].progress_rm: .*optim.stpes"),
        (
            {"tuning": TUNED, "tuning_seeds": [5], "rl": {"eval": {"seed_start": 20_000}}},
            r"the reset seeds of rl.eval .* reach into those of tuning.eval_seed_start",
        ),
    ],
)
def test_seed_bookkeeping_errors_name_the_bad_setting(settings, message):
    with pytest.raises(ValueError, match=message):
        PipelineConfig(**settings)


def test_every_condition_gets_the_same_test_seeds_and_tuning_only_its_candidates(tmp_path):
    config = PipelineConfig(output_dir=tmp_path, tuning=TUNED, tuning_seeds=[5, 6], test_seeds=[0, 1, 2])
    pipeline = Pipeline(config)
    reward = tmp_path / "rm" / "reward.yaml"
    oracle = pipeline.rl_config("oracle", 0, reward, update=TUNED["candidates"]["x20"])
    assert (oracle.reward.source, oracle.reward.config, oracle.reward.wrapper.scale) == ("oracle", None, 20.0)
    assert oracle.eval.seed_start == config.rl.eval.seed_start  # a test run: the test evaluation seeds
    tuned = pipeline.rl_config("learned", 5, reward, update=pipeline.off_test_update(TUNED["candidates"]["x10"]))
    assert (tuned.reward.wrapper.scale, tuned.eval.seed_start) == (10.0, config.tuning.eval_seed_start)


# ---------------------------------------------------------------------- the oracle potential


def oracle_info(progress, success=False):
    return {"frames": {"top": np.zeros((4, 4, 3), np.uint8)}, "instruction": "reach the red target",
            "is_success": success, "progress": progress}  # fmt: skip


def test_the_oracle_shapes_with_the_envs_true_progress():
    config = RewardWrapperConfig(mode="shaping", gamma=0.9, scale=10.0)
    streams = RewardStreams(None, config, num_envs=2)
    streams.begin_episodes([0, 1], [oracle_info(0.1), oracle_info(0.5)])
    rewards = streams.add_step([oracle_info(0.3), oracle_info(1.0, True)], np.array([-1.0, 0.0]), np.array([0, 1]))
    np.testing.assert_allclose(rewards, [-1 + 10 * (0.9 * 0.3 - 0.1), 0 + 10 * (0 - 0.5)])  # Φ(terminal) = 0
    assert [record.potential for record in streams.monitor] == [0.3, 1.0]
    with pytest.raises(ValueError, match=r"true progress, info\['progress'\]"):
        streams.add_step([{"frames": oracle_info(0.2)["frames"]}] * 2, np.zeros(2), np.zeros(2, bool))  # no progress


# ---------------------------------------------------------------------- stages, with the heavy steps faked


class Fakes:
    """Stand-ins for training, collection, evaluation and RL that record what they were asked to do and
    leave the files the pipeline checks for."""

    def __init__(self, monkeypatch, rates):
        self.rates, self.calls = rates, []
        monkeypatch.setattr("vlm_rewards.training.train.run_training", self.train)
        monkeypatch.setattr("vlm_rewards.robotics.collect.collect", self.collect)
        monkeypatch.setattr("vlm_rewards.evaluation.evaluate.run_eval", self.evaluate)
        monkeypatch.setattr("vlm_rewards.registry.build_reward", lambda reward: None)
        monkeypatch.setattr("vlm_rewards.robotics.rl.run_rl", self.rl)

    def train(self, config, track=None):
        self.calls.append(("train", config))
        (config.output_dir / "model").mkdir(parents=True)

    def collect(self, config, track=None):
        self.calls.append(("collect", config))
        (Path(config.output) / "meta.json").parent.mkdir(parents=True)
        (Path(config.output) / "meta.json").write_text("{}")

    def evaluate(self, config, track=None, reward=None):
        self.calls.append(("eval", config))
        return {"voc_expert": 0.9}

    def rl(self, config):
        self.calls.append(("rl", config))
        run = Path(config.run_dir)
        rate = self.rates(config)
        write_run(run, config.seed, [rate] * 2, every=config.total_timesteps // 2)
        (run / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json")))
        (run / "summary.json").write_text(json.dumps({"timesteps": config.total_timesteps}))
        if config.keep_policy_snapshots:
            (run / "checkpoints").mkdir()
            for steps in range(config.checkpoint_every, config.total_timesteps + 1, config.checkpoint_every):
                (run / "checkpoints" / f"model_{steps:08d}.zip").write_bytes(b"")

    def of(self, kind):
        return [config for name, config in self.calls if name == kind]


def test_rounds_tuning_and_tests_run_in_order_and_a_rerun_redoes_nothing(tmp_path, monkeypatch):
    # the x20 candidate wins tuning; the success rate a run reaches is its shaping scale / 20
    fakes = Fakes(monkeypatch, rates=lambda config: min(config.reward.wrapper.scale / 20, 1.0))
    config = PipelineConfig(
        output_dir=tmp_path,
        preference_stage=None,
        conditions=["sparse", "learned", "oracle"],
        rounds=[{"seeds": [100], "rl": {"total_timesteps": 40, "checkpoint_every": 20}, "episodes": 3,
                 "progress_rm": {"optim": {"steps": 7}}},
                {"seeds": [101, 102], "rl": {"total_timesteps": 20, "checkpoint_every": 20}, "episodes": 2}],
        tuning=TUNED, tuning_seeds=[5], test_seeds=[0, 1, 2, 3, 4],
        rl={"eval": {"video": False}, "total_timesteps": 40},
        rl_workers=1,  # the fakes live in this process
    )  # fmt: skip
    Pipeline(config).run()

    trained = [c.output_dir for c in fakes.of("train")]
    assert trained == [tmp_path / "rm", tmp_path / "round1" / "rm", tmp_path / "round2" / "rm"]
    round1, round2 = fakes.of("train")[1:]
    assert round1.model.backbone == str(tmp_path / "rm" / "model") and round1.optim.steps == 7
    assert round1.data.train == [tmp_path / "data" / "train", tmp_path / "round1" / "data" / "train"]
    assert round2.model.backbone == str(tmp_path / "round1" / "rm" / "model")
    assert round2.data.train[-1] == tmp_path / "round2" / "data" / "train" and len(round2.data.train) == 3

    rl = [(Path(c.run_dir).relative_to(tmp_path), c) for c in fakes.of("rl")]
    round_runs = [c for path, c in rl if path.parts[0].startswith("round")]
    assert [str(c.reward.config) for c in round_runs] == [
        str(tmp_path / "rm" / "reward.yaml"),
        *[str(tmp_path / "round1" / "rm" / "reward.yaml")] * 2,
    ]  # each round's RL uses the RM before it
    assert all(c.keep_policy_snapshots and c.eval.seed_start == config.tuning.eval_seed_start for c in round_runs)
    collected = fakes.of("collect")[-2]  # round 1: seed100's snapshots at 20 and 40 steps, 3 rollouts each
    assert collected.episodes == {"seed100_20": 3, "seed100_40": 3} and collected.seed == config.round_seed(0)
    assert collected.checkpoints["seed100_40"].path.endswith("round1/rl/learned_seed100/checkpoints/model_00000040.zip")

    last_rm = str(tmp_path / "round2" / "rm" / "reward.yaml")
    tuning = [c for path, c in rl if path.parts[0] == "tuning"]
    assert [(c.reward.wrapper.scale, c.seed, c.reward.config) for c in tuning] == [
        (10.0, 5, last_rm),
        (20.0, 5, last_rm),
    ]
    assert all(c.eval.seed_start == config.tuning.eval_seed_start for c in tuning)
    tests = [(str(path), c) for path, c in rl if path.parts[0] == "rl"]
    conditions = ("sparse", "learned", "oracle")
    assert [path for path, _ in tests] == [f"rl/{condition}_seed{s}" for condition in conditions for s in range(5)]
    assert {c.reward.wrapper.scale for _, c in tests} == {20.0}  # the chosen candidate, for every condition
    assert all(c.eval.seed_start == config.rl.eval.seed_start for _, c in tests)
    assert [name for name, _ in fakes.calls[-len(tuning) - len(tests) :]] == ["rl"] * 17  # after every RM stage

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["tuning"]["chosen"] == "x20" and summary["test_seeds"] == [0, 1, 2, 3, 4]
    assert len(summary["runs"]) == 15 + 2 + 3  # every seed run accounted: test, tuning, rounds
    report = (tmp_path / "report.md").read_text()
    assert "| oracle | 5 | 1.00 [1.00, 1.00] | 20 [20, 20] | 0 of 5 |" in report
    assert "| x20 (chosen) | 5 | 1.00 | 1.000 |" in report and "| x10 | 5 | 0.50 | 0.500 |" in report
    assert "| round 2 | learned_seed102 | 102 |" in report

    before = len(fakes.calls)
    Pipeline(config).run()
    assert [name for name, _ in fakes.calls[before:]] == ["eval", "eval"]  # only the RM evaluation is redone


@pytest.mark.parametrize("name", ["reach", "reach_shifts", "reach_shifts_replicate", "carry", "carry_shifts"])
def test_the_result_configs_follow_the_protocol(name):
    from vlm_rewards.config import load_job_config

    config = load_job_config(PipelineConfig, f"configs/experiments/robotics/{name}.yaml")
    assert {"sparse", "dense", "learned", "oracle"} <= set(config.conditions)
    assert len(config.test_seeds) >= 5 and 1 <= len(config.tuning_seeds) <= 2 and config.tuning.candidates
    assert config.rl.reward.wrapper.terminal_potential == "predicted"  # both end on success: main_job_tuning's choice


def test_the_reach_shifts_result_is_the_probes_rm_under_reach_protocol():
    from vlm_rewards.config import changed_settings, load_job_config

    reach, shifts, probe = (
        load_job_config(PipelineConfig, f"configs/experiments/robotics/{name}.yaml").model_dump(mode="json")
        for name in ("reach", "reach_shifts", "reach_shifts_probe")
    )
    protocol = ("output_dir", "rl", "conditions", "tuning", "tuning_seeds", "test_seeds")
    assert changed_settings(probe, shifts, protocol) == []  # the RM recipe the probe chose on tuning seeds
    recipe = ("output_dir", "collect.progress_label", "progress_rm", "reward_shifts")
    assert changed_settings(reach, shifts, recipe) == []  # and reach.yaml's protocol, unchanged
    assert set(probe["test_seeds"]) == set(shifts["tuning_seeds"])  # the probe ran on tuning seeds only


def test_the_carry_shifts_rm_is_the_reach_shifts_recipe_applied_unchanged():
    from vlm_rewards.config import changed_settings, load_job_config

    reach, reach_shifts, carry, carry_shifts = (
        load_job_config(PipelineConfig, f"configs/experiments/robotics/{name}.yaml").model_dump(mode="json")
        for name in ("reach", "reach_shifts", "carry_transfer", "carry_shifts_transfer")
    )

    def setting(config, dotted):
        for name in dotted.split("."):
            config = config[name]
        return config

    def changed(before, after, may_change):
        return {change.split(":")[0] for change in changed_settings(before, after, ("output_dir", *may_change))}

    reach_recipe = changed(reach, reach_shifts, ["collect.progress_label"])  # Carry's stages keep geometric labels
    carry_recipe = changed(carry, carry_shifts, [])
    assert "reward_shifts" in carry_recipe and carry_recipe <= reach_recipe
    for dotted in reach_recipe:
        assert setting(carry_shifts, dotted) == setting(reach_shifts, dotted), dotted


def test_carry_shifts_is_carry_protocol_with_the_shifts_transfer_rm():
    from vlm_rewards.config import changed_settings, load_job_config

    carry, shifts_rm, carry_shifts = (
        load_job_config(PipelineConfig, f"configs/experiments/robotics/{name}.yaml").model_dump(mode="json")
        for name in ("carry", "carry_shifts_transfer", "carry_shifts")
    )
    rm_recipe = ("progress_rm", "reward_shifts")
    assert changed_settings(carry, carry_shifts, ("output_dir", *rm_recipe)) == []  # carry.yaml's protocol
    for section in rm_recipe:
        assert changed_settings(shifts_rm[section], carry_shifts[section]) == [], section


def test_the_reach_shifts_replicate_shares_no_seed_with_the_result():
    from vlm_rewards.config import changed_settings, load_job_config

    result, replicate = (
        load_job_config(PipelineConfig, f"configs/experiments/robotics/{name}.yaml")
        for name in ("reach_shifts", "reach_shifts_replicate")
    )
    seeds = (
        "collect.seed",
        "progress_rm.seed",
        "rl.eval.seed_start",
        "tuning.eval_seed_start",
        "tuning_seeds",
        "test_seeds",
    )
    recipe_and_protocol = changed_settings(
        result.model_dump(mode="json"),
        replicate.model_dump(mode="json"),
        ("output_dir", *seeds),
    )
    assert recipe_and_protocol == []
    assert not set(result.tuning_seeds + result.test_seeds) & set(replicate.tuning_seeds + replicate.test_seeds)
    assert result.progress_rm.seed != replicate.progress_rm.seed
    rollouts = sum(result.collect.episodes.values()) + sum(result.eval_episodes.values())
    assert abs(result.collect.seed - replicate.collect.seed) >= rollouts  # other training rollouts
    assert abs(result.held_out_seed(1) - replicate.held_out_seed(1)) >= rollouts  # other held-out episodes
    assert abs(result.rl.eval.seed_start - replicate.rl.eval.seed_start) >= result.rl.eval.episodes


def test_the_carry_feasibility_run_is_the_protocol_recipe_on_fewer_seeds_before_the_terminal_choice():
    from vlm_rewards.config import changed_settings, load_job_config

    feasibility, protocol = (
        load_job_config(PipelineConfig, f"configs/experiments/robotics/{name}.yaml").model_dump(mode="json")
        for name in ("carry_feasibility", "carry")
    )
    seeds_and_tuning = ("output_dir", "tuning", "tuning_seeds", "test_seeds", "rl.eval.video")
    assert changed_settings(feasibility, protocol, seeds_and_tuning) == [
        "rl.reward.wrapper.terminal_potential: 'zero' -> 'predicted'"  # the feasibility run came first
    ]
    assert feasibility["test_seeds"] == [0, 1] and not feasibility["tuning"]["candidates"]
    assert set(feasibility["test_seeds"]) < set(protocol["test_seeds"])
    header = Path("configs/experiments/robotics/carry_feasibility.yaml").read_text().split("\n", 1)[0]
    assert "FEASIBILITY" in header  # labelled as such where the command is read


def test_the_main_job_tuning_run_is_the_main_job_with_tuning():
    from vlm_rewards.config import changed_settings, load_job_config

    tuned = load_job_config(PipelineConfig, "configs/experiments/robotics/main_job_tuning.yaml")
    main_job = PipelineConfig()
    seeds_and_tuning = ("output_dir", "tuning", "tuning_seeds")
    assert changed_settings(tuned.model_dump(mode="json"), main_job.model_dump(mode="json"), seeds_and_tuning) == []
    chosen = main_job.rl.reward.wrapper.terminal_potential
    assert {"reward": {"wrapper": {"terminal_potential": chosen}}} in tuned.tuning.candidates.values()


def test_a_report_on_few_test_seeds_says_what_they_can_show():
    from vlm_rewards.robotics.report import FULL_TEST_SEEDS, _budget_note

    assert _budget_note(list(range(FULL_TEST_SEEDS))) == []
    note = "\n".join(_budget_note([0, 1]))
    assert "2 test seeds" in note and "configs/experiments/robotics" in note


def test_the_carry_rm_probe_is_the_shifts_rm_on_other_rollouts():
    from vlm_rewards.config import changed_settings, load_job_config

    measured, probe = (
        load_job_config(PipelineConfig, f"configs/experiments/robotics/{name}.yaml")
        for name in ("carry_shifts_transfer", "carry_rm_probe")
    )
    rollouts_only = ("output_dir", "collect.seed")
    assert changed_settings(measured.model_dump(mode="json"), probe.model_dump(mode="json"), rollouts_only) == []
    episodes = sum(measured.collect.episodes.values())
    for factor in [None, *measured.eval_length_factors]:  # None: the training rollouts
        start = measured.collect.seed if factor is None else measured.held_out_seed(factor)
        other = probe.collect.seed if factor is None else probe.held_out_seed(factor)
        assert abs(start - other) >= episodes, factor
