"""Direct preference optimisation with TRL's DPOTrainer.

    python dpo.py                                  # a tiny model built here, on a CPU
    python dpo.py --model Qwen/Qwen2.5-0.5B-Instruct --dataset trl-lib/ultrafeedback_binarized \
        --max-steps 500 --hub-repo me/qwen-dpo     # the same script on a GPU cluster

The reference model is given explicitly: without one, DPOTrainer asks the Hub for it.
"""

from __future__ import annotations

import common

ROWS = [
    {"prompt": "what color is the sky", "chosen": "it is blue", "rejected": "it is red"},
    {"prompt": "is the cat on the mat", "chosen": "yes", "rejected": "no"},
    {"prompt": "is it a good dog", "chosen": "yes it is", "rejected": "no it is bad"},
    {"prompt": "what sat on the rug", "chosen": "the cat", "rejected": "the sky"},
] * 4


def main() -> None:
    args = common.parser(__doc__.splitlines()[0]).parse_args()
    output = common.setup(args)
    from trl import DPOConfig, DPOTrainer

    model, tokenizer = common.model_and_tokenizer(args.model)
    ref_model, _ = common.model_and_tokenizer(args.model)
    config = DPOConfig(
        output_dir=output,
        max_steps=args.max_steps,
        per_device_train_batch_size=4,
        logging_steps=1,
        save_strategy="no",
        report_to=common.report_to(),
        max_length=32,
        use_cpu=not common.has_gpu(),
    )
    trainer = DPOTrainer(
        model=model,
        ref_model=ref_model,
        args=config,
        train_dataset=common.dataset(args.dataset, ROWS),
        processing_class=tokenizer,
    )
    trainer.train()
    common.publish(trainer, args)


if __name__ == "__main__":
    main()
