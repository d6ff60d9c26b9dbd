"""Every decoding mode the lean and static loops do not implement goes to `model.generate`, with a warning why."""

import logging

import pytest
from accelerate import Accelerator
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_kit_transformers.generation import TransformersGeneration, TransformersGenerationConfig

# generation_kwargs that select each of transformers' other modes, and how the warning names it.
MODES = {
    "beam search": dict(num_beams=3, do_sample=False),
    "beam sample": dict(num_beams=3),
    "group beam search": dict(num_beams=4, num_beam_groups=2, diversity_penalty=0.5, do_sample=False),
    "dola generation": dict(dola_layers="high"),
    "contrastive search": dict(penalty_alpha=0.6, top_k=4, do_sample=False),
    "assisted generation": dict(prompt_lookup_num_tokens=3),
    "constrained beam search": dict(force_words_ids=[[5]], num_beams=2, do_sample=False),
    "greedy search": dict(do_sample=False),
}


@pytest.mark.parametrize("loop", ["lean", "static"])
@pytest.mark.parametrize("mode", MODES)
def test_a_mode_the_loops_do_not_implement_falls_back_to_generate_with_one_warning(tiny_model, mode, loop, caplog):
    generation = TransformersGeneration(TransformersGenerationConfig(loop=loop, generation_kwargs=MODES[mode]))
    with caplog.at_level(logging.WARNING, logger="grpo_kit_transformers.generation"):
        generation.start(
            AutoModelForCausalLM.from_pretrained(tiny_model),
            AutoTokenizer.from_pretrained(tiny_model),
            Accelerator(cpu=True),
        )
    assert generation.loop == "generate"
    warnings = [record.getMessage() for record in caplog.records if record.name == "grpo_kit_transformers.generation"]
    assert warnings == [
        f"generation.loop={loop}: model.generate samples instead, because the generation config asks for {mode}, "
        "and this loop only samples."
    ]


def test_beam_search_then_generates_through_generate(tiny_model):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    generation = TransformersGeneration(
        TransformersGenerationConfig(max_completion_length=4, generation_kwargs=MODES["beam search"])
    )
    generation.start(AutoModelForCausalLM.from_pretrained(tiny_model), tokenizer, Accelerator(cpu=True))
    out = generation.generate([tokenizer("1+2=").input_ids] * 3)
    assert out.completion_ids.shape[0] == 3 and (out.completion_ids == out.completion_ids[0]).all()  # deterministic
