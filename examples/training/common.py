"""What the three example trainers share: the model, the tokenizer, the data and the hand-off.

`--model tiny` (the default) builds a two-layer GPT-2 with a 24-word vocabulary inside the
script, so the examples run on a CPU with no download; any other value is a Hub model id (or a
local directory) loaded with `from_pretrained`, as on a GPU cluster. `--dataset tiny` likewise
builds a few rows in the script; any other value is loaded with `datasets.load_dataset`.

Corral adds only environment (docs/how-to/training.md): where checkpoints go, the W&B run id and
mode, and a file with the secrets (HF_TOKEN, WANDB_API_KEY) that `corral.runtime_script` reads.
Run outside Corral, the same script takes them from its own environment.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
from pathlib import Path
from typing import Any

WORDS = (
    *("the", "cat", "dog", "sat", "ran", "on", "mat", "rug", "a", "good", "bad", "yes", "no"),
    *("is", "it", "what", "color", "sky", "blue", "red", "user", "assistant"),
)
SPECIAL = ("[PAD]", "[UNK]", "[EOS]")
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant {% endif %}"
)


def corral() -> Any | None:
    """Corral's runtime module for scripts, when the script runs as a Corral job."""
    try:
        import corral.runtime_script as rs
    except ImportError:
        return None
    return rs if rs.in_job() else None


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", default="tiny", help="a Hub model id, a directory, or `tiny`")
    p.add_argument("--dataset", default="tiny", help="a Hub dataset id, or `tiny`")
    p.add_argument("--output", default="out", help="checkpoints (Corral's own directory wins)")
    p.add_argument("--max-steps", type=int, default=3)
    p.add_argument("--hub-repo", help="push the final model to this Hub repo id")
    p.add_argument(
        "--hub-dir",
        help="an offline Hub stand-in: save the model to DIR/<repo id> instead of pushing",
    )
    return p


def setup(args: argparse.Namespace) -> str:
    """Secrets into this process's environment (for the Hub and W&B libraries); returns the
    checkpoint directory."""
    rs = corral()
    if rs is not None:
        rs.export_secrets()
        return str(rs.checkpoint_dir() or args.output)
    return str(args.output)


def report_to() -> str:
    """W&B when it is installed and not disabled, else nothing."""
    if os.environ.get("WANDB_MODE") == "disabled" or importlib.util.find_spec("wandb") is None:
        return "none"
    return "wandb"


def model_and_tokenizer(name: str) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if name != "tiny":
        tok = AutoTokenizer.from_pretrained(name)
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        return AutoModelForCausalLM.from_pretrained(name), tok
    return tiny_model(), tiny_tokenizer()


def tiny_tokenizer() -> Any:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate((*SPECIAL, *WORDS))}
    raw = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = Whitespace()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]"
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def tiny_model() -> Any:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    vocab = len(SPECIAL) + len(WORDS)
    config = GPT2Config(
        vocab_size=vocab,
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_positions=64,
        bos_token_id=2,
        eos_token_id=2,
        pad_token_id=0,
    )
    return GPT2LMHeadModel(config)


def dataset(name: str, rows: list[dict[str, Any]]) -> Any:
    """`rows` as a dataset for `tiny`, else the named dataset's train split."""
    from datasets import Dataset, load_dataset

    if name == "tiny":
        return Dataset.from_list(rows)
    return load_dataset(name, split="train")


def publish(trainer: Any, args: argparse.Namespace) -> None:
    """The final model to the Hub (or its offline stand-in), then its repo id and revision to
    Corral's result file."""
    if not args.hub_repo:
        trainer.save_model(trainer.args.output_dir)
        return
    if args.hub_dir:
        dest = Path(args.hub_dir) / args.hub_repo
        trainer.save_model(str(dest))
        trainer.processing_class.save_pretrained(str(dest))
        revision = tree_digest(dest)
    else:
        info = trainer.push_to_hub(commit_message="trained as a Corral job")
        revision = getattr(info, "oid", None) or str(info)
    print(f"pushed {args.hub_repo} at revision {revision}", flush=True)
    rs = corral()
    if rs is not None:
        rs.record_model(repo_id=args.hub_repo, revision=revision)


def tree_digest(root: Path) -> str:
    """A revision for the stand-in: sha1 over the files' names and bytes, like a commit id."""
    h = hashlib.sha1()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()


def has_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())
