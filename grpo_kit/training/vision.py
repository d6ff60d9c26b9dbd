"""What a run with images in its prompts needs, checked before the model is trained (docs/vision.md)."""

import datasets
from omegaconf import DictConfig, OmegaConf

from grpo_kit.contract.errors import ConfigError
from grpo_kit.contract.kinds import declared
from grpo_kit.model.loading import load_processor
from grpo_kit.rollout.images import ImagePrompts, check_images, image_column


def image_prompts(cfg: DictConfig, prompt_sets: list[datasets.Dataset], generation) -> ImagePrompts | None:
    """The renderer of a vision-language policy's prompts, once every image of every prompt set has been read and
    the run's choices checked; None for a policy that reads text alone (whose data may then hold no image)."""
    processor = load_processor(cfg.model)
    for dataset in prompt_sets:
        if processor is None:
            check_images(dataset, "The dataset", None)
        else:
            check_images(dataset, "The dataset", processor.image_token, processor.image_processor)
    if processor is None:
        return None
    if any(image_column(dataset) for dataset in prompt_sets):
        check_image_run(cfg, generation)
    kwargs = OmegaConf.to_container(cfg.data, resolve=True)["chat_template_kwargs"]
    return ImagePrompts(processor, cfg.model.name_or_path or "the embedded vision-language model", kwargs)


def check_image_run(cfg: DictConfig, generation) -> None:
    """Refuse what would drop the images silently: a backend that cannot send them, a pass that cannot carry them."""
    if not declared(generation, "generation", "accepts_images"):
        raise ConfigError(
            f"generation={cfg.generation.name} cannot generate from prompts with images (it does not declare "
            "accepts_images). Use generation=transformers, vllm_server or vllm_colocate."
        )
    refused = {
        "trainer.packing=true": cfg.trainer.packing,
        "tool use (+environment, tools=[...])": cfg.environment is not None or bool(cfg.tools),
        "+rollout (a rollout plugin)": cfg.rollout is not None,
        "rollout_files.save / rollout_files.replay (frozen rollouts)": cfg.rollout_files.save
        or bool(cfg.rollout_files.replay),
    }
    for setting, chosen in refused.items():
        if chosen:
            raise ConfigError(
                f"{setting} does not carry a prompt's images yet, and this dataset has images: turn it off for a "
                "vision-language run."
            )
