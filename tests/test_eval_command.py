"""`grpo-kit eval`: a run's final model and its checkpoints evaluated without training, into eval.json, which the
sweep report picks up."""

import json
import shutil

import pytest

import grpo_kit
from grpo_kit.cli import commands
from grpo_kit.plugins.registry import Registry, plugin_manager
from grpo_kit.report.build import write_report
from grpo_kit.testing import tiny_run


@pytest.fixture(scope="module")
def finished_run(tiny_model, tmp_path_factory):
    """Two steps with a checkpoint after each and pass@k on an eval file at the end."""
    root = tmp_path_factory.mktemp("eval-command")
    eval_file = root / "eval.jsonl"
    eval_file.write_text("".join(json.dumps({"prompt": f"{a}+1=", "solution": str(a + 1)}) + "\n" for a in range(4)))
    registry = Registry(plugin_manager())
    overrides = tiny_run(
        tiny_model,
        "+reward=accuracy",
        "trainer.max_steps=2",
        "trainer.save_steps=1",
        "trainer.reward_workers=0",
        f"eval.path={eval_file}",
        "eval.num_samples=2",
    )
    return grpo_kit.train(grpo_kit.compose(overrides, registry), root / "run", registry)


def evaluated(path) -> dict:
    return json.loads(path.read_text())


def test_a_finished_run_is_evaluated_as_its_last_evaluation(finished_run, capsys):
    assert commands.main(["eval", str(finished_run)]) == 0
    result = evaluated(finished_run / "eval.json")
    logged = json.loads((finished_run / "metrics.jsonl").read_text().splitlines()[-1])
    assert result["step"] == 2
    assert result["metrics"] == {name: value for name, value in logged.items() if name.startswith("eval/")}
    table = capsys.readouterr().out
    assert table.splitlines()[0].split() == ["set", "reward", "pass@1", "pass@2", "maj@2"]
    assert table.splitlines()[1].startswith("(held-out)")


def test_a_checkpoint_is_evaluated_with_overrides(finished_run, tmp_path):
    checkpoint = finished_run / "checkpoints" / "step-000001"
    more = tmp_path / "more.jsonl"
    more.write_text(json.dumps({"prompt": "2+2=", "solution": "4"}) + "\n")
    assert commands.main(["eval", str(checkpoint), f"eval.sets.more.path={more}", "eval.num_samples=1"]) == 0
    result = evaluated(checkpoint / "eval.json")
    assert result["step"] == 1
    assert {"eval/reward", "eval/pass@1", "eval/more/reward", "eval/more/pass@1"} <= set(result["metrics"])
    assert "eval/pass@2" not in result["metrics"]
    output = tmp_path / "elsewhere.json"
    assert commands.main(["eval", str(checkpoint), "--output", str(output)]) == 0
    assert evaluated(output)["step"] == 1


def test_a_model_folder_is_evaluated_on_the_sets_given(tiny_model, tmp_path):
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text(json.dumps({"prompt": "2+2=", "solution": "4"}) + "\n")
    output = tmp_path / "eval.json"
    arguments = [str(tiny_model), "+reward=accuracy", f"eval.path={eval_file}", "--output", str(output)]
    assert commands.main(["eval", *arguments]) == 0
    assert evaluated(output)["step"] == 0
    assert 0.0 <= evaluated(output)["metrics"]["eval/reward"] <= 1.0


def test_bad_paths_and_overrides_are_refused(finished_run, tmp_path, capsys):
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    foreign = tmp_path / "another_tool"  # a folder of another tool's, with a config.yaml of its own
    (foreign / "model").mkdir(parents=True)
    (foreign / "config.yaml").write_text("learning_rate: 0.1\nlayers: [1, 2]\n")
    shutil.copy(finished_run / "config.yaml", unfinished / "config.yaml")
    for arguments, message in [
        ([str(tmp_path)], "is neither a run directory"),
        ([str(unfinished)], "has no model yet"),
        ([str(finished_run), "+reward=think_format"], f"grpo-kit eval {finished_run / 'model'} +reward=think_format"),
        ([str(foreign)], "config.yaml is not the config of a grpo_kit run"),
        ([str(finished_run), "--output", str(tmp_path / "missing" / "eval.json")], "does not exist. Create it"),
        ([str(finished_run), "eval.pass_at=[1,4]"], "k=4 is not"),
        ([str(finished_run), "eval.num_sample=4"], "Did you mean 'eval.num_samples'"),
    ]:
        assert commands.main(["eval", *arguments]) == 1
        assert message in capsys.readouterr().err


def test_the_report_shows_eval_json(finished_run):
    if not (finished_run / "eval.json").exists():
        assert commands.main(["eval", str(finished_run)]) == 0
    write_report(finished_run, plots=False)
    report = (finished_run / "report.md").read_text()
    assert "## Evaluations (grpo-kit eval)" in report
    assert "| run | step | eval/reward | eval/pass@1 | eval/pass@2 | eval/maj@2 |" in report
    metrics = evaluated(finished_run / "eval.json")["metrics"]
    assert f"| . | 2 | {metrics['eval/reward']:.3f} |" in report


def test_the_final_model_named_itself_is_evaluated_with_other_plugins(finished_run, tmp_path, capsys):
    """The refusal above names this command: it must work, not be refused again."""
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text(json.dumps({"prompt": "2+2=", "solution": "4"}) + "\n")
    output = tmp_path / "eval.json"
    arguments = [str(finished_run / "model"), "+reward=think_format", f"eval.path={eval_file}", "--output", str(output)]
    assert commands.main(["eval", *arguments]) == 0, capsys.readouterr().err
    assert "eval/rewards/think_format" in " ".join(evaluated(output)["metrics"])


def test_a_checkpoint_rotated_away_during_the_evaluation_is_said_plainly(finished_run, tmp_path, monkeypatch, capsys):
    copy = tmp_path / "run"
    shutil.copytree(finished_run, copy)
    checkpoint = copy / "checkpoints" / "step-000001"
    from grpo_kit.cli import evaluate

    real = evaluate.evaluate

    def rotated_meanwhile(cfg, target, registry):
        shutil.rmtree(checkpoint)  # as the run's save_total_limit does while this one loads
        return real(cfg, target, registry)

    monkeypatch.setattr(evaluate, "evaluate", rotated_meanwhile)
    assert commands.main(["eval", str(checkpoint)]) == 1
    assert "went away during the evaluation" in capsys.readouterr().err
