"""Remote SFT with the Twinkle client: the documents' example, run against a local server.

    twinkle-server keys create --name me -c cookbook/client/server/transformer/server_config.yaml
    twinkle-server launch -c cookbook/client/server/transformer/server_config.yaml &
    TWINKLE_SERVER_TOKEN=tml-... python cookbook/client/twinkle/sft.py

The loop is the one a local run writes (the same methods, by the same names); the model,
the dataset and its encoding live on the server, so this script needs no torch. Only the
ids differ from the documents (bundled tiny model and self-cognition data), and the key
comes from ``$TWINKLE_SERVER_TOKEN``. Set ``RESUME=1`` to continue from the newest
checkpoint of your most recent run.
"""

from __future__ import annotations

import argparse
import os

from twinkle import get_logger
from twinkle_client import init_twinkle_client
from twinkle_client.dataloader import DataLoader
from twinkle_client.dataset import Dataset, DatasetMeta
from twinkle_client.model import MultiLoraTransformersModel

logger = get_logger()
MODEL_ID = "bundled://tiny-qwen3"


def main(base_url: str, epochs: int, rows: int) -> None:
    client = init_twinkle_client(base_url=base_url, api_key=os.environ.get("TWINKLE_SERVER_TOKEN"))

    # Look at earlier runs and their checkpoints; resume from the newest if asked.
    resume_path = None
    for run in client.list_training_runs():
        logger.info(run.model_dump_json(indent=2))
        for checkpoint in client.list_checkpoints(run.training_run_id):
            logger.info(checkpoint.model_dump_json(indent=2))
            if os.environ.get("RESUME"):
                resume_path = checkpoint.twinkle_path

    dataset = Dataset(dataset_meta=DatasetMeta("bundled://self-cognition", data_slice=range(rows)))
    dataset.set_template("Template", model_id=MODEL_ID, max_length=512)
    dataset.map(
        "SelfCognitionProcessor",
        init_args={"model_name": "twinkle模型", "model_author": "ModelScope社区"},
    )
    dataset.encode(batched=True)
    dataloader = DataLoader(dataset=dataset, batch_size=4)

    model = MultiLoraTransformersModel(model_id=MODEL_ID)
    lora_config = {"target_modules": "all-linear", "r": 8, "lora_alpha": 32}
    model.add_adapter_to_model("default", lora_config, gradient_accumulation_steps=2)
    model.set_template("Template")
    model.set_processor("InputProcessor", padding_side="right")
    model.set_loss("CrossEntropyLoss")
    model.set_optimizer("AdamW", lr=1e-3)
    model.set_lr_scheduler("LinearLR")
    if resume_path:
        logger.info(f"Resuming training from {resume_path}")
        model.load(resume_path, load_optimizer=True)
    logger.info(model.get_train_configs())

    for epoch in range(epochs):
        logger.info(f"Starting epoch {epoch}")
        for step, batch in enumerate(dataloader):
            output = model.forward_backward(inputs=batch)
            if step % 2 == 0:
                logger.info(f"step {step // 2}, loss: {output.loss:.4f}")
            model.clip_grad_norm(1.0)
            model.step()
            model.zero_grad()
            model.lr_step()
        twinkle_path = model.save(name=f"twinkle-epoch-{epoch}", save_optimizer=True)
        logger.info(f"Saved checkpoint: {twinkle_path}")
    client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--base-url", default=os.environ.get("TWINKLE_SERVER_URL", "http://127.0.0.1:8000")
    )
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rows", type=int, default=100)
    args = parser.parse_args()
    main(args.base_url, args.epochs, args.rows)
