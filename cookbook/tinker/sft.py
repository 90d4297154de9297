"""Remote SFT with the unmodified Tinker SDK: the documents' example, against a local server.

    twinkle-server keys create --name me
    twinkle-server launch &
    TWINKLE_SERVER_TOKEN=tml-... python cookbook/tinker/sft.py

The data side is Twinkle's (Dataset, Template, DataLoader, run here on the laptop); each
encoded feature becomes a Tinker ``Datum`` through ``input_feature_to_datum``, and the
training side is plain Tinker: ``forward_backward(..., "cross_entropy")``, ``optim_step``,
``save_state``. ``init_tinker_client()`` copies ``$TWINKLE_SERVER_URL`` and
``$TWINKLE_SERVER_TOKEN`` into the SDK's own ``TINKER_BASE_URL`` / ``TINKER_API_KEY`` (and
lets the SDK take ``twinkle://`` checkpoint paths: ``cookbook/tinker/sample.py``).
Only the ids differ from the documents (bundled tiny model and self-cognition data).
"""

from __future__ import annotations

import argparse

from tinker import types

from twinkle import get_logger, init_tinker_client
from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.preprocessor import SelfCognitionProcessor
from twinkle.server.common import input_feature_to_datum

logger = get_logger()
BASE_MODEL = "bundled://tiny-qwen3"


def train(epochs: int, rows: int, learning_rate: float) -> None:
    dataset = Dataset(dataset_meta=DatasetMeta("bundled://self-cognition", data_slice=range(rows)))
    dataset.set_template("Template", model_id=BASE_MODEL, max_length=256)
    dataset.map(SelfCognitionProcessor("twinkle模型", "twinkle团队"), load_from_cache_file=False)
    dataset.encode(batched=True, load_from_cache_file=False)
    dataloader = DataLoader(dataset=dataset, batch_size=8)

    # Fill in the SDK's environment before it reads it (when ServiceClient is made).
    init_tinker_client()
    from tinker import ServiceClient

    with ServiceClient() as service_client:
        training_client = service_client.create_lora_training_client(
            base_model=BASE_MODEL, rank=16
        ).result()
        for epoch in range(epochs):
            for step, batch in enumerate(dataloader):
                input_datum = [input_feature_to_datum(feature) for feature in batch]
                # Submit both before waiting: the server runs them in order (seq_id).
                fwdbwd_future = training_client.forward_backward(input_datum, "cross_entropy")
                optim_future = training_client.optim_step(
                    types.AdamParams(learning_rate=learning_rate)
                )
                loss = fwdbwd_future.result().metrics["loss:sum"]
                optim_future.result()
                tokens = sum(sum(d.loss_fn_inputs["weights"].tolist()) for d in input_datum)
                logger.info(f"epoch {epoch} step {step}: loss per token {loss / tokens:.4f}")
            save_result = training_client.save_state(f"twinkle-lora-{epoch}").result()
            logger.info(f"Saved checkpoint to {save_result.path}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    args = parser.parse_args()
    train(args.epochs, args.rows, args.learning_rate)
