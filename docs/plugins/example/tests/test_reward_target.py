import json
import types

from grpo_kit_example.reward_target import RewardTarget, RewardTargetConfig


def test_the_first_step_at_the_target_is_written(tmp_path):
    hook = RewardTarget(RewardTargetConfig(target=0.5))
    run = types.SimpleNamespace(directory=tmp_path)
    for step, reward in enumerate([0.2, 0.55, 0.4, 0.7], start=1):
        hook.on_log(run=run, step=step, metrics={"reward": reward})
    hook.on_train_end(run=run)
    assert json.loads((tmp_path / "reward_target.json").read_text()) == {"target": 0.5, "reached_at_step": 2}
