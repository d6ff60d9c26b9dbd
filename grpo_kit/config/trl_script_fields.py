"""A recipe's fields that are not GRPOConfig's: TRL's script arguments (`trl grpo --config`: ScriptArguments,
ModelConfig, GRPOScriptArguments), open-r1's, and those older TRL and transformers had, which recipes still carry.
Read beside grpo_kit/config/trl_fields.py, as its table is."""

from grpo_kit.config import trl_rewards as rewards
from grpo_kit.config.trl_entries import Mapped, NotApplicable, Refusal, Refused, same


def reward_option(reward: str, option: str) -> Mapped:
    """open-r1's field for one option of a reward: reward.REWARD.OPTION, set where the recipe selects that reward."""
    return Mapped(f"reward.{reward}.{option}", rewards.reward_option(reward, option))


REMOVED = "not a field of TRL 1.16's GRPOConfig (older TRL or transformers had it)"
OWN_PROMPTS = (
    "grpo_kit reads the dataset's `prompt` column as it is (text or chat messages), as TRL's grpo script does; "
    "open-r1 builds prompts from another column and a system prompt"
)
PROMPT_NEAREST = "a dataset with a `prompt` column of chat messages, the system message first (data.path)"
QUANTISED = "no quantised (bitsandbytes) training"


def init_kwarg(name: str):
    """A from_pretrained keyword that TRL's ModelConfig passes on; merged with model_init_kwargs."""
    return lambda value, recipe: {"model.model_init_kwargs": {name: value}} if value is not None else {}


def lora(option: str):
    # TRL's script reads the LoRA settings only with use_peft; grpo_kit's defaults are ModelConfig's (16, 32, 0.05).
    return lambda value, recipe: {f"model.lora.{option}": value} if recipe.get("use_peft") else {}


def dataset_configs(value, recipe: dict) -> dict:
    if len(value) != 1:
        raise Refusal("grpo_kit trains on one configuration of one dataset", "data.name")
    return {"data.name": value[0]}


SCRIPT = {
    "model_name_or_path": same("model.name_or_path", "selects model=hf, TRL's defaults"),
    "model_revision": Refused(
        "the model is loaded at its main revision", "a local folder (model.name_or_path)", "main"
    ),
    "dtype": Mapped("model.model_init_kwargs.dtype", init_kwarg("dtype")),
    "torch_dtype": Mapped("model.model_init_kwargs.dtype", init_kwarg("dtype"), "older name of dtype"),
    "attn_implementation": Mapped("model.model_init_kwargs.attn_implementation", init_kwarg("attn_implementation")),
    "use_peft": same("model.lora.enabled"),
    "lora_r": Mapped("model.lora.r", lora("r"), "with use_peft"),
    "lora_alpha": Mapped("model.lora.alpha", lora("alpha"), "with use_peft"),
    "lora_dropout": Mapped("model.lora.dropout", lora("dropout"), "with use_peft"),
    "lora_target_modules": Mapped("model.lora.target_modules", lora("target_modules"), "with use_peft"),
    "lora_target_parameters": Refused("LoRA adapts modules, not single parameters", "model.lora.target_modules", None),
    "lora_modules_to_save": Refused("no fully trained modules beside the adapters", "model.lora.target_modules", None),
    "lora_task_type": NotApplicable("grpo_kit's policy is always a causal LM"),
    "use_rslora": Refused("no rank-stabilised LoRA", "model.lora.alpha", False),
    "use_dora": Refused("no DoRA", "model.lora", False),
    "load_in_8bit": Refused(QUANTISED, "model.lora", False),
    "load_in_4bit": Refused(QUANTISED, "model.lora", False),
    "bnb_4bit_quant_type": Refused(QUANTISED, "model.lora", "nf4"),
    "use_bnb_nested_quant": Refused(QUANTISED, "model.lora", False),
    "bnb_4bit_quant_storage": Refused(QUANTISED, "model.lora", None),
    "dataset_name": same("data.path", "selects data=hf, TRL's defaults"),
    "dataset_config": same("data.name"),
    "dataset_configs": Mapped("data.name", dataset_configs, "open-r1's list: one name"),
    "dataset_train_split": same("data.split"),
    "dataset_test_split": Mapped("eval.split", lambda value, recipe: {}, "read with eval_strategy"),
    "dataset_streaming": Refused("the dataset is loaded whole", "none", False),
    "ignore_bias_buffers": NotApplicable("a DDP setting of TRL's DPO scripts; GRPO does not read it"),
    "gradient_checkpointing_use_reentrant": Mapped(
        "trainer.gradient_checkpointing_kwargs.use_reentrant",
        lambda value, recipe: {"trainer.gradient_checkpointing_kwargs": {"use_reentrant": value}},
    ),
    "reward_funcs": Mapped("reward", rewards.rewards, "accuracy, cosine, ...: a reward plugin each"),
    "reward_model_name_or_path": Mapped("reward.reward_model.path", rewards.rewards),
    "system_prompt": Refused(OWN_PROMPTS, PROMPT_NEAREST, None),
    "dataset_prompt_column": Refused(OWN_PROMPTS, PROMPT_NEAREST, "prompt"),
    "chat_template": Refused("the tokenizer's own chat template renders prompts", "a model folder with it", None),
    "cosine_min_value_wrong": reward_option("cosine_scaled", "min_value_wrong"),
    "cosine_max_value_wrong": reward_option("cosine_scaled", "max_value_wrong"),
    "cosine_min_value_correct": reward_option("cosine_scaled", "min_value_correct"),
    "cosine_max_value_correct": reward_option("cosine_scaled", "max_value_correct"),
    "cosine_max_len": reward_option("cosine_scaled", "max_len"),
    "repetition_n_grams": reward_option("repetition_penalty", "ngram_size"),
    "repetition_max_penalty": reward_option("repetition_penalty", "max_penalty"),
    "max_completion_len": reward_option("soft_overlong", "max_completion_len"),
    "soft_punish_cache": reward_option("soft_overlong", "soft_punish_cache"),
    "wandb_project": same("trainer.project", "open-r1's"),
    "wandb_entity": Refused("wandb's entity is wandb's own setting", "WANDB_ENTITY", None),
    "wandb_run_group": Refused("no run groups", "trainer.run_name", None),
    "warmup_ratio": same("trainer.warmup_ratio", "transformers 4's; 5 reads warmup_steps < 1 as a share"),
    "max_prompt_length": Refused(REMOVED + "; grpo_kit never cuts a prompt", "shorter prompts in the dataset", None),
    "overwrite_output_dir": Refused(
        REMOVED + "; a run never writes into another run's folder", "trainer.resume=auto", False
    ),
    "vllm_device": Refused(REMOVED, "generation=vllm_server on a GPU of its own (docs/generation.md)", None),
    "env": Refused("the command sets no environment variables", "set them in the shell, before the command", None),
    "num_processes": NotApplicable("the launcher's setting: accelerate launch --num_processes N"),
}
