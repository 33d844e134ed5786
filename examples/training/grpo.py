"""Group relative policy optimisation with TRL's GRPOTrainer.

    python grpo.py                                 # a tiny model built here, on a CPU
    python grpo.py --model Qwen/Qwen2.5-0.5B-Instruct --dataset trl-lib/tldr \
        --max-steps 500 --hub-repo me/qwen-grpo    # the same script on a GPU cluster

The reward: completions that say "blue" more often score higher (a stand-in for a real
verifier), and short completions are preferred.
"""

from __future__ import annotations

from typing import Any

import common

ROWS = [{"prompt": "what color is the sky"}, {"prompt": "is the sky blue"}] * 8


def reward(completions: list[Any], **_: Any) -> list[float]:
    texts = [c if isinstance(c, str) else " ".join(m["content"] for m in c) for c in completions]
    return [t.split().count("blue") - 0.1 * len(t.split()) for t in texts]


def main() -> None:
    args = common.parser(__doc__.splitlines()[0]).parse_args()
    output = common.setup(args)
    from trl import GRPOConfig, GRPOTrainer

    model, tokenizer = common.model_and_tokenizer(args.model)
    config = GRPOConfig(
        output_dir=output,
        max_steps=args.max_steps,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        logging_steps=1,
        save_strategy="no",
        report_to=common.report_to(),
        use_cpu=not common.has_gpu(),
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=common.dataset(args.dataset, ROWS),
        processing_class=tokenizer,
    )
    trainer.train()
    common.publish(trainer, args)


if __name__ == "__main__":
    main()
