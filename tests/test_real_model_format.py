"""A model in Hugging Face format with a chat template, and a jsonl of chat-message prompts, end to end."""

import json

import grpo_kit
from grpo_kit.testing import build_tiny_model

# The character tokenizer knows digits and "+-*= " only, so the template writes nothing else.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['content'] }}{% endfor %}{% if add_generation_prompt %}={% endif %}"
)


def test_chat_prompts_through_the_models_template(registry, tmp_path):
    model = build_tiny_model(tmp_path / "model", chat_template=CHAT_TEMPLATE)
    data = tmp_path / "prompts.jsonl"
    rows = [
        {"prompt": [{"role": "user", "content": f"{a}+{b}"}], "solution": str(a + b)}
        for a in range(4)
        for b in range(4)
    ]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    cfg = grpo_kit.compose(
        [
            "+reward=accuracy",
            f"model.name_or_path={model}",
            f"data.path={data}",
            "generation.num_generations=4",
            "generation.max_completion_length=6",
            "trainer.per_device_train_batch_size=8",
            "trainer.max_steps=2",
            "trainer.progress_bar=false",
            "trainer.sample_every=1",
            "trainer.logging_steps=1",
        ],
        registry,
    )
    assert cfg.trainer.learning_rate == 1e-6  # a named model keeps TRL's defaults (model=hf)
    grpo_kit.train(cfg, tmp_path / "run", registry)

    sample = json.loads((tmp_path / "run" / "samples.jsonl").read_text().splitlines()[0])
    assert sample["prompt"] == [{"role": "user", "content": sample["prompt"][0]["content"]}]
    assert isinstance(sample["completion"], list) and sample["completion"][0]["role"] == "assistant"
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 2
    assert (tmp_path / "run" / "model" / "tokenizer_config.json").exists()
