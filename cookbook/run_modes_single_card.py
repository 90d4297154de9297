"""The run-modes page's single-card sample, unchanged except for its ids.

``ms://swift/self-cognition`` became ``bundled://self-cognition`` and
``ms://Qwen/Qwen3.5-4B`` became ``bundled://tiny-qwen3``, so it runs anywhere, offline, on
a CPU. It calls no ``map`` and no ``set_optimizer``, as the page writes it: ``encode()``
converts the raw query/response rows with ``AutoPreprocessor`` (and warns that the
self-cognition ``{{NAME}}``/``{{AUTHOR}}`` placeholders stay unfilled), and the first
``clip_grad_and_step()`` gives the full model the default optimizer, AdamW at lr 1e-5
(1e-4 for a LoRA adapter), logging both.
"""

from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.model import TransformersModel


def train():
    dataset = Dataset(dataset_meta=DatasetMeta("bundled://self-cognition"))
    dataset.set_template("Qwen3_5Template", model_id="bundled://tiny-qwen3")
    dataset.encode()

    dataloader = DataLoader(dataset=dataset, batch_size=8)
    model = TransformersModel(model_id="bundled://tiny-qwen3")

    for batch in dataloader:
        model.forward_backward(inputs=batch)
        model.clip_grad_and_step()


if __name__ == "__main__":
    train()
