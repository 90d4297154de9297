r"""The main job: teach a model its name, save it, then ask it who it is.

    python cookbook/quickstart.py     # the bundled tiny model: about a minute on a CPU
    python cookbook/quickstart.py --model-id ms://Qwen/Qwen3-4B \
        --dataset-id ms://swift/self-cognition     # a real model, on a GPU

The loop is the one the user's documents write for a single GPU: a Dataset that
fills the self-cognition rows with a name and an author, a TransformersModel, an
optimizer and a cosine schedule, then forward_backward and clip_grad_and_step per
batch. The device is picked automatically (CUDA or NPU when present, else the CPU);
only the ids change between a laptop and a GPU.

Honest about the defaults: the bundled ``tiny-qwen3`` is a random init (2 layers,
hidden size 64) with no knowledge at all, so it learns its whole answer from these
100 rows: it trains every parameter at a high learning rate for many epochs, which
is pretraining from scratch on a toy set, not fine-tuning. A pretrained model
already speaks and only has to learn its new name, so it gets LoRA at the
documents' learning rate instead.
"""

from __future__ import annotations

import argparse
import time

from peft import LoraConfig
from tqdm import tqdm

from twinkle import get_device_placement, get_logger
from twinkle.data_format import SamplingParams
from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.model import TransformersModel
from twinkle.preprocessor import SelfCognitionProcessor
from twinkle.sampler import TorchSampler
from twinkle.utils.tracking import BACKENDS, create_tracker, plot_metric

logger = get_logger()

NAME, AUTHOR = "Twinkle", "ModelScope"
QUESTION = "Who are you?"


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The examples as written, and every flag's default where it has a fixed one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None:  # the help says what None means for that flag
            return action.help or ""
        return super()._get_help_string(action)


def parse_args(argv: list[str] | None = None, prog: str | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=__doc__.split("\n", 1)[0],
        epilog="examples:\n" + __doc__.split("\n\n", 2)[1],
        formatter_class=HelpFormatter,
    )
    flag = parser.add_argument
    flag("--model-id", default="bundled://tiny-qwen3", help="model: a hub id or a local folder")
    flag("--dataset-id", default="bundled://self-cognition", help="self-cognition rows to learn")
    flag("--epochs", type=positive_int, default=30, help="passes over the dataset")
    flag("--batch-size", type=positive_int, default=8, help="rows per optimizer step")
    flag(
        "--lr",
        type=positive_float,
        default=None,
        help="peak learning rate (default: 1e-2 for a bundled from-scratch model, 1e-4 for LoRA)",
    )
    flag(
        "--lora-rank",
        type=positive_int,
        default=None,
        help="LoRA rank (default: 8 for a pretrained model; the bundled model trains in full "
        "unless this is given)",
    )
    flag("--max-steps", type=positive_int, help="stop after this many steps, for quick runs")
    flag("--output-dir", default="output/quickstart", help="where the checkpoint is saved")
    flag(
        "--report-to",
        nargs="+",
        default=["none"],
        metavar="TRACKER",
        help=f"experiment trackers: none or any of {', '.join(BACKENDS)} "
        "(metrics.jsonl and loss_curve.png are always written to the output dir)",
    )
    flag("--version", action="version", version=f"%(prog)s {_version()}")
    return parser.parse_args(argv)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("twinkle-rl")
    except PackageNotFoundError:  # a source tree run without installing
        return "unknown (twinkle-rl not installed)"


def answer(sampler: TorchSampler, question: str, max_new_tokens: int = 64) -> str:
    """The trained model's greedy reply, sampled as an RL loop samples."""
    trajectory = {"messages": [{"role": "user", "content": question}]}
    params = SamplingParams(max_tokens=max_new_tokens, temperature=0.0)
    (response,) = sampler.sample([trajectory], params)
    # Real Qwen3 templates train every reply behind an empty <think></think> block, so a
    # trained model writes one first: show what follows it.
    return response.sequences[0].text.split("</think>")[-1].strip()


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    args = parse_args(argv, prog)
    started = time.perf_counter()
    # first: an unknown tracker or a missing package fails before anything is loaded
    try:
        tracker = create_tracker(args.report_to, output_dir=args.output_dir, run_name="quickstart")
    except (ValueError, ImportError) as exc:
        raise SystemExit(f"error: --report-to: {exc}") from None
    tracker.log_config(vars(args))

    dataset = Dataset(dataset_meta=DatasetMeta(args.dataset_id))
    dataset.set_template("Qwen3_5Template", model_id=args.model_id, max_length=512)
    dataset.map(SelfCognitionProcessor(NAME, AUTHOR))
    dataset.encode()
    # shuffle: with many epochs over 100 rows, a fixed order would be learned as well
    dataloader = DataLoader(dataset=dataset, batch_size=args.batch_size, shuffle=True)
    model = TransformersModel(model_id=args.model_id)

    from_scratch = args.model_id.startswith("bundled://")  # recipes without weights: see above
    lora_rank = args.lora_rank if args.lora_rank or from_scratch else 8
    if lora_rank:
        lora_config = LoraConfig(r=lora_rank, lora_alpha=4 * lora_rank, target_modules="all-linear")
        model.add_adapter_to_model("default", lora_config)
    lr = args.lr or (1e-2 if from_scratch and not lora_rank else 1e-4)
    model.set_optimizer(optimizer_cls="AdamW", lr=lr)
    total_steps = args.epochs * len(dataloader)
    if args.max_steps is not None:
        total_steps = min(total_steps, args.max_steps)
    model.set_lr_scheduler(
        scheduler_cls="CosineWarmupScheduler",
        num_warmup_steps=total_steps // 20,
        num_training_steps=total_steps,
    )
    logger.info(get_device_placement())
    logger.info(model.get_train_configs())

    progress = tqdm(total=total_steps, desc="training", unit="step")
    for epoch in range(args.epochs):
        for batch in dataloader:
            output = model.forward_backward(inputs=batch)
            model.clip_grad_and_step()
            progress.update()
            progress.set_postfix(loss=f"{output.loss:.3f}")
            if progress.n == total_steps:
                break
        # the mean over the epoch: one batch's loss jumps with what the batch holds
        metric = model.calculate_metric(is_training=True)
        tracker.log(metric, step=progress.n)
        progress.write(f"epoch {epoch + 1}: loss {metric['loss']:.3f}, lr {metric['lr']:.2e}")
        if progress.n == total_steps:
            break
    progress.close()
    tracker.close()
    logger.info(f"loss curve drawn to {plot_metric(args.output_dir, 'loss')}")

    consumed = dataloader.get_state()["consumed_train_samples"]
    path = model.save(
        "last-checkpoint", output_dir=args.output_dir, consumed_train_samples=consumed
    )
    logger.info(f"checkpoint saved to {path} after {time.perf_counter() - started:.0f}s")

    # The sampler loads what was saved, and renders the prompt as in training.
    sampler = TorchSampler(args.model_id, device=model.device)
    sampler.load_checkpoint(path)
    sampler.set_template("Qwen3_5Template")
    print(f"\nQ: {QUESTION}\nA: {answer(sampler, QUESTION)}", flush=True)


if __name__ == "__main__":
    main()
