"""TRL's vLLM fields as grpo_kit's generation backends: `use_vllm` with `vllm_mode` chooses vllm_server or
vllm_colocate, and each vllm_* field becomes that backend's option where TRL reads it in that mode."""

from typing import Any

from grpo_kit.config.trl_entries import Refusal, Translate

BACKENDS = {"server": "vllm_server", "colocate": "vllm_colocate"}


def mode_of(recipe: dict) -> str | None:
    """server, colocate (TRL 1.16's default mode), or None without vLLM."""
    return recipe.get("vllm_mode", "colocate") if recipe.get("use_vllm") else None


def use_vllm(value, recipe: dict) -> dict:
    if not value:
        return {}
    mode = mode_of(recipe)
    if mode not in BACKENDS:
        raise Refusal(f"vllm_mode={mode} is neither server nor colocate", "generation=vllm_server")
    return {"generation": BACKENDS[mode]}


def read_with_use_vllm(value, recipe: dict) -> dict:
    return {}  # use_vllm's translation reads vllm_mode


def in_mode(mode: str, key: str, default: Any, convert=lambda value: value) -> Translate:
    """A field TRL reads only in `mode`: the backend's `key` there; elsewhere nothing, if it is TRL's default."""

    def translate(value, recipe: dict) -> dict:
        if mode_of(recipe) == mode:
            return {key: convert(value)}
        if value == default:
            return {}
        raise Refusal(f"TRL reads it only with use_vllm and vllm_mode={mode}", f"generation={BACKENDS[mode]} {key}")

    return translate


def server_url(recipe: dict) -> str | None:
    """TRL's base URL wins over host and port; without any of the three, the backend's own default."""
    if recipe.get("vllm_server_base_url"):
        return recipe["vllm_server_base_url"]
    if "vllm_server_host" not in recipe and "vllm_server_port" not in recipe:
        return None
    return f"http://{recipe.get('vllm_server_host', '0.0.0.0')}:{recipe.get('vllm_server_port', 8000)}"


def server_address(default: Any) -> Translate:
    """vllm_server_base_url, _host and _port, which together make the server backend's base_url."""

    def translate(value, recipe: dict) -> dict:
        if mode_of(recipe) == "server":
            url = server_url(recipe)
            return {} if url is None else {"generation.base_url": url}
        if value == default:
            return {}
        raise Refusal("TRL reads it only with use_vllm and vllm_mode=server", "generation=vllm_server")

    return translate


def sleep_level(value) -> int:
    return 2 if value else 0  # TRL's sleep mode puts vLLM to sleep at level 2: its weights and KV cache freed


def structured_outputs_regex(value, recipe: dict) -> dict:
    """TRL sends it to vLLM in either mode and, without vLLM, drops it; grpo_kit's transformers backend refuses it."""
    if value is None:
        return {}
    if mode_of(recipe) is None:
        raise Refusal(
            "TRL ignores it without use_vllm, and grpo_kit's transformers backend cannot constrain its sampling",
            "use_vllm: true",
        )
    return {"generation.structured_outputs_regex": value}
