"""reward_model: a Hugging Face sequence-classification model scores each prompt + completion by its first logit.

As TRL's GRPOTrainer scores with a reward model (https://huggingface.co/docs/trl/grpo_trainer, "Using a reward
model"): a text prompt and its completion are joined as text; chat messages are joined as one conversation and
rendered with the reward model's own chat template; the model reads them right-padded with no special tokens
added. Here the model also runs in batches of `batch_size`, on its own `device`, and `max_length` (if set) cuts
long texts from the left, keeping the end where the model reads its score.
"""

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer


class RewardModel:
    def __init__(self, config):
        if not config.path:
            raise ValueError(
                "reward.reward_model.path is not set: name a sequence-classification reward model, a Hugging Face "
                "model id or a local folder, e.g. reward.reward_model.path=Skywork/Skywork-Reward-V2-Qwen3-0.6B"
            )
        if config.batch_size < 1:
            raise ValueError(f"reward.reward_model.batch_size must be >= 1, got {config.batch_size}.")
        self.device = torch.device(_auto_device() if config.device == "auto" else config.device)
        # A config built in Python keeps its default unresolved (a string): it trusts nothing.
        trust_remote_code = config.trust_remote_code is True
        self.tokenizer = AutoTokenizer.from_pretrained(
            config.path, truncation_side="left", trust_remote_code=trust_remote_code
        )
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(
            config.path, dtype=config.dtype, trust_remote_code=trust_remote_code
        )
        self.model.config.pad_token_id = self.tokenizer.pad_token_id  # how it finds each text's last token
        self.model.to(self.device).eval()
        self.batch_size, self.max_length = config.batch_size, config.max_length

    def __call__(self, prompts, completions, completion_ids, **columns) -> list[float]:
        texts = [self._text(prompt, completion) for prompt, completion in zip(prompts, completions)]
        scores = []
        for start in range(0, len(texts), self.batch_size):
            batch = self.tokenizer(
                texts[start : start + self.batch_size],
                padding=True,
                padding_side="right",
                truncation=self.max_length is not None,
                max_length=self.max_length,
                add_special_tokens=False,
                return_tensors="pt",
            ).to(self.device)
            with torch.inference_mode():
                scores += self.model(**batch).logits[:, 0].float().tolist()
        return scores

    def _text(self, prompt, completion) -> str:
        if isinstance(prompt, list):  # chat messages: one conversation, in the reward model's own template
            return self.tokenizer.apply_chat_template(prompt + completion, tokenize=False)
        return prompt + completion


def _auto_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"
