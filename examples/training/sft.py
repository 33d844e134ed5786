"""Supervised fine-tuning with TRL's SFTTrainer.

    python sft.py                                  # a tiny model built here, on a CPU
    python sft.py --model Qwen/Qwen2.5-0.5B --dataset trl-lib/Capybara --max-steps 500 \
        --hub-repo me/qwen-sft                     # the same script on a GPU cluster

As a Corral job: corral submit --training sft --script sft.py --env ray (docs/how-to/training.md).
"""

from __future__ import annotations

import common

ROWS = [
    {"text": "the cat sat on the mat"},
    {"text": "the dog ran on the rug"},
    {"text": "what color is the sky it is blue"},
    {"text": "a good dog is a good dog"},
] * 4


def main() -> None:
    args = common.parser(__doc__.splitlines()[0]).parse_args()
    output = common.setup(args)
    from trl import SFTConfig, SFTTrainer

    model, tokenizer = common.model_and_tokenizer(args.model)
    config = SFTConfig(
        output_dir=output,
        max_steps=args.max_steps,
        per_device_train_batch_size=4,
        logging_steps=1,
        save_strategy="no",
        report_to=common.report_to(),
        max_length=32,
        use_cpu=not common.has_gpu(),
    )
    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=common.dataset(args.dataset, ROWS),
        processing_class=tokenizer,
    )
    trainer.train()
    common.publish(trainer, args)


if __name__ == "__main__":
    main()
