"""A verifiers taskset as grpo_kit's training prompts, and a prompt row back as the verifiers task it came from.

A row holds the task's prompt (`prompt`, which grpo_kit logs), its taskset's id and its whole
`TaskData` as JSON, so that the rollout rebuilds exactly that task, with its answer and its reward functions:

    python -m grpo_kit_verifiers.tasks TASKSET_ID tasks.jsonl [--limit N]
    python -m grpo_kit +rollout=verifiers +reward=verifiers data.path=tasks.jsonl
"""

import argparse
import json
from pathlib import Path

TASKSET_COLUMN, TASK_COLUMN = "verifiers_taskset", "verifiers_task"


def load_taskset(taskset_id: str):
    """The installed taskset of that id (a package, or `owner/name` from the Environments Hub installed as one)."""
    import verifiers.v1 as vf

    return vf.load_taskset(vf.taskset_config_type(taskset_id).model_validate({"id": taskset_id}))


def rows(taskset, limit: int | None = None) -> list[dict]:
    """One prompt row per task, in the taskset's order."""
    if limit is None and not taskset.bounded:
        raise ValueError(f"the taskset {taskset.config.id} never ends: give the number of tasks to write (--limit N)")
    view = taskset if limit is None else taskset.take(limit)
    return [
        {
            "prompt": prompt_of(task.data),
            TASKSET_COLUMN: taskset.config.id,
            TASK_COLUMN: task.data.model_dump_json(exclude_none=True),
        }
        for task in view
    ]


def prompt_of(data) -> str | list[dict]:
    """The task's opening as the harness sends it: a text prompt stays text (a base model without a chat template
    can read it); messages, or a system prompt, make chat messages."""
    if isinstance(data.prompt, str) and not data.system_prompt:
        return data.prompt
    messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if isinstance(data.prompt, str):
        return [*messages, {"role": "user", "content": data.prompt}]
    return messages + [message.model_dump(exclude_none=True) for message in data.prompt or []]


def task_of(taskset, row: dict):
    """The verifiers task a row was written from, with the taskset's task options."""
    task_type = type(taskset).task_type()
    return task_type(task_type.data_type().model_validate_json(row[TASK_COLUMN]), taskset.config.task)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write a verifiers taskset as grpo_kit prompt rows (JSONL).")
    parser.add_argument("taskset", help="the taskset's id: an installed package, e.g. one from the Environments Hub")
    parser.add_argument("output", type=Path, help="the JSONL file to write, for data.path")
    parser.add_argument("--limit", type=int, default=None, help="the first N tasks only (needed for endless ones)")
    arguments = parser.parse_args(argv)
    written = rows(load_taskset(arguments.taskset), arguments.limit)
    arguments.output.write_text("".join(json.dumps(row) + "\n" for row in written))
    print(f"{len(written)} tasks of {arguments.taskset} -> {arguments.output}")


if __name__ == "__main__":
    main()
